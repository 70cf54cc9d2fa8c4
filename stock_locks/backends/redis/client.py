"""Redis clients: how a Redis backend builds its redis-py and ``redis.asyncio`` clients
from one set of options, and :func:`get_redis`, the client of every feature that is
not a lock or a semaphore.

A backend's options are parsed once (:class:`ClientOptions`). The sync client
comes from, in order: the ``LOCATION`` URL (``OPTIONS["CLUSTER"]``: a
``RedisCluster``, and ``LOCATION`` may then be a list of node URLs, any
reachable one of which is enough to find the others); Redis Sentinel (a
``redis+sentinel://`` ``LOCATION``, or ``OPTIONS["SENTINELS"]`` and
``OPTIONS["SERVICE_NAME"]``: :class:`SentinelOptions`); the django-redis cache
alias ``OPTIONS["CACHE_ALIAS"]``, else ``STOCK_LOCKS["REDIS_ALIAS"]`` (its
connection factory decides: a plain server, Sentinel, TLS...). The asyncio
client is built from the same options, or, for a django-redis alias, like that
alias's client: the same server (or the same Sentinel service), credentials,
TLS and timeouts, with a bounded pool (``ASYNC_MAX_CONNECTIONS`` connections per
server, a call waiting up to ``ASYNC_POOL_TIMEOUT`` for one).

A clean-up call (a give-back, a repeat after a lost reply) runs on a connection
of its own made by the pool's own connection class from the pool's own
arguments (so Sentinel finds the primary, TLS and a unix socket follow), with
every step bounded and no set-up round trip (:func:`bounded_arguments`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aredis
from django.core.exceptions import ImproperlyConfigured
from django_redis import get_redis_connection
from redis.asyncio import sentinel as async_sentinel
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from ...conf import settings
from .. import DEFAULT_ALIAS, backend_config, get_backend
from .sentinel import SentinelOptions, sentinel_options

# OPTIONS stock_locks reads itself; the others go to redis-py, lower-cased.
OWN_OPTIONS = ("CLUSTER", "CACHE_ALIAS", "REPLICAS", "SENTINELS", "SERVICE_NAME", "SENTINEL_KWARGS")
DEFAULT_TIMEOUT = 5.0  # seconds: socket and connect timeout of a client made from a LOCATION

# Connection arguments that turn off redis-py's CLIENT SETINFO on connect (renamed in 7.x).
NO_HANDSHAKE: dict[str, None] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)

# The sync connection arguments an asyncio connection takes as they are (others, such
# as a parser class or a retry policy, are the sync client's own objects).
_COPIED = frozenset(
    {"host", "port", "path", "db", "username", "password", "credential_provider",
     "socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
     "client_name", "health_check_interval", "protocol", "encoding", "encoding_errors",
     "decode_responses", "lib_name", "lib_version", "driver_info"}
)  # fmt: skip
_ASYNC_CONNECTIONS: dict[str, type] = {
    "Connection": aredis.Connection,
    "SSLConnection": aredis.SSLConnection,
    "UnixDomainSocketConnection": aredis.UnixDomainSocketConnection,
    "SentinelManagedConnection": async_sentinel.SentinelManagedConnection,
    "SentinelManagedSSLConnection": async_sentinel.SentinelManagedSSLConnection,
}


@dataclass(frozen=True)
class ClientOptions:
    """A Redis backend's ``LOCATION`` and ``OPTIONS``, checked once.

    ``kwargs``: the redis-py client arguments (``OPTIONS`` lower-cased, without
    stock_locks' own; a socket and a connect timeout of ``DEFAULT_TIMEOUT``
    unless given). ``replicas``: ``OPTIONS["REPLICAS"]`` (None: the setting).
    ``sentinel``: where the primary is found when it is Sentinel-managed.
    """

    alias: str
    location: str | tuple[str, ...] | None
    cluster: bool = False
    cache_alias: str | None = None
    replicas: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    sentinel: SentinelOptions | None = None

    @classmethod
    def parse(
        cls, alias: str, location: str | Sequence[str] | None, options: dict[str, Any] | None
    ) -> ClientOptions:
        """Raises ImproperlyConfigured for a LOCATION of the wrong shape, or Sentinel
        options that are incomplete or combined with a cluster or another LOCATION."""
        options = dict(options or {})
        cluster = bool(options.get("CLUSTER"))
        if location is not None and not isinstance(location, str):
            location = tuple(location)
            if not cluster:
                raise ImproperlyConfigured(
                    f"stock_locks backend {alias!r}: LOCATION is one redis:// URL "
                    '(a list of node URLs only with OPTIONS["CLUSTER"])'
                )
            if not location:
                raise ImproperlyConfigured("a Redis Cluster LOCATION needs at least one node URL")
        kwargs = {k.lower(): v for k, v in options.items() if k not in OWN_OPTIONS}
        kwargs.setdefault("socket_timeout", DEFAULT_TIMEOUT)
        kwargs.setdefault("socket_connect_timeout", DEFAULT_TIMEOUT)
        sentinel = sentinel_options(alias, location, options, cluster, kwargs)
        return cls(
            alias, None if sentinel else location or None, cluster, options.get("CACHE_ALIAS"),
            options.get("REPLICAS"), kwargs, sentinel,
        )  # fmt: skip

    @property
    def urls(self) -> list[str]:
        if self.location is None:
            return []
        return [self.location] if isinstance(self.location, str) else list(self.location)

    @property
    def direct(self) -> bool:
        """Whether the backend names its Redis itself (a LOCATION or Sentinel options),
        rather than through a django-redis cache alias."""
        return self.location is not None or self.sentinel is not None

    def sentinel_manager(self, sentinel_class: Any) -> Any:
        """A ``sentinel_class`` (redis-py's sync or asyncio ``Sentinel``) of
        :attr:`sentinel`."""
        assert self.sentinel is not None
        timeouts = {k: v for k, v in self.kwargs.items() if k.startswith("socket_")}
        return sentinel_class(
            list(self.sentinel.addresses), sentinel_kwargs=self.sentinel.client_kwargs(timeouts)
        )


def sync_client(options: ClientOptions) -> Any:
    """The redis-py client of ``options`` (a ``Redis``, a ``RedisCluster``, or the
    django-redis alias's client)."""
    if options.sentinel is not None:
        manager = options.sentinel_manager(Sentinel)
        return manager.master_for(options.sentinel.service, **options.kwargs)
    if options.location is None:
        return get_redis_connection(options.cache_alias or settings.REDIS_ALIAS)
    urls = options.urls
    if options.cluster:
        # Seeded with every node URL: one reachable node among them is enough.
        seeds = [_node(ClusterNode, u) for u in _split(urls[1:])]
        return RedisCluster.from_url(urls[0], startup_nodes=seeds, **options.kwargs)
    return redis.Redis.from_url(urls[0], **options.kwargs)


def async_client(options: ClientOptions, sync: Any) -> Any:
    """A ``redis.asyncio`` client made like the sync one: from ``options``, or, for a
    django-redis alias, like its client ``sync`` (its server or Sentinel service,
    credentials, TLS and timeouts). Its pool is bounded (see the module)."""
    urls = options.urls
    if options.cluster:
        nodes = [_node(AsyncClusterNode, u) for u in _split(urls)]
        return AsyncRedisCluster.from_url(
            urls[0],
            startup_nodes=nodes[1:],
            max_connections=int(settings.ASYNC_MAX_CONNECTIONS),
            **options.kwargs,
        )
    if urls:
        pool = BoundedConnectionPool.from_url(
            urls[0], **_pool_limits(), **copied(options.kwargs, aredis.SSLConnection)
        )
        return aredis.Redis(connection_pool=pool)
    if options.sentinel is not None:
        arguments = dict(options.kwargs)
        tls = arguments.pop("ssl", False)
        connection_class = (
            async_sentinel.SentinelManagedSSLConnection
            if tls
            else async_sentinel.SentinelManagedConnection
        )
        return _sentinel_client(
            options.sentinel_manager(async_sentinel.Sentinel),
            options.sentinel.service,
            connection_class,
            copied(arguments, connection_class),
        )
    return client_like(sync)


def client_like(sync: Any) -> Any:
    """A ``redis.asyncio`` client to the server (or Sentinel service) of the redis-py
    client ``sync``, with its connection options and a bounded pool."""
    sync_pool = sync.connection_pool
    name = sync_pool.connection_class.__name__
    connection_class = _ASYNC_CONNECTIONS.get(name)
    if connection_class is None:
        raise ImproperlyConfigured(
            f"stock_locks.aio: no asyncio twin of the connection class {name!r}; "
            "configure the backend with a LOCATION"
        )
    arguments = copied(sync_pool.connection_kwargs, connection_class)
    if isinstance(sync_pool, SentinelConnectionPool):
        manager = sync_pool.sentinel_manager
        addresses = [
            (
                s.connection_pool.connection_kwargs["host"],
                s.connection_pool.connection_kwargs["port"],
            )
            for s in manager.sentinels
        ]
        sentinel = async_sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
            addresses,
            min_other_sentinels=manager.min_other_sentinels,
            sentinel_kwargs=copied(manager.sentinel_kwargs, aredis.Connection),
        )
        return _sentinel_client(
            sentinel,
            sync_pool.service_name,
            connection_class,
            arguments,
            is_master=sync_pool.is_master,
            check_connection=sync_pool.check_connection,
        )
    pool = BoundedConnectionPool(connection_class=connection_class, **_pool_limits(), **arguments)
    return aredis.Redis(connection_pool=pool)


def _sentinel_client(
    sentinel: Any, service: str, connection_class: type, arguments: dict[str, Any], **pool: Any
) -> Any:
    """A ``redis.asyncio`` client of ``service``'s primary, found through the asyncio
    ``sentinel`` (again after a failover, as the sync client), with a bounded pool."""
    for place in ("host", "port"):
        arguments.pop(place, None)  # (the primary is found through the sentinels)
    return aredis.Redis(
        connection_pool=BoundedSentinelConnectionPool(
            service,
            sentinel,
            connection_class=connection_class,
            **pool,
            **_pool_limits(),
            **arguments,
        )
    )


def names_its_redis(entry: dict[str, Any]) -> bool:
    """Whether a ``BACKENDS`` entry names its Redis itself (a LOCATION, or Sentinel
    options) rather than through a django-redis cache alias."""
    options = entry.get("OPTIONS") or {}
    return bool(entry.get("LOCATION")) or "SENTINELS" in options


def get_redis(alias: str | None = None) -> redis.Redis:
    """The raw redis-py client of stock_locks' own features (stock strategies, the
    delay queue, the sweeper, reconcile, the dashboard).

    Without ``alias``: when ``STOCK_LOCKS["BACKENDS"]["default"]`` is a Redis
    backend configured with a ``LOCATION`` (or Sentinel options), that backend's
    client (made once per process, shared with the locks; another backend class,
    e.g. RedLock's, is not used); otherwise the client of the django-redis cache
    ``STOCK_LOCKS["REDIS_ALIAS"]``. With ``alias``: always that django-redis
    cache's client.

    Raises ``NotImplementedError`` when the cache is not a django-redis backend,
    ``django.core.cache.InvalidCacheBackendError`` when it does not exist,
    ``ImproperlyConfigured`` for a malformed ``BACKENDS`` entry.
    """
    if alias is None and settings.BACKENDS and names_its_redis(backend_config(DEFAULT_ALIAS)):
        client: redis.Redis | None = getattr(get_backend(DEFAULT_ALIAS), "client", None)
        if client is not None:
            return client
    found: redis.Redis = get_redis_connection(alias or settings.REDIS_ALIAS)
    return found


# -- connections of their own, every step bounded ----------------------------------------


def accepted(connection_class: type) -> set[str]:
    """The keyword arguments ``connection_class`` takes (along its MRO)."""
    names: set[str] = set()
    for cls in connection_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            names.update(inspect.signature(init).parameters)
    return names


def copied(kwargs: dict[str, Any], connection_class: type) -> dict[str, Any]:
    """The arguments of ``kwargs`` an asyncio ``connection_class`` takes as they are."""
    names = accepted(connection_class)
    return {
        key: value
        for key, value in kwargs.items()
        if key in names and (key in _COPIED or key.startswith("ssl_"))
    }


def bounded_arguments(
    connection_class: type, kwargs: dict[str, Any], timeout: float
) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """(arguments, prelude) of a clean-up connection made by ``connection_class`` from
    a pool's ``kwargs``: every step (connect, send, reply) within ``timeout``, no
    retries, and no set-up round trip on connect (AUTH, SELECT and CLIENT SETINFO
    would each wait for a reply before the command leaves): the ``prelude``
    (AUTH, SELECT) is sent in the same packet as the command, so a request whose
    reply comes late still runs when it reaches the server."""
    overrides = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,
        "db": 0,
        "username": None,
        "password": None,
        "credential_provider": None,
        "client_name": None,
        **NO_HANDSHAKE,
    }
    names = accepted(connection_class)
    # (the pool's own arguments as they are: a Sentinel-managed connection takes its
    # pool among them; an override only where the class takes that argument)
    arguments = {**kwargs, **{k: v for k, v in overrides.items() if k in names or k in kwargs}}
    prelude: list[tuple[Any, ...]] = []
    provider = kwargs.get("credential_provider")
    credentials = (
        provider.get_credentials()
        if provider is not None
        else tuple(c for c in (kwargs.get("username"), kwargs.get("password")) if c)
    )
    if credentials:
        prelude.append(("AUTH", *credentials))
    if kwargs.get("db"):
        prelude.append(("SELECT", kwargs["db"]))
    return arguments, prelude


# -- asyncio pools -----------------------------------------------------------------------


def _pool_limits() -> dict[str, Any]:
    return {
        "max_connections": int(settings.ASYNC_MAX_CONNECTIONS),
        "timeout": float(settings.ASYNC_POOL_TIMEOUT),
    }


class _Bounded:
    """Mixed into a ``redis.asyncio`` connection pool: at most ``max_connections``
    connections in use, a caller beyond the bound waiting up to ``timeout`` seconds for
    one to come back (then ``ConnectionError("No connection available")``), as with
    redis-py's ``BlockingConnectionPool``. That one takes a condition and starts a
    timer on every call, a sixth of an uncontended lock cycle; this one does no more
    than the plain pool while a connection is free."""

    max_connections: int
    _in_use_connections: set[Any]
    _available_connections: list[Any]

    def __init__(self, *args: Any, timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout = timeout
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        deadline: float | None = None
        while True:
            if len(self._in_use_connections) < self.max_connections:
                try:
                    return await super().get_connection(*args, **kwargs)  # type: ignore[misc]
                except RedisConnectionError as exc:
                    # Taken meanwhile: the plain pool says so in these words (5.3 to 8.x).
                    if "Too many connections" not in str(exc):
                        raise
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + self.timeout
            turn = loop.create_future()
            self._waiters.append(turn)
            try:
                async with asyncio.timeout_at(deadline):
                    await turn
            except BaseException as exc:
                if turn.done() and not turn.cancelled():
                    self._wake_one()  # its turn came as it gave up: the next waiter's
                else:
                    turn.cancel()
                    self._waiters.remove(turn)
                if isinstance(exc, TimeoutError):
                    raise RedisConnectionError("No connection available.") from None
                raise

    async def release(self, connection: Any) -> None:
        await super().release(connection)  # type: ignore[misc]
        self._wake_one()

    def take_idle(self) -> Any:
        """An idle connected connection, now in use, or None (then ``get_connection``).
        No check that it is still connected: for a caller that sends again on its own
        connection error (every script is safe to repeat) and never returns a
        connection with a reply unread."""
        if self._available_connections:
            connection = self._available_connections.pop()
            if connection.is_connected:
                self._in_use_connections.add(connection)
                return connection
            self._available_connections.append(connection)
        return None

    def put_back(self, connection: Any) -> None:
        """Return a connection from :meth:`take_idle` (no I/O)."""
        self._in_use_connections.remove(connection)
        self._available_connections.append(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return


class BoundedConnectionPool(_Bounded, aredis.ConnectionPool):
    """A bounded ``redis.asyncio`` pool (:class:`_Bounded`)."""


class BoundedSentinelConnectionPool(_Bounded, async_sentinel.SentinelConnectionPool):
    """A bounded ``redis.asyncio`` pool of a Sentinel service's primary."""


def _split(urls: Sequence[str]) -> list[Any]:
    return [urlsplit(url) for url in urls]


def _node(node_class: Any, url: Any) -> Any:
    """A cluster seed node of ``node_class`` at ``url`` (a split URL)."""
    return node_class(url.hostname or "localhost", url.port or 6379)
