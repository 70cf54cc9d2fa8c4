"""The ZooKeeper lock on a bad day: a holder paused past its session, the
ensemble's leader killed, a client cut off from the ensemble.

Real ZooKeeper servers (a standalone one, or a 3-node ensemble of the test's
own), real processes. What must hold: the lock is never granted twice at once,
fences keep rising (across a leader election too), waiters are served, and a
holder that lost its session loses its lock, learns it (``lost``), cannot write
over a newer holder (its fence is older) and cannot release anyone else's hold.
Outcomes are counted from the database and the processes' journal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stock_locks import Lock
from stock_locks.exceptions import BackendUnavailable, LockNotOwned, StaleFencingToken
from stock_locks.fencing import claim, fenced_update
from stock_locks.operations import inspect
from tests.contract.support import (
    backends_configured,
    backends_setting,
    entries,
    in_thread,
    joined,
    record,
)
from tests.inventory.models import Item
from tests.support.fault_processes import Child, marker, stop_here, wait_stopped
from tests.support.processes import run_in_processes
from tests.support.waiting import TIMEOUT, wait_until
from tests.support.zookeeper_servers import zookeeper_backend
from tests.support.zookeeper_servers import zookeeper_ensemble as zookeeper_ensemble
from tests.support.zookeeper_servers import zookeeper_server as zookeeper_server

pytestmark = pytest.mark.usefixtures("no_child_left")

SHORT_SESSION = 1.5  # seconds: the session of a holder this test pauses or cuts off


def epoch(fence: int) -> int:
    """The leader epoch a zxid (a fence) was assigned in."""
    return fence >> 32


# -- a holder paused past its session --------------------------------------------------


def _pausing_holder(backends: dict, pk: int, pause, journal: str) -> None:
    """Child: take the lock, claim the row, stop; once resumed, try to write."""
    with backends_configured(backends):
        lock = Lock("inventory.item:ZKP", backend="paused")
        assert lock.acquire()
        rows = Item.objects.filter(pk=pk)
        claim(rows, lock.fence)
        record(journal, "granted", lock.fence)
        stop_here(pause)  # SIGSTOP: every thread, kazoo's pings too
        try:
            fenced_update(rows, lock.fence, on_hand=0)
            record(journal, "written", lock.fence)
        except StaleFencingToken:
            record(journal, "refused", lock.fence)
        wait_until(lambda: lock.lost, what="the expired session to be noticed")
        record(journal, "lost")
        try:
            lock.release()
            record(journal, "released")
        except LockNotOwned:
            record(journal, "not-owned")


@pytest.mark.django_db(transaction=True)
def test_a_holder_paused_past_its_session_loses_the_lock_and_its_write_is_refused(
    zookeeper_server, tmp_path
):
    item = Item.objects.create(code="ZKP", title="Paused", on_hand=10)
    rows = Item.objects.filter(pk=item.pk)
    journal = str(tmp_path / "journal")
    backends = {
        "paused": zookeeper_backend(zookeeper_server.hosts, "/faults-p", SHORT_SESSION),
        "newer": zookeeper_backend(zookeeper_server.hosts, "/faults-p"),
    }
    with backends_configured(backends):
        pause = marker()
        holder = Child(_pausing_holder, backends_setting(), item.pk, pause, journal)
        wait_stopped(holder, pause, "the holder paused while holding the lock")
        # Granted once the paused holder's session expired on the server (no sleep here:
        # the waiter is woken by the deletion of the holder's child).
        newer = Lock("inventory.item:ZKP", timeout=TIMEOUT, backend="newer")
        assert newer.acquire()
        assert fenced_update(rows, newer.fence, on_hand=7) == 1
        holder.resume()
        holder.result()
        assert newer.owned()
        newer.release()
    (granted, fence), *after = entries(journal)
    assert granted == "granted" and int(fence) < newer.fence
    assert after == [["refused", fence], ["lost"], ["not-owned"]]
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (7, newer.fence)


# -- the leader killed while locks are held and waited for --------------------------------

NAME, ROUNDS, PROCESSES = "zk:failover", 30, 3


def _sections_through_failover(index: int, backends: dict, journal: str, counter: str) -> int:
    """Child: ``ROUNDS`` journaled critical sections; an acquire or a release that
    meets the failover (outcome unknown) is repeated, as an application would."""
    with backends_configured(backends):
        done = 0
        while done < ROUNDS:
            lock = Lock(NAME, timeout=TIMEOUT, backend="ensemble")
            try:
                assert lock.acquire(), "not granted within TIMEOUT"
            except BackendUnavailable:
                record(journal, "retry", index)
                continue
            record(journal, "start", index, lock.fence)
            value = int(Path(counter).read_text())
            Path(counter).write_text(str(value + 1))
            record(journal, "end", index, lock.fence, value)
            while True:
                try:
                    lock.release()
                    break
                except BackendUnavailable:
                    record(journal, "retry", index)
                except LockNotOwned:
                    record(journal, "lost", index)
                    break
            done += 1
    return done


def test_the_leader_killed_while_locks_are_held_and_waited_for(zookeeper_ensemble, tmp_path):
    journal, counter = tmp_path / "journal", tmp_path / "counter"
    journal.touch()
    counter.write_text("0")
    backends = {"ensemble": zookeeper_backend(zookeeper_ensemble.hosts, "/faults-f", 8.0)}
    with backends_configured(backends):
        run = in_thread(
            lambda: run_in_processes(
                _sections_through_failover,
                PROCESSES,
                backends_setting(),
                str(journal),
                str(counter),
            )  # fmt: skip
        )

        def ends() -> int:
            return sum(line[0] == "end" for line in entries(journal))

        wait_until(lambda: ends() >= ROUNDS // 2, what="sections before the failover")
        leader = zookeeper_ensemble.leader()
        leader.kill()
        record(str(journal), "killed", leader.myid)
        zookeeper_ensemble.wait_for_quorum()  # the two others elect a new leader
        assert joined(*run) == [ROUNDS] * PROCESSES  # every waiter was served
    lines = entries(journal)
    assert ["killed", str(leader.myid)] in lines
    assert not [line for line in lines if line[0] == "lost"]
    sections = [line for line in lines if line[0] in ("start", "end")]
    assert len(sections) == 2 * PROCESSES * ROUNDS
    pairs = list(zip(sections[::2], sections[1::2], strict=True))
    for n, (start, end) in enumerate(pairs):
        # No double grant: every start is followed by its own end before anyone starts.
        assert start[0] == "start" and end[0] == "end", f"section {n} overlaps"
        assert start[1:3] == end[1:3] and int(end[3]) == n, f"section {n}: {start} {end}"
    assert int(counter.read_text()) == PROCESSES * ROUNDS
    fences = [int(start[2]) for start, _ in pairs]
    assert all(a < b for a, b in zip(fences, fences[1:], strict=False)), fences
    assert epoch(fences[-1]) > epoch(fences[0])  # later grants come from the new leader's log


# -- a client cut off from the ensemble ------------------------------------------------------


@pytest.mark.django_db
def test_a_client_cut_off_loses_its_lock_and_only_its_own(zookeeper_server, fault_proxy):
    item = Item.objects.create(code="ZKC", title="Cut off", on_hand=10)
    rows = Item.objects.filter(pk=item.pk)
    proxy = fault_proxy(zookeeper_server.port)
    backends = {
        "cut": zookeeper_backend(f"127.0.0.1:{proxy.port}", "/faults-c", SHORT_SESSION),
        "direct": zookeeper_backend(zookeeper_server.hosts, "/faults-c"),
    }
    with backends_configured(backends):
        cut = Lock("inventory.item:ZKC", backend="cut")
        assert cut.acquire()
        claim(rows, cut.fence)
        proxy.stall()  # the network between it and the ensemble holds everything
        other = Lock("inventory.item:ZKC", timeout=TIMEOUT, backend="direct")
        assert other.acquire()  # once the cut-off client's session expired
        assert other.fence > cut.fence
        assert fenced_update(rows, other.fence, on_hand=7) == 1
        proxy.resume()
        wait_until(lambda: cut.lost, what="the cut-off client to learn its session ended")
        with pytest.raises(StaleFencingToken):
            fenced_update(rows, cut.fence, on_hand=0)
        with pytest.raises(LockNotOwned):
            cut.release()
        # Its release deleted nothing of the newer holder's.
        assert other.owned()
        assert inspect("inventory.item:ZKC", backend="direct").token == other.token
        other.release()
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (7, other.fence)
