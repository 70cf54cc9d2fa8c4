"""A lock holder paused past its lease cannot sell what a newer holder sold (issue 8, section 1).

Holder A (a process) has its SKU lock and has done everything before its
stock write (lock grant, any fenced claim, its read); there it stops itself
(SIGSTOP). Its lease then ends by writing state, no sleeping: the lock key is
PEXPIREd, or Redis is killed and restarted empty. Holder B takes the lock.
Whichever of A and B writes first, one unit of one is sold once: B first, A's
fenced write is refused (``StaleFencingToken``); A first, its sale stands (the
write is relative, nothing is overwritten) and B finds the unit gone
(``OutOfStock``).

The same for the public read-modify-write API: ``claim`` then
``fenced_update`` under a :class:`~stock_locks.Lock`.
"""

from __future__ import annotations

import pytest

from stock_locks import Lock
from stock_locks.exceptions import StaleFencingToken, StockLocksError
from stock_locks.fencing import claim, fenced_update
from stock_locks.keys import lock_scan_pattern
from stock_locks.models import Reservation
from tests.inventory.models import Item
from tests.support.fault_processes import (
    Child,
    marker,
    stop_here,
    wait_paused_blocked_or_done,
    wait_stopped,
)
from tests.support.fault_strategies import PausingLockStrategy
from tests.support.stock_audit import audit
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]


SKU = "LAST"


def end_leases(redis, how: str) -> None:
    """Every held lock's lease ends now: PEXPIRE its key, or Redis restarts empty."""
    if how == "restart":
        redis.kill()
        redis.restart()
        return
    client = redis.client()
    try:
        held = list(client.scan_iter(lock_scan_pattern()))
        assert held, "no lock held: the holder is not where the test thinks it is"
        for key in held:
            client.pexpire(key, 1)
        wait_until(lambda: not any(client.exists(key) for key in held), what="leases to end")
    finally:
        client.close()


def _buy_last(ref: str, pause) -> str:
    """A ``lock`` buyer of the last unit; stops at its stock write when ``pause`` is given."""
    try:
        PausingLockStrategy("lock", pause).reserve(ref, {SKU: 1})
    except StockLocksError as exc:  # refused: StaleFencingToken, OutOfStock, LockNotOwned...
        return type(exc).__name__
    return "reserved"


def sold_to() -> list[str]:
    held = (Reservation.Status.RESERVED, Reservation.Status.COMMITTED)
    return sorted(Reservation.objects.filter(status__in=held).values_list("order_ref", flat=True))


def paused_holder(name: str) -> tuple[Child, object]:
    pause = marker()
    child = Child(_buy_last, name, pause, env={"PGAPPNAME": f"faults-{name}"})
    wait_stopped(child, pause, f"{name} to stop at its write")
    return child, pause


def finish(child: Child, pause) -> str:
    """Let ``child`` run to its end, resuming it if it stops (or has stopped) at its marker."""
    wait_until(lambda: child.done() or (pause.is_set() and child.stopped()), what="child to end")
    child.resume()
    return child.result()


LEASE_ENDS = ["pexpire", "restart"]


@pytest.mark.parametrize("lease_ends", LEASE_ENDS)
def test_paused_lock_holder_resuming_after_a_newer_holder_sold_the_last_unit_is_refused(
    redis, lease_ends
):
    Item.objects.create(code=SKU, title="Last", on_hand=1)
    a, _ = paused_holder("a")
    end_leases(redis, lease_ends)
    b = Child(_buy_last, "b", None, env={"PGAPPNAME": "faults-b"})
    state = wait_paused_blocked_or_done(b, marker(), "faults-b", "B to buy or to wait on A")
    a.resume()
    outcomes = {"a": a.result(), "b": b.result()}
    assert sold_to() in (["a"], ["b"]), outcomes
    book = audit(SKU, initial=1)
    assert (book.oversold, book.held, book.stock) == (0, 1, 0), book.summary()
    if state == "done":  # B bought while A was stopped: A's late write must be refused
        assert outcomes["b"] == "reserved" and outcomes["a"] != "reserved", outcomes
    # else B waited on a row lock A took before stopping: the database serialised them.


@pytest.mark.parametrize("lease_ends", LEASE_ENDS)
def test_paused_lock_holder_writing_before_the_newer_holder_sells_once(redis, lease_ends):
    """The interleaving of issue 8: A read 1 and stopped; B takes the lock and
    reads 1; A resumes and writes first; then B writes. 1 sold of 1: A's sale stands,
    B is refused (before the guarded, fenced statement: 2 sold of 1)."""
    Item.objects.create(code=SKU, title="Last", on_hand=1)
    a, _ = paused_holder("a")
    end_leases(redis, lease_ends)
    b_pause = marker()
    b = Child(_buy_last, "b", b_pause, env={"PGAPPNAME": "faults-b"})
    state = wait_paused_blocked_or_done(b, b_pause, "faults-b", "B at its write, waiting or done")
    a.resume()
    outcome_a = a.result()
    outcomes = {"a": outcome_a, "b": finish(b, b_pause), "b before A resumed": state}
    assert len(sold_to()) == 1, outcomes
    book = audit(SKU, initial=1)
    assert (book.oversold, book.held, book.stock) == (0, 1, 0), book.summary()
    if state == "paused":  # B stopped at its write: A, the older holder, wrote first
        assert (outcomes["a"], outcomes["b"]) == ("reserved", "OutOfStock"), outcomes


# -- the public API: claim, read, fenced_update ------------------------------------------


def _claim_read_write(pk: int, pause, stop_before: str) -> str:
    """Under a Lock: claim the row, read it, write level - 1; stop before ``stop_before``."""
    lock = Lock(f"item:{pk}", ttl=30)
    assert lock.acquire()
    rows = Item.objects.filter(pk=pk)
    try:
        if stop_before == "claim":
            stop_here(pause)
        claim(rows, lock.fence)
        level = rows.get().on_hand
        if stop_before == "write":
            stop_here(pause)
        fenced_update(rows, lock.fence, on_hand=level - 1)
    except StaleFencingToken:
        return "refused"
    return "written"


@pytest.mark.parametrize(
    ("stop_before", "newer_writes_first"),
    [("write", True), ("write", False), ("claim", True)],
    ids=["read-then-newer-wrote", "read-then-newer-claimed", "newer-wrote-before-claim"],
)
def test_fenced_claim_refuses_the_older_holder_whatever_the_order(
    redis, stop_before, newer_writes_first
):
    item = Item.objects.create(code=SKU, title="Last", on_hand=5)
    rows = Item.objects.filter(pk=item.pk)
    pause = marker()
    older = Child(_claim_read_write, item.pk, pause, stop_before)
    wait_stopped(older, pause, "the older holder to stop")
    end_leases(redis, "pexpire")
    newer = Lock(f"item:{item.pk}", ttl=30, timeout=5)
    assert newer.acquire()
    claim(rows, newer.fence)
    level = rows.get().on_hand
    if newer_writes_first:
        fenced_update(rows, newer.fence, on_hand=level - 1)
    older.resume()
    assert older.result() == "refused"
    if not newer_writes_first:
        fenced_update(rows, newer.fence, on_hand=level - 1)
    newer.release()
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (4, newer.fence)
