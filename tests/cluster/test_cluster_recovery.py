"""Expiry, the sweeper, reconcile and the dashboard on a real Redis Cluster.

The suite's own tests of reservation expiry, the sweeper and the drift
measurement run here unchanged (imported): the sweeper's reads, restores and
repairs go to the master serving the stock tag. The dashboard's JSON lists the
held locks from the per-slot indexes of every master, semaphores and queues
on every master (found in their registries), and the stock drift.
"""

from __future__ import annotations

import os

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from stock_locks import DelayQueue, Lock, Semaphore
from stock_locks.dashboard import snapshot
from stock_locks.keys import StockKeys
from stock_locks.stock import get_strategy
from stock_locks.stock.sweeper import sweep
from tests.inventory.models import Item
from tests.test_dashboard import (  # noqa: F401  (collected here: they run on the cluster)
    JSON,
    client_for,
    test_shows_a_lock_held_by_another_process_a_semaphore_holder_and_drift,
)
from tests.test_stock_recovery import (  # noqa: F401
    expired_signals,
    test_a_record_whose_row_never_came_is_given_back_once_and_a_late_row_is_refused,
    test_a_release_by_another_strategy_is_done_by_the_one_that_reserved,
    test_an_open_row_without_its_record_is_adopted,
    test_drift_from_outside_the_strategies_is_corrected_relatively,
    test_redis_losing_its_data_strands_nothing,
    test_the_delay_queue_handler_expires_the_reservation,
    test_the_sweeper_expires_what_the_delay_queue_lost,
)
from tests.test_stock_recovery import (
    test_a_reservation_with_a_ttl_is_due_by_the_redis_clock_and_queued as ttl_is_queued,
)
from tests.test_stock_recovery import (
    test_expiry_releases_once_signals_once_and_spares_a_paid_one as expiry_releases_once,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("strategy", ["lua", "watch", "lock"])
def test_a_reservation_with_a_ttl_is_queued_by_the_redis_clock(strategy, redis_client):
    ttl_is_queued(strategy, redis_client)


@pytest.mark.parametrize("strategy", ["lua", "watch", "lock"])
def test_expiry_releases_once(strategy, redis_client, expired_signals):  # noqa: F811
    expiry_releases_once(strategy, redis_client, expired_signals)


def test_a_sweep_on_the_cluster_repairs_and_reports(redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    lua = get_strategy("lua")
    lua.reserve("kept", {"TEA": 1})
    lua.reserve_in_redis("ghost", {"TEA": 2})  # its process died before the database step
    redis_client.incrby(StockKeys().counter("TEA"), 3)  # drift from behind the app's back
    result = sweep(grace=0, orphan_grace=0).as_dict()
    assert (result["orphans"], result["corrected"], result["errors"]) == (1, {"TEA": -3}, [])
    assert not result["restored"] and not result["restarted"]
    assert lua.available("TEA") == 4 == Item.objects.get(code="TEA").on_hand


def names_on_every_master(redis_cluster, prefix: str) -> list[str]:
    names: dict[int, str] = {}
    for n in range(200):
        name = f"{prefix}{n}"
        names.setdefault(redis_cluster.master_for_key(f"{{{name}}}").port, name)
        if len(names) == 3:
            return sorted(names.values())
    raise AssertionError("no names on every master")


def test_the_snapshot_sees_every_master(redis_cluster, redis_client):
    lock_names = names_on_every_master(redis_cluster, "order:")
    locks = [Lock(name, ttl=60) for name in lock_names]
    for lock in locks:
        assert lock.acquire(timeout=0)
    semaphore_names = names_on_every_master(redis_cluster, "exports-")
    permits = [Semaphore(name, 2, ttl=60) for name in semaphore_names]
    for permit in permits:
        assert permit.acquire(timeout=0)
    queue_names = names_on_every_master(redis_cluster, "queue-")
    for name in queue_names:
        queue = DelayQueue(name, max_attempts=1)
        queue.schedule("t", id="doomed")
        [item] = queue.claim()
        queue.fail(item.id, "boom")  # its only delivery: a dead letter
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    redis_client.set(StockKeys().counter("TEA"), 9)

    data = snapshot()
    assert [row["name"] for row in data["locks"]["rows"]] == lock_names
    assert [row["fence"] for row in data["locks"]["rows"]] == [lock.fence for lock in locks]
    assert {row["pid"] for row in data["locks"]["rows"]} == {str(os.getpid())}
    assert [row["name"] for row in data["semaphores"]] == semaphore_names
    dead = {row["name"]: row["dead"] for row in data["delay_queues"]}
    assert {name: dead[name] for name in queue_names} == dict.fromkeys(queue_names, 1)
    assert (data["stock"]["drifting"], data["stock"]["rows"][0]["drift"]) == (1, 4)
    # The admin's JSON endpoint serves the same on the cluster.
    served = client_for(User.objects.create_superuser("root", password="pw")).get(reverse(JSON))
    assert [row["name"] for row in served.json()["locks"]["rows"]] == lock_names
