"""The cluster fixture works: keys spread over every master, and a multi-key script
runs when its keys share a hash tag. (A killed master's replica taking over, and
``heal()`` bringing the old master back as its replica: test_cluster_failover.py.)"""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from tests.support.redis_cluster import RedisClusterServers

COPY_SCRIPT = """
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], redis.call('GET', KEYS[1]) .. '!')
return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
"""


def test_the_cluster_is_whole(redis_cluster: RedisClusterServers) -> None:
    masters = redis_cluster.current_masters()
    replicas = redis_cluster.current_replicas()
    assert len(masters) == 3
    assert len(replicas) == 3
    assert len(redis_cluster.startup_nodes) == 6
    assert redis_cluster.url == f"redis://127.0.0.1:{masters[0].port}"


def test_keys_on_every_master_set_and_get(
    redis_cluster: RedisClusterServers, cluster_client: RedisCluster
) -> None:
    by_master: dict[int, str] = {}
    for n in range(100):
        key = f"smoke:{n}"
        by_master.setdefault(redis_cluster.master_for_key(key).port, key)
        if len(by_master) == 3:
            break
    assert len(by_master) == 3, "100 keys should land on all three masters"
    slots = {redis_cluster.slot_for_key(key) for key in by_master.values()}
    assert len(slots) == 3

    for port, key in by_master.items():
        assert cluster_client.set(key, f"on {port}")
    for port, key in by_master.items():
        assert cluster_client.get(key) == f"on {port}"
        # Really stored on that master, not only reachable through the client.
        direct = redis_cluster.node_on_port(port).client(decode_responses=True)
        try:
            assert direct.get(key) == f"on {port}"
        finally:
            direct.close()


def test_eval_with_two_keys_sharing_a_hash_tag(cluster_client: RedisCluster) -> None:
    reply = cluster_client.eval(COPY_SCRIPT, 2, "{x}:a", "{x}:b", "v")
    assert reply == ["v", "v!"]
    assert cluster_client.get("{x}:b") == "v!"


def test_eval_with_keys_on_two_slots_is_refused(cluster_client: RedisCluster) -> None:
    with pytest.raises(RedisClusterException, match="same key slot"):
        cluster_client.eval(COPY_SCRIPT, 2, "smoke:a", "smoke:b", "v")
