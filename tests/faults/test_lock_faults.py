"""Locks when things go wrong: lost leases, shared objects, interrupted calls, lost
replies, a Redis restored from an older snapshot (issue 8).

Every scenario runs against real redis-server processes, with the holders in
their own OS processes or threads; leases end by writing state (PEXPIRE), not
by sleeping; the network faults come from a TCP proxy in front of Redis; the
verdict is read from Redis and PostgreSQL.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stock_locks import Lock
from stock_locks.exceptions import LockError, LockNotOwned, StaleFencingToken
from stock_locks.fencing import fenced_update
from tests.inventory.models import Item
from tests.support.fault_proxy import RETRIES, Interrupted, client_through, raise_interrupted
from tests.support.lock_state import held, last_fence, lease_runs_out
from tests.support.processes import event, start_process
from tests.support.redis_stats import blocked_clients, commandstats
from tests.support.waiting import TIMEOUT, wait_until

_spawn = multiprocessing.get_context("spawn")


def _item() -> Item:
    return Item.objects.create(code="KETTLE", title="Kettle", on_hand=110)


def _rows(pk: int):
    return Item.objects.filter(pk=pk)


# -- 1. re-entry after the lease ended ------------------------------------------------------


def _reentrant_holder(report, lease_gone, other_wrote, item_pk: int) -> None:
    """Child: a reentrant holder whose lease ends; later it re-enters and writes."""
    lock = Lock("item:kettle", ttl=300, reentrant=True)
    assert lock.acquire(timeout=0)
    fence = lock.fence
    report.put(("held", fence))
    lease_gone.wait(TIMEOUT)
    other_wrote.wait(TIMEOUT)
    try:
        lock.acquire()  # re-entry, as a nested call under the same lock would
    except LockNotOwned:
        report.put(("re-entry", "LockNotOwned"))
    else:
        report.put(("re-entry", f"granted fence {lock.fence}"))
    try:
        fenced_update(_rows(item_pk), lock.fence, on_hand=11)  # computed from a stale read
    except StaleFencingToken:
        report.put(("write", "refused"))
    else:
        report.put(("write", "accepted"))


def _newer_holder(report, item_pk: int) -> None:
    """Child: takes the lock after the first holder's lease ended, writes fenced."""
    with Lock("item:kettle", ttl=300, timeout=0) as lock:
        fenced_update(_rows(item_pk), lock.fence, on_hand=100)
        report.put(("newer", lock.fence))


@pytest.mark.django_db(transaction=True)
def test_reentry_after_the_lease_ended_is_refused_and_its_stale_write_too(redis_client):
    item = _item()
    report, lease_gone, other_wrote = _spawn.Queue(), event(), event()
    first = start_process(_reentrant_holder, report, lease_gone, other_wrote, item.pk)
    try:
        state, old_fence = report.get(timeout=TIMEOUT)
        assert state == "held"
        redis_client.pexpire("sl:lock:{item:kettle}", 1)  # the lease ends now
        wait_until(lambda: not held(redis_client, "sl:lock:{item:kettle}"), what="lease end")
        lease_gone.set()
        second = start_process(_newer_holder, report, item.pk)
        state, newer_fence = report.get(timeout=TIMEOUT)
        assert state == "newer" and newer_fence > old_fence
        second.join(TIMEOUT)
        other_wrote.set()
        assert report.get(timeout=TIMEOUT) == ("re-entry", "LockNotOwned")
        assert report.get(timeout=TIMEOUT) == ("write", "refused")
    finally:
        lease_gone.set()
        other_wrote.set()
        first.join(TIMEOUT)
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (100, newer_fence)  # the newer write stands
    assert not held(redis_client, "sl:lock:{item:kettle}")  # nothing resurrected


# -- 2. one reentrant Lock object shared by threads -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_threads_sharing_a_reentrant_lock_are_separate_owners(redis_client):
    item = _item()
    shared = Lock("item:kettle", ttl=300, reentrant=True)
    a_held, a_lease_gone, b_wrote, a_done = (threading.Event() for _ in range(4))
    seen: dict[str, Any] = {}

    def thread_a() -> None:  # holds, loses its lease, then tries to write
        shared.acquire(timeout=0)
        seen["a_fence"] = shared.fence
        a_held.set()
        b_wrote.wait(TIMEOUT)
        seen["a_owned"] = shared.owned()
        try:
            fenced_update(_rows(item.pk), shared.fence, on_hand=11)
            seen["a_write"] = "accepted"
        except StaleFencingToken:
            seen["a_write"] = "refused"
        a_done.set()

    def thread_b() -> None:  # takes the lock once A's lease ended, writes, releases
        a_lease_gone.wait(TIMEOUT)
        with shared:
            seen["b_fence"] = shared.fence
            fenced_update(_rows(item.pk), shared.fence, on_hand=100)
            b_wrote.set()
            a_done.wait(TIMEOUT)
            seen["b_owned"] = shared.owned()

    def thread_c() -> None:  # holds nothing
        try:
            shared.release()
        except LockError as error:
            seen["c_release"] = type(error).__name__

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for thread in threads:
        thread.start()
    assert a_held.wait(TIMEOUT)
    intruder = threading.Thread(target=thread_c)
    intruder.start()
    intruder.join(TIMEOUT)
    assert held(redis_client, "sl:lock:{item:kettle}")  # A's hold not released by C
    redis_client.pexpire("sl:lock:{item:kettle}", 1)  # A's lease ends
    wait_until(lambda: not held(redis_client, "sl:lock:{item:kettle}"), what="lease end")
    a_lease_gone.set()
    for thread in threads:
        thread.join(TIMEOUT)
    assert seen["c_release"] == "LockError"
    assert seen["b_fence"] > seen["a_fence"]
    assert seen["a_owned"] is False and seen["b_owned"] is True
    assert seen["a_write"] == "refused"
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (100, seen["b_fence"])
    assert not held(redis_client, "sl:lock:{item:kettle}")


# -- 3. acquire() or release() interrupted mid-round-trip ---------------------------------------


def _load_scripts(client: redis.Redis) -> None:
    """Run each script once, so no call through the proxy needs a SCRIPT LOAD."""
    with Lock("warm-up", ttl=10, redis=client):
        pass


def _acquire_interrupted(url: str, report, go) -> None:
    """Child: acquire while the network holds the request; a signal interrupts it."""
    signal.signal(signal.SIGUSR1, raise_interrupted)
    client = client_through(url)
    with Lock("warm-up", ttl=10, redis=client):  # its script connection made before the stall
        pass
    lock = Lock("stalled", ttl=300, redis=client)
    report.put("ready")
    go.wait(TIMEOUT)
    try:
        granted = lock.acquire(timeout=TIMEOUT)
    except Interrupted:
        report.put("interrupted")
    else:
        report.put(f"not interrupted: {granted}")


def test_an_acquire_interrupted_mid_round_trip_leaves_the_lock_free(
    redis_server, redis_client, fault_proxy
):
    _load_scripts(redis_client)
    proxy = fault_proxy(redis_server.port)
    report, go = _spawn.Queue(), event()
    child = start_process(_acquire_interrupted, proxy.url, report, go)
    try:
        assert report.get(timeout=TIMEOUT) == "ready"
        redis_client.config_resetstat()
        proxy.stall()
        go.set()
        wait_until(lambda: proxy.held_requests == 1, what="the acquire held up by the network")
        os.kill(child.pid, signal.SIGUSR1)
        # The call ends although the network is still stalled: its give-back is bounded.
        assert report.get(timeout=TIMEOUT) == "interrupted"
    finally:
        proxy.resume()
    child.join(TIMEOUT)
    # Both requests reach Redis now, in either order: the try (granted if it lands
    # first) and the give-back (which makes the try be refused if it lands later).
    wait_until(
        lambda: commandstats(redis_client).get("cmdstat_evalsha") == 2,
        what="the late try and the give-back ran",
    )
    assert not held(redis_client, "sl:lock:{stalled}")
    assert Lock("stalled", ttl=10, timeout=0).acquire()


def _release_interrupted_then_again(url: str, report, go, again) -> None:
    """Child: hold the lock; the release is held up and interrupted; release again."""
    signal.signal(signal.SIGUSR1, raise_interrupted)
    lock = Lock("held", ttl=300, redis=client_through(url))
    assert lock.acquire(timeout=0)
    report.put("held")
    go.wait(TIMEOUT)
    try:
        lock.release()
    except Interrupted:
        report.put("interrupted")
    else:
        report.put("not interrupted")
        return
    again.wait(TIMEOUT)
    try:
        lock.release()
    except LockError as error:
        report.put(f"release failed: {error!r}")
    else:
        report.put("released")


@pytest.mark.parametrize("network", ["delivers late", "loses the requests"])
def test_a_release_interrupted_mid_round_trip_still_frees_the_lock(
    network, redis_server, redis_client, fault_proxy
):
    _load_scripts(redis_client)
    proxy = fault_proxy(redis_server.port)
    report, go, again = _spawn.Queue(), event(), event()
    child = start_process(_release_interrupted_then_again, proxy.url, report, go, again)
    try:
        assert report.get(timeout=TIMEOUT) == "held"
        proxy.stall()
        go.set()
        wait_until(lambda: proxy.held_requests == 1, what="the release held up by the network")
        os.kill(child.pid, signal.SIGUSR1)
        assert report.get(timeout=TIMEOUT) == "interrupted"
        if network == "loses the requests":
            proxy.cut()  # the release and its bounded give-back never reach Redis
    finally:
        proxy.resume()
    if network == "loses the requests":
        assert held(redis_client, "sl:lock:{held}")  # still held: nothing arrived
    # The interrupted call did not forget the hold, so it can be released again
    # (after a late delivery, that repeat reports the release that happened).
    again.set()
    assert report.get(timeout=TIMEOUT) == "released"
    child.join(TIMEOUT)
    wait_until(lambda: not held(redis_client, "sl:lock:{held}"), what="the lock freed")
    assert Lock("held", ttl=10, timeout=0).acquire()


def _given_up_beside_a_holder_whose_lease_runs_out(redis_client, name: str) -> tuple[Lock, Lock]:
    """(holder, late): the holder took ``name``; ``late``'s try of token "t"*32 was given
    up while it held; then the holder's lease ran out (the lock key is gone)."""
    holder = Lock(name, ttl=30)
    assert holder.acquire(timeout=0)
    late = Lock(name, ttl=30)
    late.do_release("t" * 32, 1, "abandon")
    lease_runs_out(redis_client, holder.keys.lock)
    return holder, late


def test_a_try_given_up_while_another_holds_is_refused_after_that_lease_ran_out(redis_client):
    # A try is given up (its request still on the way) while another token holds the lock
    # with little lease left; that lease runs out before the late request lands. The give-
    # back is kept apart from the holder's record (whose expiry is the holder's lease).
    holder, late = _given_up_beside_a_holder_whose_lease_runs_out(redis_client, "late:held")
    with pytest.raises(LockError):
        late.do_acquire("t" * 32, 0)  # the late copy lands: nothing granted
    assert not held(redis_client, holder.keys.lock)
    assert Lock("late:held", ttl=10, timeout=0).acquire()


@pytest.mark.parametrize("then", ["a grant and its release", "another give-back"])
def test_a_try_given_up_while_another_holds_stays_refused_when_the_key_is_made_again(
    then, redis_client
):
    # The holder's lease runs out; then the key is made again from nothing (a grant and
    # its release, or another try given up on the free lock) before the late copy lands:
    # the new key must carry on the tokens given back while the holder held it.
    holder, late = _given_up_beside_a_holder_whose_lease_runs_out(redis_client, "late:again")
    if then == "a grant and its release":
        with Lock("late:again", ttl=30):
            pass
    else:
        late.do_release("y" * 32, 1, "abandon")
    with pytest.raises(LockError):
        late.do_acquire("t" * 32, 0)  # the late copy lands: nothing granted
    assert not held(redis_client, holder.keys.lock)


@pytest.mark.parametrize("while_", ["another holds", "the lock is free"])
def test_a_try_given_up_stays_refused_however_many_releases_follow(while_, redis_client):
    # The lock key keeps the last RELEASED_KEPT released tokens; a given-up try must stay
    # refused its FENCE_RETENTION however many grants and releases come after it.
    from stock_locks.backends.redis.protocol import RELEASED_KEPT

    holder = Lock("late:many", ttl=30)
    if while_ == "another holds":
        assert holder.acquire(timeout=0)
        holder.do_release("t" * 32, 1, "abandon")
        holder.release()
    else:
        holder.do_release("t" * 32, 1, "abandon")
    for _ in range(RELEASED_KEPT + 2):
        with Lock("late:many", ttl=30):
            pass
    with pytest.raises(LockError):
        holder.do_acquire("t" * 32, 0)  # the late copy lands: nothing granted
    assert not held(redis_client, holder.keys.lock)


def test_a_try_given_up_on_a_tombstone_about_to_expire_is_remembered_a_retention(
    redis_client,
):
    # The lock is free, its tombstone has moments left: the give-back keeps it (and the
    # given-up token) at least FENCE_RETENTION, so the late copy is refused then too.
    with Lock("late:free", ttl=30) as lock:
        pass
    redis_client.pexpire(lock.keys.lock, 200)
    lock.do_release("u" * 32, 1, "abandon")
    assert 55_000 < redis_client.pttl(lock.keys.lock) <= 60_000
    with pytest.raises(LockError):
        lock.do_acquire("u" * 32, 0)
    assert not held(redis_client, lock.keys.lock)


# -- 4. a release whose reply was lost ------------------------------------------------------------


def _holder_through(proxy, retries: int) -> Lock:
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), retries))
    lock = Lock("lost", ttl=300, redis=client)
    assert lock.acquire(timeout=0)
    return lock


@RETRIES
def test_a_release_whose_reply_was_lost_reports_success(
    retries, redis_server, redis_client, fault_proxy
):
    _load_scripts(redis_client)
    proxy = fault_proxy(redis_server.port)
    lock = _holder_through(proxy, retries)
    proxy.lose_reply(b"EVALSHA")
    lock.release()  # it ran, its reply was lost; the repeat learns that it happened
    assert proxy.lost == 1
    assert not held(redis_client, "sl:lock:{lost}")
    with pytest.raises(LockError):
        lock.release()  # and the hold is gone on this side too


@RETRIES
def test_a_lost_lease_still_raises_when_the_reply_is_lost(
    retries, redis_server, redis_client, fault_proxy
):
    _load_scripts(redis_client)
    proxy = fault_proxy(redis_server.port)
    lock = _holder_through(proxy, retries)
    redis_client.set("sl:lock:{lost}", "intruder", px=300_000)  # another holder now
    proxy.lose_reply(b"EVALSHA")
    with pytest.raises(LockNotOwned):
        lock.release()
    assert proxy.lost == 1
    assert redis_client.get("sl:lock:{lost}") == b"intruder"


def _wait_while_the_wake_up_is_swallowed(url: str, report, go) -> None:
    """Child: wait for a held lock, with a timeout, the wake-up's reply never arriving."""
    lock = Lock("swallowed", ttl=300, redis=client_through(url))
    report.put("ready")
    go.wait(TIMEOUT)
    granted = lock.acquire(timeout=1.0)
    report.put((granted, lock.token, lock.fence if granted else None))
    if granted:
        lock.release()
    report.put(held(redis.Redis.from_url(url), "sl:lock:{swallowed}"))


def test_a_waiter_whose_wake_up_reply_is_lost_finds_the_grant_it_carried(
    redis_server, redis_client, fault_proxy
):
    """The try a waiter sends behind its BLPOP runs at the wake-up, but the replies of
    both never reach it: its wait ends on its deadline, and its last try (the same
    token) finds the grant instead of leaving the lock held by nobody who knows."""
    _load_scripts(redis_client)
    proxy = fault_proxy(redis_server.port)
    holder = Lock("swallowed", ttl=300, redis=redis_client)
    assert holder.acquire(timeout=0)
    report, go = _spawn.Queue(), event()
    child = start_process(_wait_while_the_wake_up_is_swallowed, proxy.url, report, go)
    assert report.get(timeout=TIMEOUT) == "ready"
    proxy.swallow_reply(b"BLPOP")
    go.set()
    wait_until(lambda: blocked_clients(redis_client) == 1, what="the waiter blocked in BLPOP")
    holder.release()
    granted, token, fence = report.get(timeout=TIMEOUT)
    assert proxy.swallowed == 1
    assert granted is True and fence > holder.fence  # granted once, to the waiting token
    assert not report.get(timeout=TIMEOUT)  # its release freed it
    child.join(TIMEOUT)
    assert token[:16] in redis_client.get("sl:lock:{swallowed}").decode()  # (remembered)
    assert Lock("swallowed", ttl=10, timeout=0, redis=redis_client).acquire()


def test_a_waiter_that_gave_up_is_never_granted_by_the_try_its_wait_carried(
    redis_server, redis_client, fault_proxy
):
    """A waiter's try rides behind its BLPOP. It times out and drops that connection,
    but the server learns of the close late: the release pops the signal for the
    dead connection, and the try behind it runs. The waiter gave its token back when
    it gave up, so that try is refused: the lock stays free, not held by nobody."""
    _load_scripts(redis_client)
    proxy = fault_proxy(redis_server.port)
    holder = Lock("gave-up", ttl=300, redis=redis_client)
    assert holder.acquire(timeout=0)
    waiter = Lock("gave-up", ttl=300, redis=client_through(proxy.url))
    proxy.hold_closes()
    assert waiter.acquire(timeout=0.5) is False  # (a wall-clock wait: the timeout itself)
    assert blocked_clients(redis_client) == 1  # its BLPOP, still open on the server
    evalsha = commandstats(redis_client)["cmdstat_evalsha"]
    holder.release()  # pops the signal for the dead connection: its try runs now
    wait_until(
        lambda: commandstats(redis_client)["cmdstat_evalsha"] == evalsha + 2,
        what="the release and the try behind the dead BLPOP",
    )
    proxy.pass_closes()
    assert not held(redis_client, "sl:lock:{gave-up}")
    other = Lock("gave-up", ttl=10, timeout=0, redis=redis_client)
    assert other.acquire() and other.fence > holder.fence
    other.release()


# -- 5. fences across a restore from an older snapshot ---------------------------------------------


def _grant_fences(client: redis.Redis, names: list[str]) -> list[int]:
    fences = []
    for name in names:
        with Lock(name, ttl=30, redis=client) as lock:
            fences.append(lock.fence)
    return fences


def test_a_lease_that_runs_out_leaves_its_fence_behind(redis_client):
    # A holder dies: its lease runs out, no release leaves a tombstone. The fence must
    # stay behind until the Redis clock has passed it by FENCE_RETENTION, so that a clock
    # stepped back meanwhile (an NTP step, a failover to a host behind) cannot give the
    # next holder a lower fence. Both a name's first grant (which writes the floor) and a
    # later one granted from a tombstone (which does not) are covered.
    for name in ("lapse:first", "lapse:again"):
        lock = Lock(name, ttl=30)
        if name == "lapse:again":
            with lock:
                pass
        assert lock.acquire(timeout=0)
        redis_client.pexpire(lock.keys.lock, 1)  # the holder is gone; its lease runs out
        wait_until(lambda: not redis_client.exists(lock.keys.lock), what="the lease end")  # noqa: B023
        kept = int(redis_client.get(lock.keys.fence))
        assert kept >= lock.fence
        most_left_ms = (kept - lock.fence) // 1000 + 60_000  # until the clock passed it, +1 min
        assert 55_000 < redis_client.pttl(lock.keys.fence) <= most_left_ms
        with Lock(name, ttl=30) as later:
            assert later.fence > kept  # above it whatever the clock says


@pytest.mark.django_db(transaction=True)
def test_fences_keep_rising_after_a_restore_from_an_older_snapshot(redis_factory):
    server = redis_factory()
    names = ["item:kettle", "item:tea", "order:1"] * 3
    before = _grant_fences(server.client(), names)
    snapshot = server.snapshot()  # the backup: its counters are the ones of `before`
    after_backup = _grant_fences(server.client(), names)
    item = _item()
    fenced_update(_rows(item.pk), after_backup[-3], on_hand=50)  # newest "item:kettle"
    server.restart(snapshot=snapshot)
    assert last_fence(server.client(), "sl:lock:{item:kettle}")  # its tombstone, older
    restored = _grant_fences(server.client(), names)
    assert min(restored) > max(before + after_backup)
    # A write under a fresh grant is accepted; one with a fence from before the
    # restore (older than the row's) is refused.
    fenced_update(_rows(item.pk), restored[0], on_hand=49)
    with pytest.raises(StaleFencingToken):
        fenced_update(_rows(item.pk), after_backup[0], on_hand=0)
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (49, restored[0])
