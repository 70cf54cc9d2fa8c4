"""Group commit (stock_locks.stock.groupcommit): reservations that Redis took while
another one was being written share one database transaction, and never sell
what is not there.

Every buyer is its own OS process. The test holds the SKU's row lock from a
connection of its own, so the first buyer's write waits on it while the others
queue; it lets go once the queue holds them all, and the next transaction then
carries every queued reservation.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from stock_locks.backends.redis import get_redis
from stock_locks.exceptions import OutOfStock
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.fault_processes import Child, kill_children, waiting_on_a_lock
from tests.support.stock_audit import audit
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

BUYERS = 5


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[None]:
    yield
    kill_children()


def buy(
    ref: str, cart: dict[str, int], wait: float, strategy: str = "lua"
) -> tuple[str, Any]:  # in a child
    """Reserve ``cart`` for ``ref`` (group commit waiting at most ``wait`` seconds):
    ("sold", created) or ("refused", units available)."""
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "GROUP_COMMIT_WAIT": wait}):
        try:
            return "sold", get_strategy(strategy).reserve(ref, cart).created
        except OutOfStock as refusal:
            return "refused", refusal.available


@contextmanager
def row_locked(*codes: str) -> Iterator[psycopg.Connection]:
    """Hold the rows of ``codes`` FOR UPDATE on a connection of the test's own."""
    params = connection.settings_dict
    with psycopg.connect(
        dbname=params["NAME"], user=params["USER"], host=params["HOST"],
        port=params["PORT"] or 5432, password=params["PASSWORD"] or None,
    ) as own:  # fmt: skip
        table, column = Item._meta.db_table, Item._meta.get_field("code").column
        own.execute(f'SELECT 1 FROM "{table}" WHERE "{column}" = ANY(%s) FOR UPDATE', [list(codes)])
        yield own
        own.rollback()


def queued() -> int:
    return get_redis().llen(StockKeys().confirm_queue)


def buyers_behind_a_locked_row(
    cart: dict[str, int],
    wait: float = 30,
    grouped: bool = True,
    strategy: str = "lua",
    buyer: Callable[..., tuple[str, Any]] = buy,
) -> list[Child]:
    """Start BUYERS buyers of ``cart`` (sessions named gc-<i>) while its rows are
    locked; let go once one of them is writing alone and the others are queued
    behind it (not ``grouped``: once all of them wait on the rows)."""
    with row_locked(*cart):
        children = [
            Child(buyer, f"gc-{i}", cart, wait, strategy, env={"PGAPPNAME": f"gc-{i}"})
            for i in range(BUYERS)
        ]
        if grouped:
            wait_until(lambda: queued() == BUYERS - 1, what="every buyer but one queued")
        else:
            wait_until(
                lambda: all(waiting_on_a_lock(f"gc-{i}") for i in range(BUYERS)),
                what="every buyer waiting on the row",
            )
    return children


def transactions() -> list[int]:
    """How many reservations each transaction wrote (PostgreSQL's now() is the
    transaction's start, so rows of one transaction share created_at), ascending."""
    rows = Reservation.objects.filter(order_ref__startswith="gc-")
    return sorted(Counter(rows.values_list("created_at", flat=True)).values())


@pytest.mark.parametrize("strategy", ["lua", "watch"])
def test_reservations_queued_behind_a_write_share_one_transaction(strategy):
    """lua joins the queue inside its reserve script, watch with a script of its own."""
    Item.objects.create(code="HOT", title="hot", on_hand=10)
    children = buyers_behind_a_locked_row({"HOT": 1}, strategy=strategy)
    assert [child.result() for child in children] == [("sold", True)] * BUYERS
    assert transactions() == [1, BUYERS - 1]  # the first alone, then all the others at once
    book = audit("HOT", 10)
    assert book.conserved and book.open == BUYERS and book.stock == 10 - BUYERS, book.summary()
    assert get_strategy(strategy).available("HOT") == 10 - BUYERS
    assert queued() == 0
    assert not get_redis().exists(StockKeys().confirm_leader)  # no one leads once all is written


def test_carts_of_several_skus_share_one_transaction_too():
    Item.objects.create(code="CUP", title="cup", on_hand=10)
    Item.objects.create(code="TEA", title="tea", on_hand=10)
    children = buyers_behind_a_locked_row({"CUP": 1, "TEA": 2})
    assert [child.result() for child in children] == [("sold", True)] * BUYERS
    assert transactions() == [1, BUYERS - 1]
    for sku, qty in (("CUP", 1), ("TEA", 2)):
        book = audit(sku, 10)
        assert book.conserved and book.stock == 10 - BUYERS * qty, book.summary()


def test_a_batch_the_database_refuses_is_written_one_by_one():
    """Redis believes in 10 units, the database has 2 (changed behind its back): the
    batch of four asks more than is left, so each buyer writes its own, and the
    database sells what it has: nothing oversold, the refused get their units
    back in Redis."""
    Item.objects.create(code="HOT", title="hot", on_hand=10)
    lua = get_strategy("lua")
    assert lua.available("HOT") == 10  # the counter is loaded from the database
    Item.objects.filter(code="HOT").update(on_hand=2)  # no signal: Redis still says 10
    children = buyers_behind_a_locked_row({"HOT": 1})
    outcomes = Counter(child.result()[0] for child in children)
    assert outcomes == {"sold": 2, "refused": BUYERS - 2}
    assert Item.objects.get(code="HOT").on_hand == 0
    assert Reservation.objects.filter(order_ref__startswith="gc-").count() == 2
    assert lua.available("HOT") == 10 - 2  # what the refused took in Redis went back
    assert queued() == 0


def buy_for_an_hour(
    ref: str, cart: dict[str, int], wait: float, strategy: str
) -> tuple[str, Any]:  # in a child
    """Reserve ``cart`` held unpaid for an hour: ("sold", the expires_at it is told)."""
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "GROUP_COMMIT_WAIT": wait}):
        return "sold", get_strategy(strategy).reserve(ref, cart, ttl=3600).expires_at


def test_a_batched_buyer_is_told_the_expiry_its_leader_wrote():
    Item.objects.create(code="HOT", title="hot", on_hand=10)
    children = buyers_behind_a_locked_row({"HOT": 1}, buyer=buy_for_an_hour)
    told = {f"gc-{i}": child.result()[1] for i, child in enumerate(children)}
    assert transactions() == [1, BUYERS - 1]
    written = Reservation.objects.filter(order_ref__startswith="gc-")
    assert told == dict(written.values_list("order_ref", "expires_at"))
    assert None not in told.values()


def buy_without_group_commit(
    ref: str, cart: dict[str, int], wait: float, strategy: str
) -> tuple[str, Any]:
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "GROUP_COMMIT": False}):
        return buy(ref, cart, wait, strategy)


def test_with_group_commit_off_every_reservation_is_its_own_transaction():
    Item.objects.create(code="HOT", title="hot", on_hand=10)
    children = buyers_behind_a_locked_row({"HOT": 1}, grouped=False, buyer=buy_without_group_commit)
    assert [child.result() for child in children] == [("sold", True)] * BUYERS
    assert transactions() == [1] * BUYERS
    assert audit("HOT", 10).conserved


def buy_capped(
    ref: str, cart: dict[str, int], wait: float, strategy: str = "lua"
) -> tuple[str, Any]:  # in a child
    """``buy`` for customer ``ref`` under a cap of one unit of HOT per customer."""
    caps = {"one-each": {"skus": ["HOT"], "max": 1}}
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "GROUP_COMMIT_WAIT": wait,
                                        "CAPS": caps}):  # fmt: skip
        return "sold", get_strategy(strategy).reserve(ref, cart, customer=ref).created


@pytest.mark.parametrize("strategy", ["lua", "watch"])
def test_capped_reservations_share_one_transaction_with_their_caps_counted(strategy):
    Item.objects.create(code="HOT", title="hot", on_hand=10)
    children = buyers_behind_a_locked_row({"HOT": 1}, strategy=strategy, buyer=buy_capped)
    assert [child.result() for child in children] == [("sold", True)] * BUYERS
    assert transactions() == [1, BUYERS - 1]
    rows = Reservation.objects.filter(order_ref__startswith="gc-")
    assert sorted(rows.values_list("customer", flat=True)) == [f"gc-{i}" for i in range(BUYERS)]


def test_a_batch_counts_each_customers_orders_together_and_refuses_past_the_cap():
    from stock_locks.exceptions import CapExceeded
    from stock_locks.stock.table import Order, StockTable

    Item.objects.create(code="HOT", title="hot", on_hand=10)
    caps = {"two-each": {"skus": ["HOT"], "max": 2}}
    table = StockTable()
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "CAPS": caps}):
        within = [Order("b-1", {"HOT": 1}, "lua", None, "kim"),
                  Order("b-2", {"HOT": 1}, "lua", None, "kim")]  # fmt: skip
        assert set(table.take_and_record_many(within)) == {"b-1", "b-2"}
        past = [Order("b-3", {"HOT": 1}, "lua", None, "lee"),
                Order("b-4", {"HOT": 1}, "lua", None, "kim")]  # fmt: skip
        with pytest.raises(CapExceeded) as refused:
            table.take_and_record_many(past)
    assert (refused.value.cap, refused.value.bought) == ("two-each", 2)
    assert not Reservation.objects.filter(order_ref__in=["b-3", "b-4"]).exists()
    assert Item.objects.get(code="HOT").on_hand == 8  # the refused batch took nothing


@pytest.mark.parametrize("in_transaction", [False, True])
def test_a_capped_batch_refused_as_a_whole_writes_nothing(in_transaction):
    # One statement (the caps checked inside it), in autocommit or under a savepoint of
    # the caller's transaction: the same answers, nothing moved.
    from django.db import IntegrityError, transaction

    from stock_locks.exceptions import CapExceeded
    from stock_locks.stock.table import Order, StockTable

    Item.objects.create(code="HOT", title="hot", on_hand=5)
    caps = {"two-each": {"skus": ["HOT"], "max": 2}}
    table = StockTable()

    def write(*orders: Order) -> Any:
        scope = transaction.atomic() if in_transaction else contextlib.nullcontext()
        with scope:
            return table.take_and_record_many(list(orders))

    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "CAPS": caps}):
        assert set(write(Order("w-1", {"HOT": 1}, "lua", None, "kim"))) == {"w-1"}
        with pytest.raises(OutOfStock):  # 5 asked, 4 left
            write(Order("w-2", {"HOT": 2}, "lua", None, "lee"),
                  Order("w-3", {"HOT": 2}, "lua", None, "max"),
                  Order("w-x", {"HOT": 1}, "lua", None, "ned"))  # fmt: skip
        with pytest.raises(CapExceeded) as refused:  # kim: 1 held, 2 more asked
            write(Order("w-4", {"HOT": 1}, "lua", None, "lee"),
                  Order("w-5", {"HOT": 2}, "lua", None, "kim"))  # fmt: skip
        assert (refused.value.cap, refused.value.bought) == ("two-each", 1)
        with pytest.raises(IntegrityError):  # a ref with a row fails the batch whole
            write(Order("w-1", {"HOT": 1}, "lua", None, "kim"),
                  Order("w-6", {"HOT": 1}, "lua", None, "ned"))  # fmt: skip
    assert list(Reservation.objects.values_list("order_ref", flat=True)) == ["w-1"]
    assert Item.objects.get(code="HOT").on_hand == 4
