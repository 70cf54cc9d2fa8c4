"""Every strategy on one SKU at once, with no fault at all (issue 8, section 1).

Buyers of one SKU go through lock, lua, watch, db_conditional and db_row_lock
from several OS processes; a third of them cancel (a release racing other
reserves) and an admin restocks with ``F("stock") + n`` mid-sale. Every
strategy's write must be relative and guarded, so the units add up: what
existed is in stock, sold or held, nothing more (oversold) and nothing less
(lost). Then the sweeper, with no operator, leaves Redis equal to the database.
(The same sale through the demo shop's HTTP API: tests/demo/faults/test_shop_mixed.py.)
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F

from stock_locks.exceptions import ContentionError, LockTimeout, OutOfStock
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.fault_processes import (
    Child,
    marker,
    wait_paused_blocked_or_done,
    wait_stopped,
)
from tests.support.fault_strategies import PausingLockStrategy
from tests.support.processes import run_in_processes
from tests.support.stock_audit import audit, drift, sweep_until_quiet


def sweep() -> None:
    from stock_locks.stock.sweeper import sweep as run_sweeper

    run_sweeper(grace=0, orphan_grace=0)


pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]


STRATEGIES = ["lock", "lua", "watch", "db_conditional", "db_row_lock"]
SKU = "MIX"
INITIAL = 30
RESTOCK, RESTOCKS = 5, 2  # units per admin restock, restocks in a sale
BUYERS, ATTEMPTS = 4, 30  # processes, attempts each


def _restock(units: int) -> None:
    """What an admin action or a script does: a relative update outside any strategy."""
    Item.objects.filter(code=SKU).update(on_hand=F("on_hand") + units)


def _mixed_buyer(index: int, attempts: int) -> dict[str, int]:
    strategies = {name: get_strategy(name) for name in STRATEGIES}
    tally: Counter[str] = Counter()
    for n in range(attempts):
        name = STRATEGIES[(index + n) % len(STRATEGIES)]
        ref = f"mix-{index}-{n}"
        try:
            strategies[name].reserve(ref, {SKU: 1})
        except OutOfStock:
            tally["refused"] += 1
        except (ContentionError, LockTimeout):
            tally["busy"] += 1
        else:
            if n % 3 == 0:  # the buyer cancels: a release racing the others' reserves
                strategies[name].release(ref)
                tally["released"] += 1
            else:
                strategies[name].commit(ref)
                tally["sold"] += 1
        if index == 0 and n % 10 == 5 and tally["restocked"] < RESTOCK * RESTOCKS:
            _restock(RESTOCK)
            tally["restocked"] += RESTOCK
    return dict(tally)


def _assert_sale_adds_up(tallies: list[dict[str, int]]) -> None:
    restocked = sum(t.get("restocked", 0) for t in tallies)
    assert restocked == RESTOCK * RESTOCKS
    book = audit(SKU, INITIAL, restocked)
    assert book.oversold == 0, book.summary()
    assert book.lost == 0, book.summary()
    assert book.stock >= 0 and book.open == 0, book.summary()
    assert book.committed == sum(t.get("sold", 0) for t in tallies), book.summary()
    assert sum(t.get("refused", 0) for t in tallies), "the stock never ran out: no race at the end"
    sellers = set(Reservation.objects.values_list("strategy", flat=True))
    assert sellers == set(STRATEGIES), f"not every strategy sold: {sellers}"
    sweep_until_quiet()
    assert drift() == {}


def test_every_strategy_on_one_sku_with_releases_and_a_restock_sells_what_exists():
    Item.objects.create(code=SKU, title="Mixed", on_hand=INITIAL)
    _assert_sale_adds_up(run_in_processes(_mixed_buyer, BUYERS, ATTEMPTS))


# -- deterministic: a lock holder between its read and its write -------------------------


def _paused_lock_buyer(ref: str, pause) -> str:
    PausingLockStrategy("lock", pause).reserve(ref, {SKU: 1})
    return "reserved"


def _moves_of_others(release_ref: str) -> list[str]:
    done = []
    for name in ("db_conditional", "lua", "watch", "db_row_lock"):
        get_strategy(name).reserve(f"other-{name}", {SKU: 1})
        done.append(name)
    get_strategy("db_conditional").release(release_ref)
    _restock(2)
    return done


def test_lock_strategy_write_keeps_what_other_strategies_a_release_and_a_restock_did():
    """The ``lock`` holder has read the level and is about to write (paused there);
    meanwhile four other strategies sell, a release puts a unit back and an admin
    restocks. Whatever it writes must keep all of that: a relative write does;
    an absolute ``level - qty`` puts the four sold units back on sale and wipes
    the put-back and the restock (net: one unit oversold)."""
    Item.objects.create(code=SKU, title="Mixed", on_hand=10)
    get_strategy("db_conditional").reserve("earlier", {SKU: 1})
    pause = marker()
    holder = Child(_paused_lock_buyer, "held", pause, env={"PGAPPNAME": "faults-holder"})
    wait_stopped(holder, pause, "the lock holder to stop at its write")
    others = Child(_moves_of_others, "earlier", env={"PGAPPNAME": "faults-others"})
    state = wait_paused_blocked_or_done(others, marker(), "faults-others", "the other moves")
    holder.resume()
    assert holder.result() == "reserved"
    assert others.result() == ["db_conditional", "lua", "watch", "db_row_lock"], state
    book = audit(SKU, initial=10, restocked=2)
    assert (book.oversold, book.lost) == (0, 0), book.summary()
    assert (book.stock, book.open) == (7, 5), book.summary()
    sweep()  # the five stay open; what is asked of the sweeper here is drift 0
    assert drift() == {}
