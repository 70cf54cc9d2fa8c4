"""The lock contract: what ``Lock`` promises on every backend, through the public API.

Each test is a plain function of the ``backend`` alias (tests/contract/conftest.py)
and runs once per backend kind; one that needs a capability says so with
``@requires`` and is skipped where the backend does not declare it. Leases end
by themselves (short ttls) and waits end on conditions (``wait_until``, a
thread seen asleep in the backend's wait); a lease taken right after another
serves as the backend's own clock where "how early" matters.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from pathlib import Path

import pytest

from stock_locks.backends.base import (
    FENCED,
    FORCE_RELEASE,
    HOLDER_METADATA,
    LEASED,
    WAKE_UP,
    ReleaseOutcome,
)
from stock_locks.exceptions import LockError, LockNotOwned, LockTimeout, StaleFencingToken
from stock_locks.fencing import fenced_update
from stock_locks.operations import force_release, inspect
from tests.contract.modes import Lock, locked
from tests.contract.support import (
    backends_configured,
    backends_setting,
    child_signalled,
    entries,
    in_thread,
    joined,
    record,
    requires,
    sleeping_in,
)
from tests.inventory.models import Item
from tests.support.processes import event, run_in_processes, start_process
from tests.support.waiting import TIMEOUT, wait_until

RELEASED = ReleaseOutcome.RELEASED

# -- grant and mutual exclusion ----------------------------------------------------------


def test_a_grant_is_seen_by_everyone_and_its_release_frees_the_lock(backend):
    lock = Lock("contract:grant", ttl=30, backend=backend)
    assert lock.acquire()
    assert lock.token and lock.owned() and lock.locked()
    info = lock.info()
    assert info is not None and info.token == lock.token and info.name == "contract:grant"
    assert Lock("contract:grant", backend=backend).locked()  # another object sees it held
    lock.release()
    assert not lock.locked() and not lock.owned()
    assert lock.info() is None and inspect("contract:grant", backend=backend) is None


def _critical_sections(
    index: int, backends: dict, alias: str, journal: str, counter: str, rounds: int
) -> int:
    """Child: ``rounds`` critical sections, each journaled at its start and its end,
    around a read-modify-write of a counter file that only exclusion keeps right."""
    with backends_configured(backends):
        for _ in range(rounds):
            with Lock("contract:exclusive", ttl=30, timeout=TIMEOUT, backend=alias) as lock:
                record(journal, "start", index, lock.fence)
                value = int(Path(counter).read_text())
                Path(counter).write_text(str(value + 1))
                record(journal, "end", index, lock.fence, value)
    return rounds


def journaled_sections(backend: str, journal: Path, counter: Path) -> list:
    """Run :func:`_critical_sections` in ``PROCESSES`` spawned processes; the sections as
    (start, end) pairs of journal lines, in the order they ran, checked not to overlap."""
    journal.touch()
    counter.write_text("0")
    done = run_in_processes(
        _critical_sections, PROCESSES, backends_setting(), backend, str(journal), str(counter),
        ROUNDS,
    )  # fmt: skip
    assert sum(done) == PROCESSES * ROUNDS
    lines = entries(journal)
    assert len(lines) == 2 * PROCESSES * ROUNDS
    sections = list(zip(lines[::2], lines[1::2], strict=True))
    for n, (start, end) in enumerate(sections):
        # Exclusion: every start is followed by its own end before anyone else starts.
        assert start[0] == "start" and end[0] == "end", f"section {n} overlaps: {start} {end}"
        assert start[1:3] == end[1:3], f"section {n} overlaps: {start} then {end}"
        assert int(end[3]) == n, f"section {n} read a counter another section was writing"
    assert int(counter.read_text()) == PROCESSES * ROUNDS
    return sections


PROCESSES, ROUNDS = 3, 30


@pytest.fixture(scope="module")
def section_runs(tmp_path_factory: pytest.TempPathFactory):
    """The journaled run of each backend, made by the first test that asks for it
    (spawning processes is the slow part; the two tests below read one run)."""
    runs: dict[str, list] = {}

    def sections(backend: str) -> list:
        if backend not in runs:
            where = tmp_path_factory.mktemp("sections")
            runs[backend] = journaled_sections(backend, where / "journal", where / "counter")
        return runs[backend]

    return sections


def test_mutual_exclusion_across_processes(backend, section_runs):
    sections = section_runs(backend)  # (checked there: no two overlap)
    assert {start[1] for start, _ in sections} == {str(i) for i in range(PROCESSES)}


@requires(FENCED)
def test_fences_strictly_increase_in_grant_order_across_processes(backend, section_runs):
    fences = [int(start[2]) for start, _ in section_runs(backend)]
    assert all(a < b for a, b in zip(fences, fences[1:], strict=False)), fences


# -- ownership and repeated calls -------------------------------------------------------


def test_only_the_owner_releases(backend):
    owner = Lock("contract:owner", ttl=30, backend=backend)
    assert owner.acquire()
    other = Lock("contract:owner", ttl=30, timeout=0, backend=backend)
    assert not other.acquire()
    with pytest.raises(LockError):
        other.release()  # it holds nothing
    impostor = Lock("contract:owner", token=secrets.token_hex(16), backend=backend)
    with pytest.raises(LockNotOwned):
        impostor.release()  # the backend says this token does not own it
    assert impostor.lost
    assert owner.owned() and owner.info().token == owner.token
    owner.release()
    assert not owner.locked()


def test_a_release_repeated_after_a_lost_reply_reports_success(backend):
    lock = Lock("contract:again", ttl=30, backend=backend)
    assert lock.acquire()
    token = lock.token
    assert lock.do_release(token, 1) == RELEASED
    assert lock.do_release(token, 1) == RELEASED  # as if the first reply had been lost
    assert not lock.locked()
    with Lock("contract:again", ttl=30, timeout=0, backend=backend) as newer:
        assert lock.do_release(token, 1) == RELEASED  # still known as released...
        assert newer.owned()  # ...and the newer holder's hold untouched
        lock.release()  # the object's own release: recognised as done, no error
        assert newer.owned()


# -- leases ----------------------------------------------------------------------------------


@requires(LEASED)
def test_a_lost_lease_makes_release_and_extend_raise_lock_not_owned(backend):
    stale = Lock("contract:lease", ttl=0.3, backend=backend)
    assert stale.acquire()
    newer = Lock("contract:lease", ttl=30, timeout=TIMEOUT, backend=backend)
    assert newer.acquire()  # granted once the stale holder's lease ran out
    with pytest.raises(LockNotOwned):
        stale.extend(30)
    with pytest.raises(LockNotOwned):
        stale.release()
    assert stale.lost and not stale.owned()
    assert newer.owned() and newer.info().token == newer.token  # nothing touched it
    newer.release()


@requires(LEASED, FENCED)
def test_a_stale_holders_fence_is_below_the_new_holders(backend):
    stale = Lock("contract:fence", ttl=0.3, backend=backend)
    assert stale.acquire()
    newer = Lock("contract:fence", ttl=30, timeout=TIMEOUT, backend=backend)
    assert newer.acquire()
    assert stale.fence < newer.fence
    newer.release()
    with Lock("contract:fence", ttl=30, backend=backend) as after:
        assert after.fence > newer.fence


@requires(LEASED)
def test_extend_resets_the_lease_for_the_owner_only(backend):
    lock = Lock("contract:extend", ttl=5, backend=backend)
    assert lock.acquire()
    lock.extend(30)
    assert 5 < lock.remaining() <= 30  # beyond the ttl it was granted with
    lock.extend()  # back to its own ttl
    assert 0 < lock.remaining() <= 5
    impostor = Lock("contract:extend", token=secrets.token_hex(16), backend=backend)
    with pytest.raises(LockNotOwned):
        impostor.extend(30)
    assert 0 < lock.remaining() <= 5  # the impostor extended nothing
    with pytest.raises(LockError):
        Lock("contract:extend", backend=backend).extend(30)  # not held by that object
    lock.release()


# -- not waiting, waiting, being woken ---------------------------------------------------------


def test_timeout_zero_and_blocking_false_try_once(backend):
    # The holder's lease is long: a call that waited instead of trying once would hang.
    holder = Lock("contract:once", ttl=300, timeout=0, backend=backend)
    assert holder.acquire()  # a free lock is granted by the one try
    assert not Lock("contract:once", timeout=0, backend=backend).acquire()
    assert not Lock("contract:once", blocking=False, timeout=TIMEOUT, backend=backend).acquire()
    waiter = Lock("contract:once", timeout=TIMEOUT, backend=backend)
    assert not waiter.acquire(blocking=False)
    assert not waiter.acquire(timeout=0)
    assert not waiter.owned() and holder.owned()
    holder.release()


def test_acquire_with_a_timeout_on_a_held_lock_returns_false(backend):
    holder = Lock("contract:busy", ttl=300, backend=backend)
    assert holder.acquire()
    waiter = Lock("contract:busy", ttl=30, timeout=0.2, backend=backend)
    assert waiter.acquire() is False
    assert waiter.acquire(timeout=0.1) is False
    assert not waiter.owned()
    with (
        pytest.raises(LockTimeout) as refused,
        Lock("contract:busy", ttl=30, timeout=0.1, backend=backend),
    ):
        pass
    assert refused.value.name == "contract:busy"
    assert holder.owned()
    holder.release()


@requires(WAKE_UP)
def test_a_waiter_is_woken_by_the_release(backend):
    holder = Lock("contract:wake", ttl=30, backend=backend)
    assert holder.acquire()
    # A lease as long as the holder's, taken just after it: what is left of it when
    # the waiter is granted says, on the backend's clock, how early that was.
    lease_clock = Lock("contract:wake:clock", ttl=30, backend=backend)
    assert lease_clock.acquire()
    waiter = Lock("contract:wake", ttl=30, timeout=20, backend=backend)
    thread, result = in_thread(lambda: (waiter.acquire(), lease_clock.remaining()))
    wait_until(lambda: sleeping_in(thread, "lock_wait"), what="the waiter asleep in lock_wait")
    holder.release()
    granted, left = joined(thread, result)
    # Not woken, it would have slept through its timeout (20 s of the holder's 30 s).
    assert granted and left > 10
    waiter.release()
    lease_clock.release()


# -- reentrancy --------------------------------------------------------------------------------


def test_a_reentrant_owner_counts_its_holds_and_only_the_last_release_frees(backend):
    outer = Lock("contract:re", ttl=30, reentrant=True, backend=backend)
    inner = Lock("contract:re", ttl=30, reentrant=True, backend=backend)  # same thread: same owner
    assert outer.acquire() and inner.acquire() and outer.acquire()
    assert outer.info().count == 3
    assert inner.token == outer.token and inner.fence == outer.fence

    def another_thread_tries() -> bool:
        return Lock("contract:re", ttl=30, reentrant=True, timeout=0, backend=backend).acquire()

    assert joined(*in_thread(another_thread_tries)) is False  # another thread: another owner
    inner.release()
    outer.release()
    assert outer.owned() and outer.info().count == 1
    assert joined(*in_thread(another_thread_tries)) is False
    outer.release()  # the last hold
    assert not outer.locked()
    with pytest.raises(LockError):
        outer.release()


@requires(LEASED)
def test_reentry_after_a_lost_lease_raises_and_grants_nothing(backend):
    lock = Lock("contract:re-lost", ttl=0.3, reentrant=True, backend=backend)
    assert lock.acquire()
    wait_until(lambda: not lock.locked(), what="the lease to run out")
    with pytest.raises(LockNotOwned):
        lock.acquire()
    assert lock.lost and not lock.locked()  # no fresh lease under the old token
    with pytest.raises(LockNotOwned):
        lock.release()
    assert lock.acquire()  # the owner starts over with a fresh grant
    assert lock.owned() and lock.info().count == 1
    lock.release()


# -- watchdog and max_hold ------------------------------------------------------------------------


@requires(LEASED)
def test_the_watchdog_keeps_a_lock_past_its_ttl_and_release_stops_it(backend, caplog):
    caplog.set_level(logging.WARNING, logger="stock_locks.lock.renewal")
    lock = Lock("contract:wd", ttl=1, watchdog=True, backend=backend)
    other = Lock("contract:wd-other", ttl=1, watchdog=True, backend=backend)
    assert lock.acquire() and other.acquire()
    two_ttls = Lock("contract:wd-clock", ttl=2, backend=backend)
    assert two_ttls.acquire()

    def held_until_gone(clock: Lock) -> bool:
        gone = not clock.locked()
        assert other.owned(), "a watchdog lock lost its lease"
        return gone

    def both_held_until_gone(clock: Lock) -> bool:
        gone = held_until_gone(clock)
        assert lock.owned(), "a watchdog lock lost its lease"
        return gone

    wait_until(lambda: both_held_until_gone(two_ttls), what="two ttls on the backend's clock")
    assert 0 < lock.remaining() <= 1 and not lock.lost
    lock.release()
    assert not lock.locked()
    # The other lock is still renewed (every ttl / 3); had the released one stayed in
    # the watchdog, its next renewal would have found it gone and marked it lost.
    half_ttl = Lock("contract:wd-clock", ttl=0.5, backend=backend)
    assert half_ttl.acquire()
    wait_until(lambda: held_until_gone(half_ttl), what="more renewals")
    assert not lock.lost and not lock.locked()
    other.release()
    assert not other.lost
    # On a healthy backend no renewal fails, and none found a lock lost.
    assert [r.getMessage() for r in caplog.records if r.name == "stock_locks.lock.renewal"] == []


@requires(LEASED)
def test_max_hold_cuts_a_watchdog_lock(backend, caplog):
    caplog.set_level(logging.WARNING, logger="stock_locks.lock.renewal")
    lock = Lock("contract:capped", ttl=1, watchdog=True, max_hold=2.5, backend=backend)
    assert lock.acquire()
    past_ttl = Lock("contract:capped-clock", ttl=1.5, backend=backend)
    assert past_ttl.acquire()
    wait_until(lambda: not past_ttl.locked(), what="one and a half ttls on the backend's clock")
    assert lock.owned()  # renewed past its ttl...
    wait_until(lambda: lock.lost, what="the watchdog to stop at max_hold")
    wait_until(lambda: not lock.locked(), what="the capped lease to end")  # ...but not forever
    assert "max_hold" in caplog.text
    newer = Lock("contract:capped", ttl=30, timeout=0, backend=backend)
    assert newer.acquire()
    with pytest.raises(LockNotOwned):
        lock.release()
    newer.release()


# -- holders, operators, decorators, fenced writes -------------------------------------------------


def _hold_until(backends: dict, alias: str, name: str, caller: str, acquired, release) -> None:
    """Child: hold ``name`` until told to release."""
    with backends_configured(backends), Lock(name, ttl=30, caller=caller, backend=alias):
        acquired.set()
        release.wait(TIMEOUT)


@requires(HOLDER_METADATA)
def test_inspect_shows_who_holds_a_lock_in_another_process(backend):
    acquired, release = event(), event()
    child = start_process(
        _hold_until, backends_setting(), backend, "contract:meta", "shop.views.pay", acquired,
        release,
    )  # fmt: skip
    try:
        child_signalled(acquired, child)
        info = inspect("contract:meta", backend=backend)
        assert info is not None
        assert (info.host, info.pid, info.thread, info.caller) == (
            socket.gethostname(), str(child.pid), "MainThread", "shop.views.pay",
        )  # fmt: skip
        assert info.backend == backend and info.count == 1 and info.acquired_at is not None
    finally:
        release.set()
        child.join(TIMEOUT)
    assert child.exitcode == 0
    assert inspect("contract:meta", backend=backend) is None
    with Lock("contract:meta", ttl=30, backend=backend) as mine:
        info = mine.info()
        assert info.token == mine.token and info.pid == str(os.getpid())
        assert info.caller.endswith("test_inspect_shows_who_holds_a_lock_in_another_process")


@requires(FORCE_RELEASE)
def test_force_release_frees_the_lock_and_the_holder_is_told(backend):
    holder = Lock("contract:forced", ttl=300, backend=backend)
    assert holder.acquire()
    other_token = secrets.token_hex(16)
    assert force_release("contract:forced", token=other_token, backend=backend) is None
    assert holder.owned()  # a force release by another token displaced nobody
    displaced = force_release("contract:forced", backend=backend)
    assert displaced is not None and displaced.token == holder.token
    assert not holder.locked()
    with pytest.raises(LockNotOwned):
        holder.release()
    assert holder.lost
    assert force_release("contract:forced", backend=backend) is None  # nothing left to free
    with Lock("contract:forced", ttl=30, timeout=0, backend=backend) as newer:
        assert newer.owned()


def test_locked_runs_the_function_holding_its_lock_on_the_backend(backend):
    @locked("contract:order:{order_id}", ttl=30, timeout=0, backend=backend)
    def pay(order_id: int) -> bool:
        # Held on this backend while the function runs (not on the default one).
        return Lock(f"contract:order:{order_id}", backend=backend).locked()

    assert pay(7) is True
    assert not Lock("contract:order:7", backend=backend).locked()
    with Lock("contract:order:7", ttl=30, backend=backend), pytest.raises(LockTimeout):
        pay(7)
    assert pay(8) is True  # another order's lock is another lock


@requires(FENCED, LEASED)
@pytest.mark.django_db
def test_fenced_update_refuses_the_stale_holders_fence(backend):
    item = Item.objects.create(code="TEA", title="Tea", on_hand=10)
    rows = Item.objects.filter(pk=item.pk)
    stale = Lock("inventory.item:TEA", ttl=0.3, backend=backend)
    assert stale.acquire()
    assert fenced_update(rows, stale.fence, on_hand=9) == 1  # written while it held the lock
    newer = Lock("inventory.item:TEA", ttl=30, timeout=TIMEOUT, backend=backend)
    assert newer.acquire()  # the stale holder paused past its lease
    assert fenced_update(rows, newer.fence, on_hand=7) == 1
    with pytest.raises(StaleFencingToken) as refused:
        fenced_update(rows, stale.fence, on_hand=8)  # it wakes up and writes
    assert (refused.value.fence, refused.value.current) == (stale.fence, newer.fence)
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (7, newer.fence)
    newer.release()
