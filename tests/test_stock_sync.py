"""Stock changed outside the strategies is sellable at once, and never races a sale."""

from __future__ import annotations

import pytest
from django.db.models import F

from stock_locks.exceptions import InvalidQuantity, OutOfStock
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy, restock, stock_changed
from stock_locks.stock.reconcile import measure
from tests.inventory.models import Item
from tests.support.processes import run_in_processes

pytestmark = pytest.mark.django_db(transaction=True)


def no_drift() -> bool:
    return all(row.settled and row.drift == 0 for row in measure())


@pytest.mark.parametrize("strategy", ["lua", "watch"])
def test_an_admin_style_save_is_sellable_at_once(strategy):
    item = Item.objects.create(code="TEA", title="Tea", on_hand=2)
    chosen = get_strategy(strategy)
    chosen.reserve("a", {"TEA": 2})
    assert chosen.available("TEA") == 0
    item.refresh_from_db()
    item.on_hand = 100  # the admin form writes the field and saves
    item.save()
    assert chosen.available("TEA") == 100
    chosen.reserve("b", {"TEA": 100})
    assert no_drift()


def test_a_queryset_update_is_sellable_after_the_documented_call():
    Item.objects.create(code="TEA", title="Tea", on_hand=2)
    lua = get_strategy("lua")
    lua.reserve("a", {"TEA": 1})
    Item.objects.filter(code="TEA").update(on_hand=F("on_hand") + 50)  # no signal
    assert lua.available("TEA") == 1
    assert stock_changed("TEA") is True
    assert lua.available("TEA") == 51
    assert no_drift()


def test_restock_is_relative_on_both_sides_and_guarded():
    Item.objects.create(code="TEA", title="Tea", on_hand=3)
    lua = get_strategy("lua")
    lua.reserve("a", {"TEA": 1})
    assert restock("TEA", 10) == 12
    assert lua.available("TEA") == 12
    with pytest.raises(OutOfStock):
        restock("TEA", -13)
    assert restock("TEA", -2) == 10
    assert lua.available("TEA") == 10
    for bad in (0, 1.5, True, "3"):
        with pytest.raises(InvalidQuantity):
            restock("TEA", bad)
    with pytest.raises(InvalidQuantity):
        restock("NOPE", 1)
    assert Item.objects.get(code="TEA").on_hand == 10
    assert no_drift()


def _buy(index: int, attempts: int) -> int:
    lua, sold = get_strategy("lua"), 0
    for n in range(attempts):
        try:
            lua.reserve(f"buyer-{index}-{n}", {"HOT": 1})
            sold += 1
        except OutOfStock:
            pass
    return sold


def _restock(index: int, times: int) -> int:
    for _ in range(times):
        restock("HOT", 5)
    return times * 5


def _buy_or_restock(index: int) -> int:
    return _restock(index, 6) if index == 0 else _buy(index, 40)


def test_restocks_during_a_sale_are_sold_exactly_once():
    Item.objects.create(code="HOT", title="Hot", on_hand=20)
    results = run_in_processes(_buy_or_restock, 4)
    added, sold = results[0], sum(results[1:])
    assert added == 30
    assert Item.objects.get(code="HOT").on_hand == 20 + added - sold >= 0
    assert sum(r.units for r in Reservation.objects.all()) == sold
    assert no_drift(), measure()
