"""Locks and semaphores on a real Redis Cluster, through the default backend.

The suite's own tests of locks and semaphores, imported here, run unchanged on
the cluster (tests/cluster/conftest.py points the default backend and
``redis_client`` at it, and ``cluster_client`` at the same cluster): plain,
reentrant, watchdog and max_hold locks, adoption and force release, plain and
fair semaphores. Left out are the tests that count a single server's commands
or blocked clients, read its one held-locks index key (a cluster keeps one per
slot) or list keys with KEYS (one node's only, on a cluster); mutual exclusion
across OS processes is the flash sale's (test_cluster_stock.py, the lock strategy).
"""

from __future__ import annotations

import logging
import os
import threading

import pytest

from stock_locks import FairSemaphore, Lock, Semaphore
from stock_locks.backends import get_backend
from stock_locks.backends.redis import get_redis
from stock_locks.operations import force_release, inspect, release_held_by
from tests.support.redis_cluster import RedisClusterServers
from tests.support.redis_stats import blocked_clients, redis_ms
from tests.support.waiting import TIMEOUT, wait_until
from tests.test_lock_api import (  # noqa: F401  (collected here: they run on the cluster)
    test_a_repeated_force_release_is_recognised_and_the_holder_still_told,
    test_adopt_inspect_and_force_release_on_a_cluster,
    test_adopting_a_token_that_no_longer_holds_the_lock,
    test_force_release_by_token_compares_the_token,
    test_inspect_and_info_describe_the_holder,
    test_max_hold_defaults_from_the_setting_and_is_checked,
    test_the_watchdog_renews_and_caps_on_a_cluster,
)
from tests.test_locks import (  # noqa: F401
    test_a_force_released_holder_is_told_it_lost_the_lock,
    test_a_late_copy_of_a_given_up_acquire_is_refused,
    test_a_repeated_release_reports_success_a_lapsed_lease_does_not,
    test_expired_lock_is_free_to_others,
    test_extend_works_only_for_the_owner,
    test_fences_keep_rising_when_redis_loses_its_data,
    test_fences_strictly_increase_across_grants,
    test_grant_sets_token_fence_and_holder_metadata_with_one_lease,
    test_locks_with_hostile_names_run_on_a_cluster,
    test_only_the_owner_releases,
    test_reentrant_owner_counts_holds_and_only_the_last_release_frees,
    test_reentry_after_the_lease_ended_raises_and_grants_nothing,
    test_retried_acquire_with_the_same_token_is_granted_the_same_fence,
    test_waiter_whose_holder_died_is_granted_when_the_lease_runs_out,
    test_watchdog_marks_a_lost_lease_and_logs_a_warning,
)
from tests.test_semaphores import (  # noqa: F401
    test_a_holder_whose_lease_ended_is_reaped_and_told_so,
    test_a_lapsed_lease_hands_the_permit_on_down_the_line_without_idle_time,
    test_a_repeated_release_reports_what_the_first_one_did,
    test_at_most_limit_holders_and_a_released_permit_is_granted_again,
    test_refresh_extends_a_live_lease_and_refuses_an_ended_one,
    test_retried_acquire_with_the_same_id_is_granted_once,
)


def test_the_default_backend_is_the_cluster_configured_by_location(redis_cluster):
    from redis.cluster import RedisCluster

    backend = get_backend()
    assert backend.options.location.startswith("redis://127.0.0.1:")
    assert isinstance(backend.client, RedisCluster)
    assert get_redis() is backend.client  # the stock, queue and dashboard features' client too


def names_on_every_master(redis_cluster: RedisClusterServers, count: int) -> list[str]:
    """``count`` lock names whose keys live on each of the masters, in turn."""
    by_port: dict[int, list[str]] = {}
    n = 0
    while min((len(v) for v in by_port.values()), default=0) < count or len(by_port) < 3:
        name = f"spread:{n}"
        port = redis_cluster.master_for_key(Lock(name).keys.lock).port
        by_port.setdefault(port, []).append(name)
        n += 1
    return [name for names in by_port.values() for name in names[:count]]


def test_the_held_locks_index_of_every_slot_is_read_on_every_master(redis_cluster, caplog):
    """inspect, release_held_by and the watchdog's per-node batches, with locks on
    all three masters."""
    names = names_on_every_master(redis_cluster, 2)
    locks = [Lock(name, ttl=1.0, watchdog=True) for name in names]
    for lock in locks:
        assert lock.acquire(timeout=0)
    # Renewed in one batch per node: each lease outlives its ttl twice over.
    granted_ms = {name: inspect(name).acquired_at.timestamp() * 1000 for name in names}

    def renewed() -> bool:
        now_ms = redis_ms(get_redis())
        assert all(inspect(name) for name in names), "a lease ran out"
        return all(now_ms > granted_ms[name] + 2000 for name in names)

    wait_until(renewed, interval=0.05, what="every lease to outlive its ttl twice")
    assert sorted(i.name for i in release_held_by(host=inspect(names[0]).host, dry_run=True)) == (
        sorted(names)
    )
    assert force_release(names[0]).token == locks[0].token
    caplog.set_level(logging.WARNING, logger="stock_locks.lock.renewal")
    wait_until(lambda: locks[0].lost, interval=0.05, what="the watchdog to see the force release")
    displaced = release_held_by(host=inspect(names[1]).host, pid=os.getpid())
    assert sorted(i.name for i in displaced) == sorted(names[1:])
    assert all(inspect(name) is None for name in names)


def blocked_on(redis_cluster: RedisClusterServers, key: str) -> int:
    """Clients blocked (BLPOP) on the master serving ``key`` right now."""
    node = redis_cluster.master_for_key(key).client()
    try:
        return blocked_clients(node)
    finally:
        node.close()


@pytest.mark.parametrize("kind", [Lock, Semaphore, FairSemaphore], ids=["lock", "plain", "fair"])
def test_a_waiter_sleeps_on_its_node_and_is_woken_by_the_release(kind, redis_cluster):
    # Leases of 300 s and a wait of TIMEOUT: only the release can grant the waiter.
    args = ("woken",) if kind is Lock else ("woken", 1)
    holder = kind(*args, ttl=300)
    assert holder.acquire()
    waiter = kind(*args, ttl=300, timeout=TIMEOUT)
    granted: list[bool] = []
    thread = threading.Thread(target=lambda: granted.append(waiter.acquire()))
    thread.start()
    wait_until(lambda: blocked_on(redis_cluster, holder.keys[0]) == 1, what="the waiter blocked")
    holder.release()
    thread.join(TIMEOUT)
    assert granted == [True]
    waiter.release()
