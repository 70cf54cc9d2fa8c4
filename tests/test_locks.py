"""stock_locks.Lock against a real redis-server, with real processes where it matters."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from stock_locks import Lock
from stock_locks.backends.redis.protocol import parse_record, token_of
from stock_locks.exceptions import LockError, LockNotOwned, LockNotReplicated, LockTimeout
from stock_locks.operations import force_release
from stock_locks.watchdog import Watchdog
from tests.support.lock_state import held, last_fence, lease_runs_out, tombstone
from tests.support.processes import event, run_in_processes, start_process
from tests.support.redis_stats import (
    CountingConnection,
    blocked_clients,
    commandstats,
    redis_ms,
)
from tests.support.waiting import TIMEOUT, renewed, wait_until

# -- grant, metadata, round trips ----------------------------------------------


def test_grant_sets_token_fence_and_holder_metadata_with_one_lease(redis_client):
    lock = Lock("order:42", ttl=20)
    before = redis_ms(redis_client)
    assert lock.acquire()
    after = redis_ms(redis_client)
    assert len(lock.token) == 32  # 128 random bits, hex
    # One key holds the holder's record: token first, then fence, count and metadata,
    # then the name's state (the last fence: the counter). The first grant of a name
    # also lists it in the index for two leases, and leaves a fence floor as long (so
    # that a lease that runs out leaves its fence behind: see test_lock_faults.py).
    assert last_fence(redis_client, "sl:lock:{order:42}") == lock.fence
    floor = int(redis_client.get("sl:lock:{order:42}:fence"))
    assert lock.fence < floor <= (after + 40_000) * 1000
    holder = parse_record(redis_client.get("sl:lock:{order:42}"))
    assert holder["token"] == lock.token
    assert holder["fence"] == str(lock.fence)
    assert holder["count"] == "1"
    assert holder["pid"].isdigit() and holder["host"] and holder["thread"] == "MainThread"
    assert holder["caller"].endswith(
        "test_grant_sets_token_fence_and_holder_metadata_with_one_lease"
    )
    assert before <= int(holder["acquired_at"]) <= after  # the Redis clock, in ms
    assert holder["ttl"] == "20000" and holder["watchdog"] == "0"
    assert 15_000 < redis_client.pttl("sl:lock:{order:42}") <= 20_000
    lock.release()
    assert not held(redis_client, "sl:lock:{order:42}")
    # Released: a tombstone keeps the fence FENCE_RETENTION (a minute) after the Redis
    # clock passed it (here the clock itself), and the released token.
    assert last_fence(redis_client, "sl:lock:{order:42}") == lock.fence
    assert 55_000 < redis_client.pttl("sl:lock:{order:42}") <= 60_000
    assert lock.token[:16] in redis_client.get("sl:lock:{order:42}").decode()


def test_uncontended_cycle_is_two_round_trips(redis_server, redis_client):
    client = redis.Redis(
        connection_pool=redis.ConnectionPool(
            host="127.0.0.1", port=redis_server.port, connection_class=CountingConnection
        )
    )
    lock = Lock("cycle", ttl=5, redis=client)
    lock.acquire()
    lock.release()  # scripts loaded
    CountingConnection.replies = 0
    redis_client.config_resetstat()
    for _ in range(10):
        lock.acquire()
        lock.release()
    assert CountingConnection.replies == 20
    stats = commandstats(redis_client)
    assert stats["cmdstat_evalsha"] == 20
    # Six server commands a cycle, those run by the scripts included: EVALSHA, TIME,
    # GET, SET (the grant); EVALSHA, SET ... GET (the release writes the tombstone and
    # reads the record it replaced).
    calls = {k: v for k, v in stats.items() if "config" not in k}
    assert calls == {
        "cmdstat_evalsha": 20, "cmdstat_time": 10, "cmdstat_get": 10, "cmdstat_set": 20,
    }  # fmt: skip


def test_a_release_after_extensions_is_still_one_write(redis_client):
    # A watchdog's renewal moves the record's index end and lease end: the release still
    # writes its tombstone with one SET ... GET, not a second write to put things right.
    lock = Lock("extended", ttl=5)
    lock.acquire()
    lock.extend(60)  # past the index entry (two leases): the record's index end moves
    assert (
        55_000
        < redis_client.zscore("sl:locks", "sl:lock:{extended}") - redis_ms(redis_client)
        <= 120_000
    )
    redis_client.config_resetstat()
    lock.release()
    calls = {k: v for k, v in commandstats(redis_client).items() if "config" not in k}
    assert calls == {"cmdstat_evalsha": 1, "cmdstat_set": 1}
    assert not held(redis_client, "sl:lock:{extended}")
    assert lock.token[:16] in redis_client.get("sl:lock:{extended}").decode()


def test_the_held_locks_index_expires_with_its_last_entry(redis_client):
    # A name released is listed until its entry ends (two leases); the index key itself
    # ends with its last entry, so names not used again go without a later grant.
    with Lock("listed:short", ttl=5):
        pass
    until = redis_client.zscore("sl:locks", "sl:lock:{listed:short}")
    left = redis_client.pttl("sl:locks")
    assert 0 < left <= 10_000 and until - redis_ms(redis_client) <= 10_000
    with Lock("listed:long", ttl=50):
        pass
    assert 90_000 < redis_client.pttl("sl:locks") <= 100_000  # the longest entry's end
    with Lock("listed:short", ttl=5):
        pass
    assert 90_000 < redis_client.pttl("sl:locks") <= 100_000  # never shortened


def test_all_keys_of_a_lock_share_one_hash_slot(redis_client):
    from redis.crc import key_slot

    from stock_locks.keys import lock_keys

    for name in ("{weird}name:}x", "}starts", "{", "}", "%7D", "a}{b", "order:42"):
        # On a cluster, the held-locks index is the one of the lock's own slot.
        assert len({key_slot(k.encode()) for k in lock_keys(name, cluster=True)}) == 1, name
        lock = Lock(name, ttl=5)  # one server: one index for all locks
        assert len({key_slot(k.encode()) for k in lock.keys if k != lock.keys.index}) == 1


def test_retried_acquire_with_the_same_token_is_granted_the_same_fence(redis_client):
    lock = Lock("retry", ttl=5)
    first = lock.do_acquire("t" * 32, 0)
    second = lock.do_acquire("t" * 32, 0)  # the reply of the first was "lost"
    assert first == second and first.granted and first.count == 1
    assert last_fence(redis_client, "sl:lock:{retry}") == first.fence


# -- ownership -------------------------------------------------------------------


def test_only_the_owner_releases(redis_client):
    owner = Lock("order:7", ttl=10)
    assert owner.acquire()
    other = Lock("order:7", ttl=10, timeout=0)
    assert not other.acquire()
    with pytest.raises(LockError):
        other.release()  # never held: refused before any round trip
    # Stage the loss of ownership: someone else's token now holds the key.
    redis_client.set("sl:lock:{order:7}", "intruder", px=10_000)
    with pytest.raises(LockNotOwned):
        owner.release()
    assert redis_client.get("sl:lock:{order:7}") == b"intruder"
    assert owner.lost


def test_extend_works_only_for_the_owner(redis_client):
    lock = Lock("ext", ttl=2)
    lock.acquire()
    lock.extend(60)
    assert 55_000 < redis_client.pttl("sl:lock:{ext}") <= 60_000
    redis_client.set("sl:lock:{ext}", "intruder", px=3_000)
    with pytest.raises(LockNotOwned):
        lock.extend(60)
    assert redis_client.pttl("sl:lock:{ext}") <= 3_000  # the intruder's lease untouched
    with pytest.raises(LockError):
        Lock("ext2").extend(5)


def test_expired_lock_is_free_to_others(redis_client):
    holder = Lock("exp", ttl=30)
    holder.acquire()
    redis_client.pexpire("sl:lock:{exp}", 1)  # the lease runs out now
    wait_until(lambda: not held(redis_client, "sl:lock:{exp}"), what="expiry")
    other = Lock("exp", ttl=30, timeout=0)
    assert other.acquire()
    assert other.fence > holder.fence
    with pytest.raises(LockNotOwned):
        holder.release()
    assert other.owned()


def test_waiter_whose_holder_died_is_granted_when_the_lease_runs_out(redis_client):
    # No release ever comes: the waiter's wait is bounded by the holder's PTTL.
    dead = Lock("dead", ttl=0.3)
    dead.acquire()
    waiter = Lock("dead", ttl=5, timeout=TIMEOUT)
    assert waiter.acquire()
    assert waiter.fence > dead.fence


def test_fences_keep_rising_when_redis_loses_its_data(redis_client):
    with Lock("survivor", ttl=5) as before:
        pass
    redis_client.flushall()  # a restart without persistence, a failover to an empty replica
    with Lock("survivor", ttl=5) as after:
        assert after.fence > before.fence
    seconds, micros = redis_client.time()
    assert after.fence <= seconds * 1_000_000 + micros  # seeded from the Redis clock


def test_fences_strictly_increase_across_grants():
    fences = []
    for _ in range(5):
        with Lock("fence-seq", ttl=5) as lock:
            fences.append(lock.fence)
    assert fences == sorted(set(fences)) and len(fences) == 5


def test_context_manager_raises_lock_timeout_when_busy():
    with Lock("busy", ttl=10), pytest.raises(LockTimeout) as info, Lock("busy", timeout=0):
        pass
    assert info.value.name == "busy"


def test_bad_arguments_are_refused_before_any_round_trip(redis_client):
    redis_client.config_resetstat()
    for bad in (dict(name="", ttl=5), dict(name="x", ttl=0), dict(name="x", ttl=-1)):
        with pytest.raises(LockError):
            Lock(bad["name"], bad["ttl"])
    with pytest.raises(LockError):
        Lock("x", timeout=-1)
    lock = Lock("x", ttl=5)
    with pytest.raises(LockError):
        lock.acquire(timeout=-2)
    assert "cmdstat_evalsha" not in commandstats(redis_client)
    lock.acquire()
    with pytest.raises(LockError):
        lock.extend(0)
    with pytest.raises(LockError):
        lock.acquire()  # already held by this non-reentrant object


# -- reentrancy ------------------------------------------------------------------


def test_reentrant_owner_counts_holds_and_only_the_last_release_frees(redis_client):
    outer = Lock("re", ttl=10, reentrant=True)
    inner = Lock("re", ttl=10, reentrant=True)  # same thread: same owner
    assert outer.acquire()
    assert inner.acquire()
    assert outer.acquire()
    assert parse_record(redis_client.get("sl:lock:{re}"))["count"] == "3"
    first_fence = outer.fence
    assert inner.fence == first_fence  # re-entry keeps the grant's fence

    def other_thread(result):
        result.append(Lock("re", ttl=10, reentrant=True, timeout=0).acquire())

    seen: list[bool] = []
    thread = threading.Thread(target=other_thread, args=(seen,))
    thread.start()
    thread.join()
    assert seen == [False]  # another thread is another owner

    inner.release()
    outer.release()
    assert parse_record(redis_client.get("sl:lock:{re}"))["count"] == "1"
    assert held(redis_client, "sl:lock:{re}")
    outer.release()
    assert not held(redis_client, "sl:lock:{re}")
    with Lock("re", ttl=10, reentrant=True) as again:
        assert again.fence > first_fence


def test_any_reentrant_lock_object_of_the_owning_thread_holds_and_releases(redis_client):
    first = Lock("re-any", ttl=30, reentrant=True)
    assert first.acquire()
    second = Lock("re-any", ttl=30, reentrant=True)  # another object, the same owner
    assert second.owned() and second.fence == first.fence and second.token == first.token
    second.release()  # releases the thread's hold, whichever object took it
    assert not held(redis_client, first.keys.lock)
    assert not first.owned()
    with pytest.raises(LockError):
        first.release()  # nothing left to release


def test_a_reentrant_hold_dropped_without_a_release_does_not_fail_the_next_acquire(
    redis_client,
):
    # A thread-pool server: one request takes a reentrant lock and drops the object
    # without releasing; an operator force-releases it. A later, unrelated request on
    # the same thread acquires the now free lock at once (it failed with LockNotOwned).
    with ThreadPoolExecutor(1) as pool:

        def leaky_request() -> int:
            lock = Lock("re-dropped", ttl=30, reentrant=True)
            assert lock.acquire()
            return lock.fence

        first_fence = pool.submit(leaky_request).result()
        assert force_release("re-dropped", redis=redis_client)

        def later_request() -> tuple[bool, int | None]:
            lock = Lock("re-dropped", ttl=30, reentrant=True, timeout=0)
            granted = lock.acquire()
            fence = lock.fence
            lock.release()
            return granted, fence

        granted, fence = pool.submit(later_request).result()
    assert granted and fence is not None and fence > first_fence
    assert not held(redis_client, "sl:lock:{re-dropped}")


# -- wake-up on release ------------------------------------------------------------


def _hold_until(name: str, acquired, release) -> None:
    with Lock(name, ttl=300):
        acquired.set()
        release.wait(TIMEOUT)


def _wait_behind_a_holder(
    name: str, waiter: Lock, redis_client, while_blocked: Callable[[], Any] = lambda: None
) -> list[bool]:
    """A holder of ``name`` in another process (a 300 s lease); ``waiter.acquire()`` in a
    thread until it sleeps in BLPOP; ``while_blocked()``; the holder's release; what the
    acquire returned, once both ended."""
    acquired, release = event(), event()
    holder = start_process(_hold_until, name, acquired, release)
    assert acquired.wait(TIMEOUT)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(waiter.acquire()))
    thread.start()
    wait_until(lambda: blocked_clients(redis_client) == 1, what="waiter blocked in BLPOP")
    while_blocked()
    release.set()
    thread.join(TIMEOUT)
    holder.join(TIMEOUT)
    return result


def test_waiter_is_woken_by_the_release_not_by_the_lease(redis_client):
    evalsha: list[int] = []
    result = _wait_behind_a_holder(
        "handoff",
        Lock("handoff", ttl=5, timeout=TIMEOUT),
        redis_client,
        # The waiter sleeps inside BLPOP (it is not polling)...
        lambda: evalsha.append(commandstats(redis_client)["cmdstat_evalsha"]),
    )
    # ...and was granted although the holder's lease (300 s) is far longer than
    # its own timeout: only the release can have woken it.
    assert result == [True]
    # One refused try before blocking, then: the holder's release and its grant.
    assert commandstats(redis_client)["cmdstat_evalsha"] == evalsha[0] + 2


class SendCounting(redis.Connection):
    """A real connection that counts the requests it sends (a pipeline: one)."""

    sent = 0

    def send_packed_command(self, command, check_health=True):
        SendCounting.sent += 1
        return super().send_packed_command(command, check_health)


def test_a_woken_waiter_is_granted_without_a_round_trip_of_its_own(redis_server, redis_client):
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=redis_server.port, connection_class=SendCounting
    )
    waiter = Lock("piggyback", ttl=5, timeout=TIMEOUT, redis=redis.Redis(connection_pool=pool))
    sent: list[int] = []
    result = _wait_behind_a_holder(
        "piggyback", waiter, redis_client, lambda: sent.append(SendCounting.sent)
    )
    # Its next try left with its BLPOP: the server ran it at the wake-up.
    assert SendCounting.sent == sent[0]
    assert result == [True] and waiter.owned()
    waiter.release()


def test_a_waiter_whose_try_finds_the_scripts_gone_tries_again_with_their_source(
    redis_client,
):
    result = _wait_behind_a_holder(
        "flushed",
        Lock("flushed", ttl=5, timeout=TIMEOUT),
        redis_client,
        redis_client.script_flush,  # (the try behind its BLPOP will answer NOSCRIPT)
    )
    assert result == [True]


def test_a_queue_of_waiters_is_woken_release_by_release(redis_server, redis_client):
    # Every lease is far longer than the test's timeout and the socket never times
    # out, so each waiter can only be granted if the previous holder's release woke it.
    client = redis.Redis(port=redis_server.port, socket_timeout=None)
    holder = Lock("queue", ttl=300, redis=client)
    holder.acquire()
    granted: list[bool] = []

    def wait_then_pass_on() -> None:
        lock = Lock("queue", ttl=300, timeout=TIMEOUT, redis=client)
        granted.append(lock.acquire())
        if granted[-1]:
            lock.release()

    waiters = [threading.Thread(target=wait_then_pass_on) for _ in range(4)]
    for waiter in waiters:
        waiter.start()
    wait_until(lambda: blocked_clients(redis_client) == 4, what="4 waiters blocked")
    holder.release()
    for waiter in waiters:
        waiter.join(TIMEOUT + 5)
    assert granted == [True] * 4


def _increment_under_lock(index: int, rounds: int) -> list[tuple[int, int]]:
    from stock_locks.backends.redis import get_redis

    client = get_redis()
    seen = []
    for _ in range(rounds):
        with Lock("counter", ttl=10, timeout=TIMEOUT) as lock:
            value = int(client.get("counter") or 0)  # a non-atomic read-modify-write
            client.set("counter", value + 1)
            seen.append((value, lock.fence))
    return seen


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_mutual_exclusion_across_8_processes(redis_client):
    per_process = run_in_processes(_increment_under_lock, 8, 200)
    assert int(redis_client.get("counter")) == 1600
    sections = sorted(s for seen in per_process for s in seen)
    # Every value was read exactly once: no two sections overlapped...
    assert [value for value, _ in sections] == list(range(1600))
    # ...and fences strictly increase in the order the sections ran.
    fences = [fence for _, fence in sections]
    assert all(a < b for a, b in zip(fences, fences[1:], strict=False))


# -- watchdog ------------------------------------------------------------------------


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == Watchdog.THREAD_NAME]


def hold_for(locks: list[Lock], periods: float, redis_client) -> None:
    """Keep checking every lock is still owned until ``periods`` leases have passed."""
    import time

    end = time.monotonic() + periods * locks[0].ttl
    while time.monotonic() < end:
        for lock in locks:
            assert lock.owned(), f"{lock} lost its lease"
            assert redis_client.pttl(lock.keys.lock) > 0
        time.sleep(locks[0].ttl / 10)


def test_watchdog_keeps_a_lock_alive_past_its_ttl_and_stops_at_release(redis_client):
    lock = Lock("wd", ttl=1.0, watchdog=True)
    lock.acquire()
    hold_for([lock], 3, redis_client)
    lock.release()
    assert not held(redis_client, "sl:lock:{wd}")
    # Watch another watchdog lock get renewed twice; the released one stays gone.
    probe = Lock("wd-probe", ttl=1.0, watchdog=True)
    probe.acquire()
    for _ in range(2):
        renewed(lambda: redis_client.pttl(probe.keys.lock), "the probe's lease")
    assert not held(redis_client, "sl:lock:{wd}")
    probe.release()
    assert not lock.lost


def test_watchdog_marks_a_lost_lease_and_logs_a_warning(redis_client, caplog):
    lock = Lock("wd-lost", ttl=0.3, watchdog=True)
    lock.acquire()
    redis_client.set("sl:lock:{wd-lost}", "intruder")  # token overwritten behind its back
    with caplog.at_level(logging.WARNING, logger="stock_locks.lock.renewal"):
        wait_until(lambda: lock.lost, what="lost flag")
    assert "lost" in caplog.text and "wd-lost" in caplog.text
    assert redis_client.get("sl:lock:{wd-lost}") == b"intruder"
    assert redis_client.ttl("sl:lock:{wd-lost}") == -1  # the intruder's key was not extended
    with pytest.raises(LockNotOwned):
        lock.release()


def test_fifty_watchdog_locks_share_one_renewal_thread(redis_client):
    locks = [Lock(f"many:{i}", ttl=1.0, watchdog=True) for i in range(50)]
    for lock in locks:
        lock.acquire()
    hold_for(locks, 3, redis_client)
    assert len(watchdog_threads()) == 1
    for lock in locks:
        lock.release()
    assert not any(lock.lost for lock in locks)


def _child_holds_watchdog_lock(results) -> None:
    lock = Lock("wd-fork", ttl=0.6, watchdog=True)
    lock.acquire()
    import time

    end = time.monotonic() + 2.0
    owned = True
    while time.monotonic() < end:
        owned = owned and lock.owned()
        time.sleep(0.05)
    threads = [t.ident for t in watchdog_threads()]
    lock.release()
    results.put((owned, threads))


def test_watchdog_survives_fork_child_starts_its_own_thread(redis_client):
    parent_lock = Lock("wd-parent", ttl=1.0, watchdog=True)
    parent_lock.acquire()
    parent_threads = [t.ident for t in watchdog_threads()]
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_child_holds_watchdog_lock, args=(results,))
    child.start()
    owned, child_threads = results.get(timeout=TIMEOUT)
    child.join(TIMEOUT)
    assert owned, "the child's watchdog did not renew its lock"
    assert len(child_threads) == 1 and len(parent_threads) == 1
    assert parent_lock.owned()  # the parent's lock is still renewed by the parent
    parent_lock.release()


# -- replica confirmation -------------------------------------------------------------


def test_replica_check_undoes_a_grant_no_replica_confirms(redis_client):
    with override_settings(STOCK_LOCKS={"REPLICAS": 1, "REPLICA_TIMEOUT": 0.05}):
        lock = Lock("repl", ttl=10)
        with pytest.raises(LockNotReplicated) as info:
            lock.acquire()
    assert info.value.required == 1 and info.value.confirmed == 0
    assert not held(redis_client, "sl:lock:{repl}")


def test_replica_check_passes_with_a_live_replica(redis_factory, use_redis):
    primary = redis_factory("--repl-diskless-sync-delay", "0")
    replica = redis_factory("--replicaof", "127.0.0.1", str(primary.port))
    wait_until(
        lambda: replica.client().info("replication")["master_link_status"] == "up",
        what="replica link",
    )
    use_redis(primary)
    with (
        override_settings(STOCK_LOCKS={"REPLICAS": 1, "REPLICA_TIMEOUT": 5}),
        Lock("repl", ttl=10) as lock,
    ):
        assert token_of(replica.client().get("sl:lock:{repl}")) == lock.token


def test_a_wait_longer_than_the_socket_timeout_is_sliced_not_failed(redis_server):
    # redis-py would raise TimeoutError if one BLPOP outlived the socket timeout.
    client = redis.Redis(port=redis_server.port, socket_timeout=0.3)
    Lock("slow", ttl=30, redis=client).acquire()
    waiter = Lock("slow", ttl=30, timeout=1.0, redis=client)
    assert waiter.acquire() is False


# -- wait_for_signal: a client-side deadline on BLPOP ------------------------------


def test_wait_for_signal_pops_a_pushed_signal(redis_client):
    from stock_locks.backends.redis.wakeup import wait_for_signal

    redis_client.rpush("sig", 1)
    assert wait_for_signal(redis_client, "sig", 5) is True
    assert not redis_client.exists("sig")


def test_wait_for_signal_is_woken_by_a_push_from_another_client(redis_server, redis_client):
    from stock_locks.backends.redis.wakeup import wait_for_signal

    client = redis.Redis(port=redis_server.port, socket_timeout=None)
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(wait_for_signal(client, "sig", TIMEOUT)))
    waiter.start()
    wait_until(lambda: blocked_clients(redis_client) == 1, what="waiter blocked in BLPOP")
    redis_client.rpush("sig", 1)
    waiter.join(TIMEOUT)
    assert woken == [True]


def test_wait_for_signal_gives_up_client_side_and_leaves_no_blpop_behind(
    redis_server, redis_client
):
    from stock_locks.backends.redis.wakeup import wait_for_signal

    client = redis.Redis(port=redis_server.port)
    # The server-side BLPOP timeout is beyond the wait: only the client's
    # deadline can have ended it, by dropping the connection.
    assert wait_for_signal(client, "sig", 0.05) is False
    wait_until(lambda: blocked_clients(redis_client) == 0, what="server freed the BLPOP")
    redis_client.rpush("sig", 1)  # a later signal is not eaten by the abandoned BLPOP
    assert redis_client.llen("sig") == 1
    assert client.ping()  # the pool hands out a working connection again
    assert wait_for_signal(client, "sig", 1) is True


def test_wait_for_signal_longer_than_the_socket_timeout(redis_server, redis_client):
    from stock_locks.backends.redis.wakeup import wait_for_signal

    client = redis.Redis(port=redis_server.port, socket_timeout=0.1)
    assert wait_for_signal(client, "sig", 0.3) is False  # no TimeoutError from redis-py


# -- re-entry, shared objects, repeated releases, fences, arguments ---------------------


def test_reentry_after_the_lease_ended_raises_and_grants_nothing(redis_client):
    lock = Lock("re-lost", ttl=30, reentrant=True)
    lock.acquire()
    first_fence = lock.fence
    redis_client.pexpire(lock.keys.lock, 1)  # the lease ends now
    wait_until(lambda: not held(redis_client, lock.keys.lock), what="lease end")
    with pytest.raises(LockNotOwned):
        lock.acquire()
    assert not redis_client.exists(lock.keys.lock)  # no fresh lease
    # (the lease that ran out left its fence behind: the floor the grant wrote)
    assert int(redis_client.get(lock.keys.fence)) > first_fence
    assert lock.fence == first_fence and lock.lost
    with pytest.raises(LockNotOwned):
        lock.release()
    # Taken over by someone else meanwhile: re-entry refused too, their hold untouched.
    owner = Lock("re-lost2", ttl=30, reentrant=True)
    owner.acquire()
    redis_client.set(owner.keys.lock, "intruder", px=30_000)
    with pytest.raises(LockNotOwned):
        owner.acquire()
    assert redis_client.get(owner.keys.lock) == b"intruder"
    # Once the intruder is gone, the thread takes the lock afresh: one hold, one release.
    redis_client.delete(owner.keys.lock)
    assert owner.acquire() and owner.fence > first_fence
    owner.release()
    assert not held(redis_client, owner.keys.lock)
    with pytest.raises(LockError):
        owner.release()  # nothing left over from the lost hold


def test_a_reentrant_lock_shared_by_threads_keeps_each_threads_hold_apart(redis_client):
    shared = Lock("shared", ttl=30, reentrant=True, timeout=TIMEOUT)
    seen: dict[str, object] = {}
    a_granted, a_lost, b_granted, a_checked = (threading.Event() for _ in range(4))

    def thread_a():
        shared.acquire()
        seen["a_fence"] = shared.fence
        a_granted.set()
        a_lost.wait(TIMEOUT)
        b_granted.wait(TIMEOUT)
        seen["a_owned"] = shared.owned()
        seen["a_fence_after"] = shared.fence
        try:
            shared.release()
        except LockNotOwned:
            seen["a_release"] = "LockNotOwned"
        a_checked.set()

    def thread_b():
        a_lost.wait(TIMEOUT)
        seen["b_granted"] = shared.acquire(timeout=0)  # another thread: another owner
        seen["b_fence"] = shared.fence
        b_granted.set()
        a_checked.wait(TIMEOUT)
        seen["b_owned"] = shared.owned()
        shared.release()

    def thread_c():
        try:
            shared.release()  # holds nothing: may not release another thread's hold
        except LockError as exc:
            seen["c_release"] = type(exc).__name__

    threads = [threading.Thread(target=f) for f in (thread_a, thread_b)]
    for thread in threads:
        thread.start()
    assert a_granted.wait(TIMEOUT)
    third = threading.Thread(target=thread_c)
    third.start()
    third.join(TIMEOUT)
    assert held(redis_client, shared.keys.lock)  # C's release did not free A's hold
    redis_client.pexpire(shared.keys.lock, 1)  # A's lease ends
    wait_until(lambda: not held(redis_client, shared.keys.lock), what="A's lease end")
    a_lost.set()
    for thread in threads:
        thread.join(TIMEOUT)
    assert seen["c_release"] == "LockError"
    assert seen["b_granted"] is True and seen["b_fence"] > seen["a_fence"]
    assert seen["a_owned"] is False and seen["a_fence_after"] == seen["a_fence"]
    assert seen["a_release"] == "LockNotOwned"
    assert seen["b_owned"] is True
    assert not held(redis_client, shared.keys.lock)


def test_a_repeated_release_reports_success_a_lapsed_lease_does_not(redis_client):
    from stock_locks.backends.base import ReleaseOutcome

    NOT_OWNED, RELEASED = ReleaseOutcome.NOT_OWNED, ReleaseOutcome.RELEASED

    lock = Lock("again", ttl=30)
    lock.acquire()
    token = lock.token
    assert lock.do_release(token, 1) == RELEASED
    assert lock.do_release(token, 1) == RELEASED  # the first reply was "lost"
    with Lock("again", ttl=30, timeout=0):  # another holder took it meanwhile
        assert lock.do_release(token, 1) == RELEASED  # still recognised as ours, done
        assert held(redis_client, lock.keys.lock)  # and theirs untouched
    lapsed = Lock("again", ttl=30)
    lapsed.acquire()
    redis_client.pexpire(lapsed.keys.lock, 1)
    wait_until(lambda: not held(redis_client, lapsed.keys.lock), what="lease end")
    assert lapsed.do_release(lapsed.token, 1) == NOT_OWNED
    with Lock("again", ttl=30, timeout=0), pytest.raises(LockNotOwned):
        lapsed.release()


def test_a_release_after_the_lock_changed_hands_puts_the_new_record_back(redis_client):
    # The release writes its tombstone first and reads what it replaced: when that is
    # another holder's record (this lease ran out and it was taken), it is put back
    # as it was, expiry included, and the release is told it no longer holds the lock.
    lock = Lock("handed", ttl=30)
    lock.acquire()
    redis_client.pexpire(lock.keys.lock, 1)  # the lease runs out
    wait_until(lambda: not held(redis_client, lock.keys.lock), what="lease end")
    other = Lock("handed", ttl=20, timeout=0)
    assert other.acquire()
    record, lease_left = redis_client.get(lock.keys.lock), redis_client.pttl(lock.keys.lock)
    with pytest.raises(LockNotOwned):
        lock.release()
    assert redis_client.get(lock.keys.lock) == record
    assert lease_left - 1_000 < redis_client.pttl(lock.keys.lock) <= lease_left
    other.release()
    assert not held(redis_client, lock.keys.lock)
    # A tombstone found there is put back too, and nothing is freed twice.
    tomb = redis_client.get(lock.keys.lock)
    lock.acquire()
    token = lock.token
    redis_client.set(lock.keys.lock, tomb, px=60_000)  # as if force-released unseen
    with pytest.raises(LockNotOwned):
        lock.release()
    assert redis_client.get(lock.keys.lock) == tomb
    assert token[:16] not in tomb.decode()


def test_a_release_that_finds_a_value_it_did_not_write_puts_it_back_unshortened(redis_client):
    # The release writes its tombstone first (SET ... GET). A value found there with no
    # lease end (another program's, an older version's record) goes back without an
    # expiry rather than a shorter one: another token could be granted while it holds.
    lock = Lock("foreign", ttl=30)
    assert lock.acquire(timeout=0)
    redis_client.set(lock.keys.lock, "intruder", px=300_000)
    with pytest.raises(LockNotOwned):
        lock.release()
    assert redis_client.get(lock.keys.lock) == b"intruder"
    left = redis_client.pttl(lock.keys.lock)
    assert left == -1 or left > 290_000
    # (Its own expiry cannot be known there: docs/operations.md has an operator free it.)
    assert force_release("foreign").token == "intruder"
    assert not held(redis_client, lock.keys.lock)


def test_a_release_that_finds_a_tombstone_puts_it_back_as_long_as_it_lasted(redis_client):
    # A tombstone found there (a force release unseen) whose last fence is ahead of the
    # clock goes back kept until the clock passed that fence, not a bare retention.
    lock = Lock("found:tomb", ttl=30)
    assert lock.acquire(timeout=0)
    seconds, micros = redis_client.time()
    ahead = seconds * 1_000_000 + micros + 10**12  # 10**9 ms ahead
    redis_client.set(lock.keys.lock, tombstone(ahead), px=10**9 + 60_000)
    with pytest.raises(LockNotOwned):
        lock.release()
    assert last_fence(redis_client, lock.keys.lock) == ahead
    assert 10**9 < redis_client.pttl(lock.keys.lock) <= 10**9 + 60_000


def test_a_release_remembering_one_token_keeps_one(redis_client, monkeypatch):
    from stock_locks.backends.redis import protocol

    monkeypatch.setattr(protocol, "RELEASED_KEPT", 1)
    tokens = []
    for _ in range(3):
        with Lock("kept:one", ttl=30) as lock:
            tokens.append(lock.token)
    assert redis_client.get(lock.keys.lock).decode().split("\n")[3] == tokens[-1][:16]


def test_a_late_copy_of_a_given_up_acquire_is_refused(redis_client):
    lock = Lock("late", ttl=30)
    lock.do_release(
        "t" * 32, 1, "abandon"
    )  # the caller gave up on a try whose request is still on its way
    with pytest.raises(LockError):
        lock.do_acquire("t" * 32, 0)  # ...and it lands now: nothing granted
    assert not held(redis_client, lock.keys.lock)


def test_a_granted_try_given_up_stays_refused_after_a_later_lease_ran_out(redis_client):
    # The try was granted but its reply was lost, and its caller gave up: the give-back
    # finds the token's own record. A later holder's lease then runs out without a
    # release (the lock key, and the released tokens it carried, gone) before the late
    # copy of the try lands: it must still be refused (kept apart, :given_back).
    lock = Lock("late:own", ttl=30)
    assert lock.do_acquire("t" * 32, 0).granted  # the reply "lost"
    lock.do_release("t" * 32, 1, "abandon")
    assert not held(redis_client, lock.keys.lock)
    other = Lock("late:own", ttl=30)
    assert other.acquire(timeout=0)
    lease_runs_out(redis_client, other.keys.lock)
    with pytest.raises(LockError):
        lock.do_acquire("t" * 32, 0)  # the late copy lands: nothing granted
    assert not held(redis_client, lock.keys.lock)


@pytest.mark.parametrize("while_", ["another holds", "the lock is free"])
def test_every_try_given_up_within_the_retention_stays_refused(while_, redis_client):
    # More tries given up than the lock key keeps released tokens (RELEASED_KEPT), all
    # within FENCE_RETENTION: the first of them is refused as the last is, also once the
    # lock key is gone (a lease that ran out).
    from stock_locks.backends.redis.protocol import RELEASED_KEPT

    holder = Lock("late:more", ttl=30)
    assert holder.acquire(timeout=0)
    if while_ == "the lock is free":
        holder.release()
    tokens = [f"{i:x}" * 32 for i in range(RELEASED_KEPT + 2)]
    for token in tokens:
        holder.do_release(token[:32], 1, "abandon")
    if while_ == "another holds":
        lease_runs_out(redis_client, holder.keys.lock)
    else:
        for token in (tokens[0], tokens[-1]):
            with pytest.raises(LockError):
                holder.do_acquire(token[:32], 0)  # a late copy lands: nothing granted
        redis_client.delete(holder.keys.lock)  # (as if its tombstone had expired)
    for token in (tokens[0], tokens[-1]):
        with pytest.raises(LockError):
            holder.do_acquire(token[:32], 0)
    assert not held(redis_client, holder.keys.lock)


def test_given_back_tries_are_dropped_once_their_retention_passed(redis_client):
    # :given_back is bounded by time: each write drops the entries whose time passed.
    lock = Lock("late:pruned", ttl=30)
    key = lock.keys.given_back
    lock.do_release("b" * 32, 1, "abandon")  # kept a minute (and the key with it)
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "FENCE_RETENTION": 0.05}):
        lock.do_release("a" * 32, 1, "abandon")  # kept 50 ms (the key still a minute)
    until = redis_client.zscore(key, "a" * 16)

    def redis_clock_passed() -> bool:
        seconds, micros = redis_client.time()
        return seconds * 1000 + micros // 1000 > until

    wait_until(redis_clock_passed, what="the first give-back's retention passed")
    lock.do_release("c" * 32, 1, "abandon")
    assert sorted(redis_client.zrange(key, 0, -1)) == [b"b" * 16, b"c" * 16]
    assert 55_000 < redis_client.pttl(key) <= 60_000


def test_a_give_back_under_a_shorter_retention_keeps_the_later_mark(redis_client):
    # Two tries given up beside a holder, the second under a shorter FENCE_RETENTION:
    # the lock key's mark (read :given_back until then) must stay the first's, the later
    # one. Once the second's time has passed and releases trimmed the first from the
    # key's list, its late copy must still be refused.
    from stock_locks.backends.redis.protocol import RELEASED_KEPT

    holder = Lock("late:shorter", ttl=30)
    assert holder.acquire(timeout=0)
    holder.do_release("a" * 32, 1, "abandon")  # kept a FENCE_RETENTION (a minute)
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "FENCE_RETENTION": 0.05}):
        holder.do_release("b" * 32, 1, "abandon")  # kept 50 ms
    until = redis_client.zscore(holder.keys.given_back, "b" * 16)
    holder.release()
    for _ in range(RELEASED_KEPT):
        with Lock("late:shorter", ttl=30):
            pass

    def redis_clock_passed() -> bool:
        seconds, micros = redis_client.time()
        return seconds * 1000 + micros // 1000 > until

    wait_until(redis_clock_passed, what="the second give-back's retention passed")
    with pytest.raises(LockError):
        holder.do_acquire("a" * 32, 0)  # the late copy of the first lands: nothing granted
    assert not held(redis_client, holder.keys.lock)


@pytest.mark.parametrize("then", ["released", "re-granted, then released"])
def test_a_try_given_up_beside_a_value_without_holder_fields_stays_refused(then, redis_client):
    # The lock key holds a bare token (another program's value): a give-back beside it
    # is kept in :given_back only (the value is not rewritten). When that token is then
    # released (or granted again to it and released), the tombstone must still read
    # :given_back: a late copy of the given-up try is refused.
    lock = Lock("late:bare", ttl=30)
    bare = "e" * 32
    redis_client.set(lock.keys.lock, bare, px=30_000)
    assert lock.do_release("t" * 32, 1, "abandon") == 0
    if then != "released":
        assert lock.do_acquire(bare, 0).granted  # its token's repeated try: its record now
    assert lock.do_release(bare, 1) == 1
    with pytest.raises(LockError):
        lock.do_acquire("t" * 32, 0)  # the late copy lands: nothing granted
    assert not held(redis_client, lock.keys.lock)


def test_a_try_given_up_stays_refused_when_one_released_token_is_kept(redis_client, monkeypatch):
    # With one released token kept, a release keeps its own: the give-backs' mark (read
    # :given_back until then) must stay beside it, not be trimmed away with the rest.
    from stock_locks.backends.redis import protocol

    monkeypatch.setattr(protocol, "RELEASED_KEPT", 1)
    lock = Lock("late:one", ttl=30)
    lock.do_release("t" * 32, 1, "abandon")
    for _ in range(2):
        with Lock("late:one", ttl=30):
            pass
    with pytest.raises(LockError):
        lock.do_acquire("t" * 32, 0)  # the late copy lands: nothing granted
    assert not held(redis_client, lock.keys.lock)


def test_a_release_that_puts_back_a_value_without_expiry_logs_a_warning(redis_client, caplog):
    # The holder's lease ran out and another program wrote the key (no lease end in it):
    # the write-first release replaced it, puts it back without an expiry (its own is
    # unknown), and warns an operator that force_release frees it if it stays.
    lock = Lock("put:back", ttl=30)
    assert lock.acquire(timeout=0)
    redis_client.set(lock.keys.lock, "f" * 32, px=30_000)  # (as if after the lease end)
    with (
        caplog.at_level(logging.WARNING, logger="stock_locks.lock.release"),
        pytest.raises(LockNotOwned),
    ):
        lock.release()
    assert redis_client.get(lock.keys.lock) == b"f" * 32
    assert redis_client.pttl(lock.keys.lock) == -1
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "put:back" in warned[0].getMessage() and "force_release" in warned[0].getMessage()


def test_a_force_released_holder_is_told_it_lost_the_lock(redis_client):
    from stock_locks.dashboard.actions import force_release_lock

    lock = Lock("forced", ttl=30)
    lock.acquire()
    assert force_release_lock("forced", lock.token).done
    with pytest.raises(LockNotOwned):
        lock.release()


def test_fences_never_fall_below_the_redis_clock_when_the_counter_is_behind(redis_client):
    key = "sl:lock:{behind}"
    with Lock("behind", ttl=5) as first:
        pass
    redis_client.set(key, tombstone(5), px=60_000)  # a restore from an old snapshot
    with Lock("behind", ttl=5) as after:
        seconds, micros = redis_client.time()
        assert first.fence < after.fence <= seconds * 1_000_000 + micros
    redis_client.set(key, tombstone(after.fence + 10**12), px=60_000)  # ahead of the clock
    with Lock("behind", ttl=5) as ahead:
        assert ahead.fence == after.fence + 10**12 + 1
        # A fence ahead of the clock is also kept apart, in case the lease runs out:
        # until the clock has passed it (10**12 us: 10**9 ms ahead), and a minute more.
        assert 10**9 < redis_client.pttl(f"{key}:fence") <= 10**9 + 60_000
    # ...and so is the tombstone its release leaves.
    assert last_fence(redis_client, key) == ahead.fence
    assert 10**9 < redis_client.pttl(key) <= 10**9 + 60_000
    redis_client.delete(key)  # as if the lease had run out: the counter kept apart counts
    with Lock("behind", ttl=5) as later:
        assert later.fence == ahead.fence + 1


def test_a_fence_ahead_of_the_clock_does_not_lower_the_floor_of_the_index_entry(redis_client):
    # The index entry written by an earlier grant keeps a floor (its end, in us) beside the
    # lock key; a grant whose fence is ahead of the clock (the clock stepped back under
    # that entry) writes its fence there too, and must not write it lower than the floor:
    # the next step back after a lapsed lease would otherwise give a lower fence.
    key = "sl:lock:{floor}"
    seconds, micros = redis_client.time()
    now_ms = seconds * 1000 + micros // 1000
    indexed = now_ms + 3_600_000  # the index entry (and its floor) runs an hour more
    last = seconds * 1_000_000 + micros + 10**6  # the last fence, a second ahead
    redis_client.set(key, f"\n{last}\n{indexed}\n", px=60_000)
    with Lock("floor", ttl=5) as lock:
        assert lock.fence == last + 1
        assert int(redis_client.get(f"{key}:fence")) == indexed * 1000
        assert 3_600_000 < redis_client.pttl(f"{key}:fence") <= 3_600_000 + 60_000


def test_the_fence_counter_is_kept_a_minute_after_the_clock_passed_it_not_a_day(redis_client):
    fences = []
    for _ in range(200):
        with Lock("order:77", ttl=5) as lock:
            fences.append(lock.fence)
    assert fences == sorted(set(fences))
    # Each grant's fence is the Redis clock: the tombstone that carries it is kept
    # FENCE_RETENTION, a minute, and the floor written apart with the index entry (for
    # two leases) is kept until the clock passed it, and a minute more.
    assert 55_000 < redis_client.pttl("sl:lock:{order:77}") <= 60_000
    assert int(redis_client.get("sl:lock:{order:77}:fence")) > fences[-1]
    assert 55_000 < redis_client.pttl("sl:lock:{order:77}:fence") <= 70_000
    # While held, the record carries it, for the lease.
    with Lock("order:77", ttl=300):
        assert 295_000 < redis_client.pttl("sl:lock:{order:77}") <= 300_000


def test_a_grant_after_the_fence_counter_expired_still_gets_a_higher_fence(redis_client):
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "FENCE_RETENTION": 0.05}):
        with Lock("order:78", ttl=0.1) as first:
            pass
        # The tombstone expires 50 ms after the clock passed the fence.
        assert 0 < redis_client.pttl("sl:lock:{order:78}") <= 50
        wait_until(
            lambda: not redis_client.exists("sl:lock:{order:78}"),
            what="the tombstone expired",
        )
        with Lock("order:78", ttl=0.1) as after:
            assert after.fence > first.fence  # the Redis clock alone: above every earlier one
        assert last_fence(redis_client, "sl:lock:{order:78}") == after.fence


@pytest.mark.parametrize(
    "bad",
    [
        dict(ttl="5"), dict(ttl=float("nan")), dict(ttl=float("inf")), dict(ttl=True),
        dict(timeout="5"), dict(timeout=float("nan")), dict(timeout=-1), dict(timeout=True),
        dict(blocking="yes"), dict(reentrant=1), dict(watchdog=None),
    ],
)  # fmt: skip
def test_bad_constructor_arguments_raise_lock_error(redis_client, bad):
    with pytest.raises(LockError):
        Lock("args", **bad)


def test_bad_call_arguments_raise_lock_error_before_any_round_trip(redis_client):
    lock = Lock("args", ttl=5)
    redis_client.config_resetstat()
    for timeout in ("5", float("nan"), -0.5, True):
        with pytest.raises(LockError):
            lock.acquire(timeout=timeout)
    with pytest.raises(LockError):
        lock.acquire(blocking="no")
    assert "cmdstat_evalsha" not in commandstats(redis_client)
    lock.acquire()
    for seconds in ("5", float("nan"), float("inf"), 0, True):
        with pytest.raises(LockError):
            lock.extend(seconds)
    lock.release()
    for name in ("", None, 42):
        with pytest.raises(LockError):
            Lock(name)


# -- hostile names on a real Redis Cluster ------------------------------------------------


HOSTILE = ["}starts", "{a}b", "x}", "{", "}", "%7D", "100%", "a{b}c}"]


def test_hostile_names_keep_every_key_of_a_lock_semaphore_and_queue_in_one_slot(
    cluster_client,
):
    from stock_locks.keys import delay_queue_keys, lock_keys, semaphore_keys, unescape_name

    node = cluster_client.get_default_node()
    for name in HOSTILE:
        for keys in (
            lock_keys(name, cluster=True),
            semaphore_keys(name),
            delay_queue_keys(name),
        ):
            slots = {
                cluster_client.execute_command("CLUSTER KEYSLOT", key, target_nodes=node)
                for key in keys
            }
            assert len(slots) == 1, (name, keys)
        base = lock_keys(name).lock
        assert unescape_name(base[len("sl:lock:{") : -1]) == name


def test_locks_with_hostile_names_run_on_a_cluster(cluster_client):
    for name in HOSTILE:
        lock = Lock(name, ttl=30, redis=cluster_client)
        assert lock.acquire()  # (CROSSSLOT here when a name breaks the hash tag)
        assert not Lock(name, ttl=30, redis=cluster_client, timeout=0.01).acquire()
        lock.extend(60)
        lock.release()
        with pytest.raises(LockError):
            lock.release()
    reentrant = Lock("}re", ttl=30, redis=cluster_client, reentrant=True)
    with reentrant, reentrant:
        assert reentrant.owned()
