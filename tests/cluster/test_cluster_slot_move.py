"""A replica-confirmed grant (``REPLICAS=1``) on a Redis Cluster whose slot moved under
the client: a reshard, not a failover (tests/cluster/test_cluster_failover.py).

Such a grant runs lock_acquire.lua, then ``WAIT``, on the connection of the key's own
master, picked by the client's cached slot map. After the slot moved, that map names
the old master, which answers MOVED: the grant must read the map again and go to the
new master (whose replica confirms it), in both modes (``tests.contract.modes``).
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from stock_locks.backends.redis.protocol import token_of
from stock_locks.keys import lock_keys
from tests.cluster.conftest import on_cluster
from tests.contract.modes import Lock
from tests.contract.support import mode  # noqa: F401  (a fixture: the test in both modes)
from tests.support.lock_state import held
from tests.support.redis_cluster import RedisClusterServers


@pytest.mark.usefixtures("mode")
def test_a_replica_confirmed_grant_follows_its_slot_to_another_master(
    redis_cluster: RedisClusterServers,
):
    name = "moved:order:7"
    key = lock_keys(name, cluster=True).lock
    slot = redis_cluster.slot_for_key(key)
    # (a generous WAIT bound: the replica's ack, not its timing, is under test)
    confirmed = {**settings.STOCK_LOCKS, "REPLICA_TIMEOUT": 5}
    with override_settings(STOCK_LOCKS=confirmed), on_cluster(redis_cluster.url, REPLICAS=1):
        with Lock(name, ttl=30, timeout=0) as first:  # the client learns the slot map
            earlier = first.fence
        source = redis_cluster.master_of_slot(slot)
        target = next(
            master
            for master in redis_cluster.current_masters()
            if master is not source and redis_cluster.replicas_of(master)
        )
        redis_cluster.move_slot(slot, target)  # the client's map now names the old master
        try:
            lock = Lock(name, ttl=30, timeout=0)
            assert lock.acquire()  # granted on the new master, confirmed by its replica
            assert lock.fence > earlier
            holder = target.client()
            assert token_of(holder.get(key)) == lock.token
            lock.release()
            assert not held(holder, key) and not lock.locked()
            holder.close()
        finally:
            redis_cluster.move_slot(slot, source)
