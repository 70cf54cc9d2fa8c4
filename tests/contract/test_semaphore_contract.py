"""The semaphore contract: what ``Semaphore``, ``FairSemaphore`` and
``@limit_concurrency`` promise on every backend that declares ``SEMAPHORES``.

Plain functions of the ``backend`` alias, as in test_lock_contract.py; most run
for both kinds. Leases end by themselves, waits end on conditions.
"""

from __future__ import annotations

import os
import socket

import pytest

from stock_locks.backends.base import HOLDER_METADATA, LEASED, SEMAPHORES, WAKE_UP
from stock_locks.exceptions import LockNotOwned, LockTimeout
from tests.contract.modes import FairSemaphore, Lock, Semaphore, limit_concurrency
from tests.contract.support import (
    backends_configured,
    backends_setting,
    entries,
    in_thread,
    joined,
    record,
    requires,
    sleeping_in,
)
from tests.support.processes import run_in_processes
from tests.support.waiting import TIMEOUT, wait_until

KINDS = pytest.mark.parametrize("kind", [Semaphore, FairSemaphore], ids=["plain", "fair"])


@requires(SEMAPHORES)
@KINDS
def test_at_most_limit_holders_and_a_released_permit_is_granted_again(kind, backend):
    a, b, c = (kind("contract:pair", 2, ttl=30, timeout=0, backend=backend) for _ in range(3))
    assert a.acquire() and b.acquire()  # up to the limit, at once
    assert not c.acquire()
    assert not c.acquire(timeout=0.1)
    assert sorted(h["identifier"] for h in c.holders()) == sorted([a.id, b.id])
    a.release()
    assert c.acquire()
    with pytest.raises(LockTimeout), kind("contract:pair", 2, ttl=30, timeout=0, backend=backend):
        pass
    b.release()
    c.release()
    assert c.holders() == []


def _take_permits(
    index: int, backends: dict, alias: str, journals: dict, limit: int, rounds: int
) -> int:
    """Child: ``rounds`` times for each kind, hold a permit while journaling entry and exit."""
    with backends_configured(backends):
        for kind in (Semaphore, FairSemaphore):
            journal = journals[kind.__name__]
            for _ in range(rounds):
                name = f"contract:permits:{kind.__name__}"
                with kind(name, limit, ttl=30, timeout=TIMEOUT, backend=alias):
                    record(journal, "in", index)
                    entries(journal)  # some work while holding: the journal read back
                    record(journal, "out", index)
    return rounds


@requires(SEMAPHORES)
def test_the_limit_is_never_exceeded_across_processes(backend, tmp_path):
    # One run of processes checks both kinds (spawning them is the slow part).
    journals = {kind.__name__: tmp_path / kind.__name__ for kind in (Semaphore, FairSemaphore)}
    for journal in journals.values():
        journal.touch()
    processes, limit, rounds = 3, 2, 20
    done = run_in_processes(
        _take_permits, processes, backends_setting(), backend,
        {name: str(path) for name, path in journals.items()}, limit, rounds,
    )  # fmt: skip
    assert sum(done) == processes * rounds
    for name, journal in journals.items():
        lines = entries(journal)
        assert len(lines) == 2 * processes * rounds, name
        inside: set[str] = set()
        for n, (what, who) in enumerate(lines):
            if what == "in":
                assert who not in inside
                inside.add(who)
                assert len(inside) <= limit, f"{name} line {n}: {sorted(inside)} hold at once"
            else:
                inside.remove(who)
        assert not inside


@requires(SEMAPHORES)
def test_a_fair_semaphore_admits_waiters_in_arrival_order(backend):
    holder = FairSemaphore("contract:fair", 1, ttl=30, backend=backend)
    assert holder.acquire()
    admitted: list[int] = []

    def wait_in_line(n: int) -> bool:
        sem = FairSemaphore("contract:fair", 1, ttl=30, timeout=TIMEOUT, backend=backend)
        granted = sem.acquire()
        admitted.append(n)  # while holding the one permit: in grant order
        sem.release()
        return granted

    waiters = []
    for n in range(3):
        thread, result = in_thread(lambda n=n: wait_in_line(n))
        # The next one arrives only once this one waits in line.
        wait_until(
            lambda thread=thread: sleeping_in(thread, "semaphore_wait"), what=f"waiter {n} queued"
        )
        waiters.append((thread, result))
    holder.release()
    assert [joined(thread, result) for thread, result in waiters] == [True, True, True]
    assert admitted == [0, 1, 2]


@requires(SEMAPHORES, WAKE_UP)
@KINDS
def test_a_release_wakes_a_waiter(kind, backend):
    holder = kind("contract:wake", 1, ttl=30, backend=backend)
    assert holder.acquire()
    # As long as the holder's lease, taken just after it: what is left of it when the
    # waiter is granted says, on the backend's clock, how early that was.
    lease_clock = Lock("contract:wake:clock", ttl=30, backend=backend)
    assert lease_clock.acquire()
    waiter = kind("contract:wake", 1, ttl=30, timeout=20, backend=backend)
    thread, result = in_thread(lambda: (waiter.acquire(), lease_clock.remaining()))
    wait_until(lambda: sleeping_in(thread, "semaphore_wait"), what="the waiter asleep")
    holder.release()
    granted, left = joined(thread, result)
    # Not woken, it would have slept through its timeout (20 s of the holder's 30 s).
    assert granted and left > 10
    waiter.release()
    lease_clock.release()


@requires(SEMAPHORES)
@KINDS
def test_a_permit_release_repeated_after_a_lost_reply_reports_success(kind, backend):
    sem = kind("contract:again", 1, ttl=30, backend=backend)
    assert sem.acquire()
    assert sem.do_release() is True
    assert sem.do_release() is True  # as if the first reply had been lost
    sem.release()  # the object's own release: recognised as done, no error
    with kind("contract:again", 1, ttl=30, timeout=0, backend=backend) as newer:
        assert [h["identifier"] for h in newer.holders()] == [newer.id]


@requires(SEMAPHORES, LEASED)
@KINDS
def test_a_holder_whose_lease_ended_is_told_on_refresh_and_release(kind, backend):
    stale = kind("contract:lapse", 1, ttl=0.3, backend=backend)
    assert stale.acquire()
    newer = kind("contract:lapse", 1, ttl=30, timeout=TIMEOUT, backend=backend)
    assert newer.acquire()  # granted once the stale lease ended
    with pytest.raises(LockNotOwned):
        stale.refresh()
    assert stale.lost
    with pytest.raises(LockNotOwned):
        stale.release()
    assert [h["identifier"] for h in newer.holders()] == [newer.id]  # untouched
    newer.release()


@requires(SEMAPHORES, LEASED)
def test_refresh_resets_a_permits_lease(backend):
    sem = Semaphore("contract:refresh", 2, ttl=5, backend=backend)
    assert sem.acquire()
    sem.refresh(30)
    [holder] = sem.holders()
    assert 5 < holder["remaining"] <= 30
    sem.refresh()  # back to its own ttl
    assert 0 < sem.holders()[0]["remaining"] <= 5
    sem.release()
    assert sem.holders() == []


@requires(SEMAPHORES, HOLDER_METADATA)
@KINDS
def test_holders_show_host_pid_thread_and_caller(kind, backend):
    with kind("contract:meta", 2, ttl=30, caller="shop.exports", backend=backend) as sem:
        [holder] = sem.holders()
        assert holder["identifier"] == sem.id
        assert (holder["host"], str(holder["pid"]), holder["thread"], holder["caller"]) == (
            socket.gethostname(), str(os.getpid()), "MainThread", "shop.exports",
        )  # fmt: skip
        assert holder["acquired_at"] is not None


@requires(SEMAPHORES)
def test_limit_concurrency_runs_the_function_holding_a_permit_on_the_backend(backend):
    @limit_concurrency("contract:export:{user}", 1, ttl=30, timeout=0, backend=backend)
    def export(user: str) -> bool:
        # The call holds the one permit of this backend's semaphore while it runs.
        return Semaphore(f"contract:export:{user}", 1, timeout=0, backend=backend).acquire()

    assert export("ann") is False
    assert export("bob") is False  # bob's semaphore: the call's own permit
    with (
        Semaphore("contract:export:ann", 1, ttl=30, backend=backend),
        pytest.raises(LockTimeout),
    ):
        export("ann")
    after = Semaphore("contract:export:ann", 1, ttl=30, timeout=0, backend=backend)
    assert after.acquire()  # the calls gave their permits back
    after.release()
