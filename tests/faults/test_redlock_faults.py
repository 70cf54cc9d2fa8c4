"""RedLock on a bad day: masters killed, emptied by a restart, stalled behind a proxy.

Three real redis-server masters (the ``redlock`` fixture). What must hold: a
majority grants, a minority never does; nothing a failed try was granted stays
behind; fences keep rising while a majority keeps its data, and when a majority
lost it, the fence still refuses the older holder's writes.
"""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from stock_locks import Lock, RedLock
from stock_locks.backends.redis.protocol import token_of
from stock_locks.exceptions import RedisUnavailable, StaleFencingToken
from stock_locks.fencing import fenced_update
from stock_locks.keys import lock_keys
from tests.inventory.models import Item
from tests.settings import redlock_backend
from tests.support.processes import run_in_processes
from tests.support.waiting import wait_until


def _held_on(servers, name: str) -> list:
    key = lock_keys(name).lock
    # (the token of each master's record of the holder; None: free, or a tombstone)
    tokens = [token_of(server.client().get(key)) for server in servers]
    return [None if token is None else token.encode() for token in tokens]


def test_one_master_of_three_killed_still_grants_and_fences_rise(redlock):
    redlock[0].kill()
    first = RedLock("order:10", ttl=30)
    assert first.acquire()
    first.release()
    with RedLock("order:10", ttl=30) as second:
        assert second.fence > first.fence
        assert _held_on(redlock[1:], "order:10") == [second.token.encode()] * 2


def test_two_masters_of_three_killed_fail_within_the_timeout_and_hold_nothing(redlock):
    redlock[0].kill()
    redlock[1].kill()
    lock = RedLock("order:11", ttl=30, timeout=5)
    with pytest.raises(RedisUnavailable, match="fewer than 2 of 3 masters"):
        lock.acquire()
    assert _held_on(redlock[2:], "order:11") == [None]  # the lone grant was given back
    assert lock.token is None


def test_a_master_restarted_empty_does_not_hand_out_a_lock_the_majority_holds(redlock):
    holder = RedLock("order:12", ttl=30)
    assert holder.acquire()
    redlock[0].restart()  # empty: it forgot the holder
    rival = RedLock("order:12", ttl=30, timeout=0)
    assert rival.acquire() is False
    assert _held_on(redlock, "order:12") == [None, holder.token.encode(), holder.token.encode()]
    holder.release()
    assert rival.acquire()
    assert rival.fence > holder.fence
    rival.release()


@pytest.mark.django_db
def test_a_majority_emptied_while_held_grants_twice_and_the_fence_refuses_the_first(redlock):
    item = Item.objects.create(code="RL", title="RedLock", on_hand=10)
    rows = Item.objects.filter(pk=item.pk)
    first = RedLock("item:RL", ttl=30)
    assert first.acquire()
    redlock[0].restart()
    redlock[1].restart()  # a majority forgot the first holder: a double grant follows
    second = RedLock("item:RL", ttl=30, timeout=0)
    assert second.acquire(), "a majority of empty masters grants again"
    assert second.fence > first.fence  # (their clocks are ahead of every earlier fence)
    assert fenced_update(rows, second.fence, on_hand=9) == 1
    with pytest.raises(StaleFencingToken):
        fenced_update(rows, first.fence, on_hand=0)
    assert Item.objects.get(pk=item.pk).on_hand == 9
    second.release()


def test_a_stalled_master_costs_at_most_the_node_timeout(redlock, fault_proxy):
    proxy = fault_proxy(redlock[0].port)
    urls = [proxy.url, redlock[1].url, redlock[2].url]
    backends = {"stalling": redlock_backend(urls, node_timeout=0.05)}
    with override_settings(STOCK_LOCKS={"BACKENDS": backends}):
        proxy.stall()  # accepts connections, forwards nothing
        # A 300 ms lease: had a round waited for the stalled master longer than the
        # node timeout (its socket timeout is 1 s), the validity would be gone and
        # nothing granted.
        for _ in range(3):
            lock = RedLock("order:13", ttl=0.3, backend="stalling", timeout=0)
            assert lock.acquire()
            lock.release()
        proxy.resume()


# -- mutual exclusion, recorded, while a master is killed ----------------------------------

SECTIONS = 25


def _record_sections(index: int, name: str) -> list[tuple[int, int, int]]:
    sections = []
    for _ in range(SECTIONS):
        with RedLock(name, ttl=5, timeout=30) as lock:
            started = time.monotonic_ns()  # (system-wide on Linux: comparable across processes)
            time.sleep(0.002)  # work inside the section, so that overlaps would show
            sections.append((started, time.monotonic_ns(), lock.fence))
    return sections


def test_sections_never_overlap_and_fences_rise_while_a_master_is_killed(redlock):
    # (A master restarted empty while it and one other hold the lock can let a second
    # holder in: that case is the fence's, test_a_majority_emptied_... above.)
    import threading

    name = "ledger:RL"
    killed = threading.Event()

    def kill_one_master() -> None:
        key = lock_keys(name).fence  # once the processes are contending
        client = redlock[1].client()
        wait_until(lambda: client.exists(key), interval=0.001, what="the processes contending")
        redlock[1].kill()
        killed.set()

    chaos = threading.Thread(target=kill_one_master, daemon=True)
    chaos.start()
    results = run_in_processes(_record_sections, 3, name)
    chaos.join()
    assert killed.is_set()
    sections = sorted(s for result in results for s in result)
    assert len(sections) == 3 * SECTIONS
    for before, after in zip(sections, sections[1:], strict=False):
        assert before[1] <= after[0], f"overlapping sections {before} {after}"
        assert before[2] < after[2], f"fence did not rise: {before} then {after}"


def _proxied_redlock(redlock, proxy) -> dict:
    urls = [redlock[0].url, proxy.url, redlock[2].url]
    return {"BACKENDS": {"proxied": redlock_backend(urls, node_timeout=0.05)}}


def test_a_silent_holding_master_makes_extend_unknown_and_release_free_the_lock(
    redlock, fault_proxy
):
    # Master 0 holds our token, master 1 (behind a proxy) holds it but falls silent,
    # master 2 never held it: no majority says "not ours", so nothing may claim loss.
    proxy = fault_proxy(redlock[1].port)
    with override_settings(STOCK_LOCKS=_proxied_redlock(redlock, proxy)):
        lock = RedLock("order:14", ttl=30, backend="proxied")
        assert lock.acquire()
        redlock[2].client().delete(lock_keys("order:14").lock)
        proxy.stall()
        with pytest.raises(RedisUnavailable):
            lock.extend(60)  # a majority's renewal cannot be confirmed
        assert not lock.lost
        lock.release()  # what the silent master keeps is a minority: the lock is free
        rival = RedLock("order:14", ttl=30, backend="proxied", timeout=0)
        assert rival.acquire()
        proxy.resume()
        rival.release()


def test_watchdog_renewals_on_masters_that_lost_their_scripts(redlock):
    from types import SimpleNamespace

    from stock_locks.backends import get_backend
    from stock_locks.backends.base import call

    locks = [RedLock(f"order:{n}", ttl=30) for n in (15, 16)]
    for lock in locks:
        assert lock.acquire()
    for server in redlock:
        server.client().script_flush()  # as after a restart: EVALSHA answers NOSCRIPT
    renewals = [
        SimpleNamespace(spec=lock.spec, token=lock.token, ttl_ms=60_000, max_hold_ms=0)
        for lock in locks
    ]  # fmt: skip
    backend = get_backend("redlock")
    assert backend.execute(call(backend.renew_many, renewals)) == [1, 1]
    for lock in locks:
        assert 30 < lock.remaining() <= 60
        lock.release()


def test_a_release_repeated_after_a_retracted_minority_grant_still_succeeds(redlock):
    # A releases everywhere, its reply lost: it will repeat the release. Meanwhile master 1
    # is taken by a single-master lock (its record carries A's released token on), master 2
    # by something else, and a rival's try wins master 0 alone, so it is retracted there.
    # The retraction must not drop the released tokens master 0 kept: A's repeat then
    # still finds its release done on a majority (masters 0 and 1).
    first = RedLock("order:16", ttl=30)
    assert first.acquire()
    token = first.token
    first.release()
    assert Lock("order:16", ttl=30, redis=redlock[1].client()).acquire(timeout=0)
    redlock[2].client().set(lock_keys("order:16").lock, "someone-else", px=30_000)
    rival = RedLock("order:16", ttl=30, timeout=0)
    assert rival.acquire() is False
    assert _held_on(redlock, "order:16")[0] is None  # retracted on master 0
    assert first.do_release(token, 1) == 1  # RELEASED: the repeat reports the release
