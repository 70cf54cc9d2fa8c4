"""``areserve``: the stock strategies from async views. The ``lua`` strategy's Redis half
runs on the event loop, so a refusal never reaches the database (nor its thread)."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from stock_locks.exceptions import OutOfStock
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.lua import LuaStrategy
from tests.inventory.models import Item
from tests.test_stock import STRATEGIES, assert_no_drift, db_stock, make_items

STOCK, BUYERS = 20, 60


class CountingLua(LuaStrategy):
    """The lua strategy, counting how many reserves reached its database half."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.database_halves = 0

    def reserve_in_database(self, *args, **kwargs):
        self.database_halves += 1
        return super().reserve_in_database(*args, **kwargs)


async def _sale(strategy, prefix: str) -> tuple[int, int]:
    async def buy(n: int) -> bool:
        try:
            await strategy.areserve(f"{prefix}-{n}", {"HOT": 1}, ttl=600)
            return True
        except OutOfStock as exc:
            assert exc.sku == "HOT" and exc.available == 0
            return False

    outcomes = await asyncio.gather(*(buy(n) for n in range(BUYERS)))
    await sync_to_async(connections.close_all)()  # (as Django does at a request's end)
    return outcomes.count(True), outcomes.count(False)


@pytest.mark.django_db(transaction=True)
def test_lua_areserve_sells_the_stock_once_and_refuses_on_the_event_loop(redis_client):
    make_items(HOT=STOCK)
    strategy = CountingLua("lua")
    sold, refused = asyncio.run(_sale(strategy, "first"))
    assert (sold, refused) == (STOCK, BUYERS - STOCK)
    assert db_stock("HOT") == 0 and Reservation.objects.count() == STOCK
    halves = strategy.database_halves
    assert halves == STOCK  # the refusals never went to the database
    again = asyncio.run(_sale(strategy, "later"))  # sold out: every answer from Redis
    assert again == (0, BUYERS) and strategy.database_halves == halves
    assert_no_drift()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", [s for s in STRATEGIES if s != "lua"])
def test_every_strategy_reserves_from_async_code(name, redis_client):
    make_items(HOT=STOCK)
    sold, refused = asyncio.run(_sale(get_strategy(name), name))
    assert (sold, refused) == (STOCK, BUYERS - STOCK)
    assert Item.objects.get(code="HOT").on_hand == 0
    assert_no_drift()
