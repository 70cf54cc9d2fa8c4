"""RedLock over three real masters: majority grants, agreed fences, give-back of
minority grants. (Lock behaviour shared with every backend: tests/contract; masters
killed, emptied or stalled: tests/faults/test_redlock_faults.py.)"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from stock_locks import Lock, RedLock, Semaphore
from stock_locks.backends import get_backend
from stock_locks.backends.redis.protocol import parse_record, token_of
from stock_locks.exceptions import LockError
from stock_locks.keys import lock_keys
from tests.support.waiting import wait_until


def _on_every_master(servers, key: str) -> list:
    return [server.client().get(key) for server in servers]


def test_a_grant_holds_the_same_token_on_every_master_with_one_agreed_fence(redlock):
    lock = RedLock("order:1", ttl=30)
    assert lock.acquire()
    keys = lock_keys("order:1")
    records = _on_every_master(redlock, keys.lock)
    assert [token_of(record) for record in records] == [lock.token] * 3
    # Each master's record of the holder carries the agreed fence.
    assert {parse_record(record)["fence"] for record in records} == {str(lock.fence)}
    assert _on_every_master(redlock, keys.fence) == [str(lock.fence).encode()] * 3
    info = lock.info()
    assert info is not None and info.token == lock.token and info.fence == lock.fence
    assert info.backend == "redlock" and info.host and info.pid
    lock.release()
    assert [token_of(record) for record in _on_every_master(redlock, keys.lock)] == [None] * 3


def test_fences_rise_with_every_grant_even_when_the_masters_disagreed(redlock):
    keys = lock_keys("order:2")
    fences = []
    for round_ in range(3):
        # One master's counter runs ahead (it alone saw grants the others missed).
        redlock[round_].client().set(keys.fence, 4 * 10**15 + round_ * 1000)
        with RedLock("order:2", ttl=30) as lock:
            fences.append(lock.fence)
        # The grant's fence was stored on a majority before it counted.
        stored = [int(v) for v in _on_every_master(redlock, keys.fence)]
        assert sum(value >= lock.fence for value in stored) >= 2
    assert fences == sorted(fences) and len(set(fences)) == 3
    assert fences[0] == 4 * 10**15 + 1  # (the ahead counter wins; Lua numbers are exact to 2**53)


def test_each_master_keeps_its_fence_counter_until_its_clock_passed_the_fence(redlock):
    keys = lock_keys("order:5")
    with RedLock("order:5", ttl=30):
        pass
    # The masters proposed their clocks: each keeps the counter FENCE_RETENTION (a minute).
    assert all(55_000 < server.client().pttl(keys.fence) <= 60_000 for server in redlock)
    # One master's counter runs 10**12 us (10**9 ms) ahead of the clocks: the grant's
    # fence is stored on every master, each keeping it until its own clock passes it.
    seconds, micros = redlock[0].client().time()
    ahead = seconds * 1_000_000 + micros + 10**12
    redlock[0].client().set(keys.fence, ahead)
    with RedLock("order:5", ttl=30) as lock:
        assert lock.fence == ahead + 1
    assert _on_every_master(redlock, keys.fence) == [str(ahead + 1).encode()] * 3
    assert all(10**9 < server.client().pttl(keys.fence) <= 10**9 + 60_000 for server in redlock)


def test_a_grant_after_every_fence_counter_expired_still_gets_a_higher_fence(redlock):
    keys = lock_keys("order:6")
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "FENCE_RETENTION": 0.05}):
        with RedLock("order:6", ttl=0.2) as first:
            pass
        wait_until(
            lambda: _on_every_master(redlock, keys.fence) == [None] * 3,
            what="the fence counters expired",
        )
        with RedLock("order:6", ttl=0.2) as after:
            assert after.fence > first.fence  # the masters' clocks: above every earlier fence


def test_a_minority_grant_is_given_back_on_every_master(redlock):
    keys = lock_keys("order:3")
    for server in redlock[:2]:  # another holder has a majority
        server.client().set(keys.lock, "someone-else", px=30_000)
    lock = RedLock("order:3", ttl=30, timeout=0)
    assert lock.acquire() is False
    # The third master granted our token; it was given back at once (a tombstone that
    # does not remember the token: its next try may reuse it).
    assert token_of(redlock[2].client().get(keys.lock)) is None
    assert _on_every_master(redlock[:2], keys.lock) == [b"someone-else"] * 2


def test_redlock_needs_a_redlock_backend_and_offers_no_semaphores(redlock):
    with pytest.raises(LockError, match="not a RedLock backend"):
        RedLock("order:4", backend="default")
    with pytest.raises(LockError, match="no semaphores"):
        Semaphore("exports", 2, backend="redlock")
    plain = Lock("order:4", backend="redlock")  # the same backend through Lock
    assert plain.acquire() and plain.backend is get_backend("redlock")
    plain.release()


def test_a_redlock_backend_needs_an_odd_number_of_masters_at_least_three(redlock):
    urls = [server.url for server in redlock]
    for location in (urls[:2], urls + urls[:1], "redis://127.0.0.1:1/0"):
        backends = {"bad": {"BACKEND": "stock_locks.backends.redlock.RedLockBackend",
                            "LOCATION": location}}  # fmt: skip
        with override_settings(STOCK_LOCKS={"BACKENDS": backends}), pytest.raises(LockError):
            get_backend("bad")


def test_a_try_given_up_while_another_held_stays_refused_after_a_grant_from_nothing(redlock):
    # The counter rule's grant from no key: the tokens given back while the last holder
    # held the lock (kept apart, :given_back) are carried on into the new key.
    keys = lock_keys("order:late")
    holder = RedLock("order:late", ttl=30)
    assert holder.acquire(timeout=0)
    holder.do_release("t" * 32, 1, "abandon")
    for server in redlock:  # the holder's lease runs out everywhere
        server.client().pexpire(keys.lock, 1)
    wait_until(
        lambda: not any(server.client().exists(keys.lock) for server in redlock),
        what="the lease end",
    )
    with RedLock("order:late", ttl=30):
        pass
    with pytest.raises(LockError):
        holder.do_acquire("t" * 32, 0)  # the late copy lands: nothing granted
    assert [token_of(value) for value in _on_every_master(redlock, keys.lock)] == [None] * 3
