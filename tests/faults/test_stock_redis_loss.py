"""Redis loses its data mid-sale; nothing is oversold or stranded (issue 8, section 2).

Buyers in processes sell one SKU through every strategy, with reservations
that expire unpaid after a short ttl; a third pay, a third cancel, a third
walk away. Mid-sale Redis is killed and restarted empty, or restored from an
older snapshot. Nobody runs reconcile: once the sale is over, the sweeper
(what Celery beat runs) is all the system gets. Then every reservation is
paid or released, the units add up, and Redis equals the database. (The same
sale through the demo shop's HTTP API: tests/demo/faults/test_shop_redis_loss.py.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from redis.exceptions import RedisError

from stock_locks.exceptions import (
    ContentionError,
    LockTimeout,
    OutOfStock,
    RedisUnavailable,
    StaleFencingToken,
    StockLocksError,
)
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.fault_processes import Child
from tests.support.processes import event
from tests.support.stock_audit import audit, drift, open_reservations, sweep_until_quiet
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]


STRATEGIES = ["lua", "watch", "lock", "db_conditional", "db_row_lock"]
SKU = "RUSH"
INITIAL = 60
TTL = 1  # seconds an unpaid reservation holds its units
BUYERS = 3
MAX_ATTEMPTS = 400  # per buyer; the test stops them long before
STEP = 8  # reservations the sale makes between two stages of a scenario


# -- the buyers ------------------------------------------------------------------------


def _count_error(tally: Counter, exc: BaseException, outage) -> None:
    if isinstance(exc, RedisUnavailable):
        outage.set()
    tally[type(exc).__name__] += 1


def _orm_buyer(index: int, stop, outage) -> dict[str, int]:
    strategies = {name: get_strategy(name) for name in STRATEGIES}
    tally: Counter[str] = Counter()
    for n in range(MAX_ATTEMPTS):
        if stop.is_set():
            break
        name = STRATEGIES[(index + n) % len(STRATEGIES)]
        ref = f"rush-{index}-{n}"
        try:
            strategies[name].reserve(ref, {SKU: 1}, ttl=TTL)
        except OutOfStock:
            tally["refused"] += 1
            continue
        except (RedisUnavailable, LockTimeout, ContentionError) as exc:
            _count_error(tally, exc, outage)  # Redis down or in its restart: nothing reserved
            continue
        except (StaleFencingToken, StockLocksError, RedisError) as exc:
            tally[f"unexpected {type(exc).__name__}: {exc}"] += 1
            continue
        tally["reserved"] += 1
        try:
            if n % 3 == 0:
                strategies[name].commit(ref)
            elif n % 3 == 1:
                strategies[name].release(ref)
            # else: the buyer walks away; the reservation expires after TTL
        except RedisUnavailable as exc:  # the order stays unpaid and expires
            _count_error(tally, exc, outage)
        except (StockLocksError, RedisError) as exc:
            tally[f"unexpected {type(exc).__name__}: {exc}"] += 1
    return dict(tally)


# -- the sale and its fault ------------------------------------------------------------


def reservations() -> int:
    return Reservation.objects.count()


def rush_item() -> None:
    Item.objects.create(code=SKU, title="Rush", on_hand=INITIAL)


def sale_with(
    buyer: Callable,
    fault: Callable[[Callable[[int], None]], None],
    make_stock: Callable[[], None] = rush_item,
) -> list[dict]:
    """Run the buyers on ``INITIAL`` units of ``SKU`` (``make_stock`` creates the row);
    ``fault(advance)`` stages the fault, calling ``advance(n)`` to let the sale make
    ``n`` more reservations (``advance(until=p)``: until ``p()`` is true). Returns the
    buyers' tallies."""
    make_stock()
    stop, outage = event(), event()
    buyers = [Child(buyer, i, stop, outage) for i in range(BUYERS)]

    def advance(n: int = 0, until: Callable[[], bool] | None = None) -> None:
        target = reservations() + n
        wait_until(
            lambda: (
                (reservations() >= target and (until is None or until()))
                or all(b.done() for b in buyers)
            ),
            what=f"the sale to make {n} more reservations" + (" and get past it" if until else ""),
        )

    try:
        advance(STEP)
        fault(advance, outage)
    finally:
        stop.set()
    return [b.result() for b in buyers]


def assert_quiet_and_whole(tallies: list[dict]) -> None:
    unexpected = {k: v for t in tallies for k, v in t.items() if k.startswith("unexpected")}
    assert unexpected == {}, tallies
    sweep_until_quiet()  # no operator: the sweeper alone, as beat runs it
    assert open_reservations() == []
    book = audit(SKU, INITIAL)
    assert (book.oversold, book.lost) == (0, 0), book.summary()
    assert book.stock >= 0 and book.committed > 0, book.summary()
    assert drift() == {}, book.summary()


def kill_and_restart_empty(redis) -> Callable:
    def fault(advance, outage) -> None:
        redis.kill()
        wait_until(outage.is_set, what="a buyer to meet the outage")
        redis.restart()  # empty: no counters, no records, no expiry items, no fences
        advance(STEP)

    return fault


def test_redis_restarted_empty_mid_sale_strands_nothing_and_oversells_nothing(redis):
    tallies = sale_with(_orm_buyer, kill_and_restart_empty(redis))
    assert sum(t.get("RedisUnavailable", 0) for t in tallies), "no buyer met the outage"
    assert_quiet_and_whole(tallies)


# -- restored from an older snapshot ---------------------------------------------------


def restore_older_snapshot(redis, marks: dict) -> Callable:
    def fault(advance, outage) -> None:
        snapshot = redis.snapshot()
        advance(STEP)  # sales, releases and lock grants the snapshot does not have
        redis.restart(snapshot=snapshot)  # counters, records and fences rewound
        mark = marks["last_before_restore"] = Reservation.objects.order_by("-id")[0].id
        # A lock the snapshot holds blocks the lock strategy until its lease runs out:
        # sell until that strategy has sold after the restore, however many others did.
        advance(until=lambda: Reservation.objects.filter(id__gt=mark, strategy="lock").exists())

    return fault


def test_redis_restored_from_an_older_snapshot_mid_sale_keeps_selling_and_strands_nothing(
    redis,
):
    marks: dict = {}
    tallies = sale_with(_orm_buyer, restore_older_snapshot(redis, marks))
    stale = [k for t in tallies for k in t if "StaleFencingToken" in k]
    assert stale == [], "lock grants after the restore carried rewound fences"
    assert_quiet_and_whole(tallies)
    after = Reservation.objects.filter(id__gt=marks["last_before_restore"])
    assert after.filter(strategy="lock").exists(), "the lock strategy sold nothing after it"
