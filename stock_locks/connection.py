"""The Redis client stock_locks talks to, and how to reach one node of a Redis Cluster.

:func:`get_redis` is the client of every feature that is not a lock or a
semaphore (the stock strategies, the delay queue, the sweeper, reconcile, the
dashboard): the default backend's own client when ``STOCK_LOCKS["BACKENDS"]
["default"]`` is a Redis backend with a ``LOCATION`` (one Redis, or a Redis
Cluster with ``OPTIONS["CLUSTER"]``), else django-redis's.

A few calls must run on the one node that serves a key (a pipeline of
``EVALSHA`` calls, which cluster pipelines refuse; ``WAIT`` after a grant; a
blocking pop read off its own socket; a ``MULTI``/``EXEC``). They go through
:func:`on_node` or check their replies with :func:`stale_route`: redis-py's
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
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .conf import settings

if TYPE_CHECKING:
    from redis import Redis

T = TypeVar("T")
log = logging.getLogger("stock_locks.connection")

DEFAULT_SOCKET_TIMEOUT = 5.0  # seconds, redis-py's own default

# Answers of a cluster node that does not serve the key's slot now (MOVED and ASK:
# AskError is MovedError's base), is between owners (TRYAGAIN) or sees the cluster
# down (CLUSTERDOWN, e.g. while a failed master's replica is not yet promoted). The
# request did not run; sent again on a fresh slot map it may succeed.
STALE_ROUTE_ERRORS: tuple[type[Exception], ...] = (AskError, TryAgainError, ClusterDownError)
# Errors after which the node may be gone, or a replica now: the request may have run.
NODE_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ReadOnlyError)
# Besides transport errors, what a cluster answers while it changes hands (redirects
# not settled after redis-py's own retries, no node for a slot yet, no node reachable
# at all). Callers treat them as "Redis unavailable": nothing ran, and a later try may
# succeed. (RedisClusterException is also what redis-py raises, before sending, for a
# multi-key call across slots: a bug, which then reads as unavailable, message kept.)
CLUSTER_UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    *STALE_ROUTE_ERRORS,
    RedisClusterException,
)
# Every error redis-py raises for Redis being unreachable or refusing: RedisError,
# and a cluster client's RedisClusterException (no node reachable, a slot not covered).
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)
# The same, or a socket error below redis-py.
REDIS_OR_OS_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)


def decoded(value: Any) -> Any:
    """A reply decoded to ``str`` when it is ``bytes`` (clients may or may not decode)."""
    return value.decode() if isinstance(value, bytes) else value


def get_redis(alias: str | None = None) -> Redis:
    """The raw redis-py client of stock_locks' own features.

    Without ``alias``: when ``STOCK_LOCKS["BACKENDS"]["default"]`` is a
    :class:`~stock_locks.backends.redis.RedisBackend` configured with a
    ``LOCATION``, that backend's client (a ``Redis``, or a ``RedisCluster``
    with ``OPTIONS["CLUSTER"]``; made once per process, shared with the
    locks; another backend class, e.g. RedLock's, is not used); otherwise the
    client of the django-redis cache
    ``STOCK_LOCKS["REDIS_ALIAS"]``. With ``alias``: always that django-redis
    cache's client.

    Raises ``NotImplementedError`` when the cache is not a django-redis
    backend, ``django.core.cache.InvalidCacheBackendError`` when it does not
    exist, ``ImproperlyConfigured`` for a malformed ``BACKENDS`` entry.
    """
    if alias is None:
        client = _default_backend_client()
        if client is not None:
            return client
    from django_redis import get_redis_connection

    return get_redis_connection(alias or settings.REDIS_ALIAS)


def _default_backend_client() -> Any:
    if not settings.BACKENDS:
        return None
    from .backends import DEFAULT_ALIAS, backend_config, get_backend
    from .backends.redis import RedisBackend

    if not backend_config(DEFAULT_ALIAS).get("LOCATION"):
        return None
    backend = get_backend(DEFAULT_ALIAS)
    return backend.client if isinstance(backend, RedisBackend) else None


# -- one node of a Redis Cluster ---------------------------------------------------------


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


def stale_route(reply: object) -> bool:
    """Whether ``reply`` (a pipeline's reply, exceptions included) says the request
    went to a node that does not serve its slot now: it did not run."""
    return isinstance(reply, STALE_ROUTE_ERRORS)


def on_node(
    client: Any, key: str, call: Callable[[Any], T], *, refresh_on_node_error: bool = True
) -> T:
    """``call(node)``, ``node`` the plain client of the master serving ``key``.

    On a cluster, a stale route (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the request
    did not run) refreshes the slot map and calls once more, on the node the
    fresh map names; a second stale route propagates. A transport error (or
    READONLY: the node became a replica) refreshes the map (unless
    ``refresh_on_node_error`` is False: a refresh asks the nodes in turn, and a
    stalled one costs its socket timeout) and propagates, since the request may
    have run: the caller decides whether to repeat it. Not a cluster:
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
            if refresh_on_node_error:
                refresh_slot_map(client)
            raise
    raise AssertionError("unreachable")  # pragma: no cover


# -- blocking commands ---------------------------------------------------------------------

_caps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
            value = kwargs.get("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
            return float(value) if value else None
        return DEFAULT_SOCKET_TIMEOUT
    try:
        return _caps[pool]
    except KeyError:
        pass
    try:
        value = pool.connection_class(**pool.connection_kwargs).socket_timeout
    except Exception:  # an exotic pool: assume the usual default
        value = DEFAULT_SOCKET_TIMEOUT
    _caps[pool] = float(value) if value else None
    return _caps[pool]
