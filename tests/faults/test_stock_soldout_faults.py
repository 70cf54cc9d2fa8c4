"""A lost announcement does not keep a unit unsellable (stock_locks.stock.soldout).

This process remembers a SKU sold out; its listener hears units coming back
through a FaultProxy. The network stalls, another process gives a unit back
(the announcement is published and held in the stalled network), the
connections are cut (the announcement is gone) and the network comes back.
With a remembered refusal good for ten minutes, the unit must be sellable
again long before: the listener finds its connection dead, forgets what it
remembered and subscribes afresh. Nothing is oversold, nothing is stranded.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from stock_locks.exceptions import OutOfStock
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.fault_processes import Child
from tests.support.stock_audit import audit, drift
from tests.support.waiting import wait_until
from tests.test_stock_soldout import listening, sell_out

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]


def _release(ref: str) -> bool:
    return get_strategy("lua").release(ref)


def test_an_announcement_lost_with_the_listeners_connection_is_not_a_stranded_unit(
    redis_server, redis_through_proxy
):
    proxy = redis_through_proxy(0)
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "SOLD_OUT_TTL": 600}):
        cache = listening()
        sell_out(cache)

        proxy.stall()
        # Straight to Redis, not through the proxy: the release and its announcement happen.
        assert Child(_release, "a", env={"REDIS_URL": redis_server.url}).result() is True
        proxy.cut()  # the held announcement is dropped with the connection
        proxy.resume()

        lua = get_strategy("lua")

        def sold_again() -> bool:
            try:
                return lua.reserve("c", {"HOT": 1}).created
            except OutOfStock:
                return False

        wait_until(sold_again, what="the unit given back to be sellable here again")
        with pytest.raises(OutOfStock):
            lua.reserve("d", {"HOT": 1})

    book = audit("HOT", 1)
    assert book.conserved and book.open == 1 and book.released == 1, book.summary()
    assert drift() == {}
    assert Item.objects.get(code="HOT").on_hand == 0
