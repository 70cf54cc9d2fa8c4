"""Reaching the one node of a Redis Cluster that serves a key.

A few calls must run on the one node that serves a key (a pipeline of
``EVALSHA`` calls, which cluster pipelines refuse; ``WAIT`` after a grant; a
blocking pop read off its own socket; a ``MULTI``/``EXEC``). They go through
:func:`node_client` (and the transports' redirect policy,
``stock_locks.backends.redis.requests``) or :func:`on_node`: redis-py's
``RedisCluster`` refreshes its slot map only after its own redirects and
connection errors, so a node's connection used directly would keep knocking
on a node that no longer serves the slot (MOVED after a failover) or is gone
(a killed master). On such an answer the slot map is read again from the
cluster (:func:`refresh_slot_map`, what ``RedisCluster`` does itself), then
the request is sent once more when it is known not to have run (a redirect),
or the error propagates when it may have run (a transport error), so that
the caller's own retry meets the new map.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import RedisClusterException, RedisError

from .errors import NODE_ERRORS, STALE_ROUTE_ERRORS

T = TypeVar("T")
log = logging.getLogger("stock_locks.connection")

DEFAULT_SOCKET_TIMEOUT = 5.0  # seconds, redis-py's own default


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a Redis Cluster client (keys are then routed by slot)."""
    return hasattr(client, "get_node_from_key")


def node_client(client: Any, key: str) -> Any:
    """The plain ``Redis`` client of the master serving ``key``'s slot, by the cluster
    client's slot map (``client`` itself when it is not a cluster client)."""
    if not is_cluster(client):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


_refreshing = threading.Lock()


def refresh_slot_map(client: Any) -> None:
    """Read the cluster's slot map again (``CLUSTER SLOTS`` of the first node that
    answers), as ``RedisCluster`` does after its own redirects and connection
    errors. Never raises: when no node answers, the old map stays and the next
    call meets the error again. Nothing for a client that is not a cluster's."""
    if not is_cluster(client):
        return
    with _refreshing:  # one refresh at a time: a failover makes every thread ask at once
        try:
            client.nodes_manager.initialize()
        except (RedisError, RedisClusterException) as exc:
            log.warning("Redis Cluster slot map not refreshed: %s", exc)


def on_node(client: Any, key: str, call: Callable[[Any], T]) -> T:
    """``call(node)``, ``node`` the plain client of the master serving ``key``.

    On a cluster, a stale route (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the request
    did not run) refreshes the slot map and calls once more, on the node the
    fresh map names; a second stale route propagates. A transport error (or
    READONLY: the node became a replica) refreshes the map and propagates, since
    the request may have run: the caller decides whether to repeat it. Not a cluster:
    ``call(client)``.
    """
    if not is_cluster(client):
        return call(client)
    for attempt in range(2):
        try:
            return call(node_client(client, key))
        except STALE_ROUTE_ERRORS:
            refresh_slot_map(client)
            if attempt:
                raise
        except NODE_ERRORS:
            refresh_slot_map(client)
            raise
    raise AssertionError("unreachable")  # pragma: no cover


# -- blocking commands ---------------------------------------------------------------------

_caps: weakref.WeakKeyDictionary[Any, float | None] = weakref.WeakKeyDictionary()


def blocking_cap(client: object) -> float | None:
    """The client's socket timeout in seconds (None when unbounded).

    A blocking command (BLPOP) must return before the socket times out, so
    waits are cut into slices shorter than this. The value is what the pool's
    connections really get (redis-py may default it without listing it in
    ``connection_kwargs``), read once per pool without connecting. A cluster
    client: its nodes' socket timeout.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", None)
        if kwargs is not None:
            found = kwargs.get("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
            return float(found) if found else None
        return DEFAULT_SOCKET_TIMEOUT
    try:
        return _caps[pool]
    except KeyError:
        pass
    try:
        value = pool.connection_class(**pool.connection_kwargs).socket_timeout
    except Exception:  # an exotic pool: assume the usual default
        value = DEFAULT_SOCKET_TIMEOUT
    cap = _caps[pool] = float(value) if value else None
    return cap
