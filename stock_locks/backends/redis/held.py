"""The held-locks index: which locks are held now, read without walking the keyspace.

The lock scripts keep a sorted set of the lock keys in use, scored by until when
each is listed (ms, Redis clock; at least the lease end): one key on a single
server, one per hash slot on a cluster (``stock_locks.keys.lock_index_key``). A
grant adds its name only when the entry would end before its lease (for two
leases), and a release leaves it, so a name taken and given back over and over
writes the index about once a lease. The listing reads the entries not yet
ended, then the lock keys they name, and keeps those held (not a tombstone).
Reading it costs what the names in use lately are, not what the keyspace is.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from ...conf import settings
from ...keys import SLOTS, lock_index_key, lock_name_of
from .cluster import is_cluster, refresh_slot_map
from .protocol import decoded, is_held

CLUSTER_INDEX_CHUNK = 1024  # per-slot index keys read by one script call on a cluster

# On a cluster: read the held-locks index of every slot a node serves, in one
# script per node. The index keys (of many slots, all on that node) come as
# ARGV: declared KEYS must share one slot, undeclared ones may span slots with
# the allow-cross-slot-keys flag (Redis >= 7.0).
_CLUSTER_INDEX_READ = """#!lua flags=no-writes,allow-cross-slot-keys
local out = {}
for i = 1, #ARGV do
  local found = redis.call('ZRANGE', ARGV[i], 0, -1, 'WITHSCORES')
  for j = 1, #found do out[#out + 1] = found[j] end
end
return out
"""


def held_lock_names(client: Any) -> list[str]:
    """Names of the locks held now (lease not ended on the Redis clock), sorted.

    Two round trips on a single server (the index and TIME, pipelined; then the
    records of the names it lists); on a cluster one script per node over the
    per-slot indexes it serves, then the records.
    """
    if is_cluster(client):
        seconds, micros = client.time()
        pairs = _cluster_index_entries(client)
    else:
        pipe = client.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(lock_index_key(), 0, -1, withscores=True)
        (seconds, micros), pairs = pipe.execute()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    keys = sorted({decoded(key) for key, until in pairs if float(until) > now_ms})
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    records = pipe.execute() if keys else []
    held = [key for key, record in zip(keys, records, strict=True) if is_held(record)]
    names = {lock_name_of(key) for key in held}
    return sorted(name for name in names if name is not None)


_index_keys_cache: dict[str, list[str]] = {}


def _all_index_keys() -> list[str]:
    """The held-locks index key of every cluster slot, in slot order (cached per prefix)."""
    keys = _index_keys_cache.get(settings.key_prefix())
    if keys is None:
        keys = _index_keys_cache[settings.key_prefix()] = [lock_index_key(s) for s in range(SLOTS)]
    return keys


def _cluster_index_entries(client: Any) -> list[tuple[Any, float]]:
    """Every (lock key, lease end) of every slot's index. The nodes are those of the
    client's slot map: when one no longer serves a slot it is asked for (a failover
    moved it) or cannot be reached, the map is read again and the whole read done
    once more; a second failure raises."""
    for attempt in range(2):
        try:
            return _read_cluster_indexes(client)
        except RedisError:
            refresh_slot_map(client)
            if attempt:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _read_cluster_indexes(client: Any) -> list[tuple[Any, float]]:
    slots = client.nodes_manager.slots_cache  # slot -> [primary, replicas...]
    keys_by_node: dict[str, tuple[Any, list[str]]] = {}
    for slot, key in enumerate(_all_index_keys()):
        node = slots[slot][0]
        keys_by_node.setdefault(node.name, (node, []))[1].append(key)
    pairs: list[tuple[Any, float]] = []
    for node, keys in keys_by_node.values():
        # Cut in chunks, so that no one script call holds the node up for long.
        pipe = client.get_redis_connection(node).pipeline(transaction=False)
        for start in range(0, len(keys), CLUSTER_INDEX_CHUNK):
            pipe.eval(_CLUSTER_INDEX_READ, 0, *keys[start : start + CLUSTER_INDEX_CHUNK])
        for flat in pipe.execute():
            pairs.extend(zip(flat[::2], flat[1::2], strict=True))
    return pairs
