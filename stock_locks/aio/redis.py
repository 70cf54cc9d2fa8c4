"""The asyncio transport of :class:`~stock_locks.backends.redis.RedisBackend`.

The backend's operations (its generators of :class:`Eval`, :class:`Pop`, ...
requests) are the same as on the sync side; this module performs the requests
on ``redis.asyncio``, one client per event loop (``stock_locks.aio.runtime``):

- The client is built from what the sync client is built from: the backend's
  ``LOCATION`` and ``OPTIONS`` (a Redis Cluster with ``OPTIONS["CLUSTER"]``), or
  the django-redis alias (its connection pool's host, port, db, credentials,
  TLS and timeouts). Its pool is bounded: at most
  ``STOCK_LOCKS["ASYNC_MAX_CONNECTIONS"]`` connections per server, a call
  waiting up to ``ASYNC_POOL_TIMEOUT`` for a free one.
- A wait is a future registered with the loop's :class:`WakeListener` for the
  node (per hash slot on a cluster), not a connection blocked in ``BLPOP``.
- A clean-up call (``bounded``) runs on a connection of its own, every step
  within ``GIVE_BACK_TIMEOUT``, shielded from a second cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aredis
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import scripts
from ..backends.redis import (
    Batch,
    Command,
    CommandHead,
    Eval,
    GrantConfirmed,
    Pop,
    RedisBackend,
    Tool,
    bulk,
)
from ..conf import settings
from ..connection import is_cluster
from ..keys import key_slot
from ..roundtrip import GIVE_BACK_TIMEOUT, NO_HANDSHAKE
from .listener import WakeListener
from .runtime import resources

# The sync connection arguments an asyncio connection takes as they are (others, such
# as a parser class or a retry policy, are the sync client's own objects).
_COPIED = frozenset(
    {"host", "port", "path", "db", "username", "password", "credential_provider",
     "socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
     "client_name", "health_check_interval", "protocol", "encoding", "encoding_errors",
     "decode_responses", "lib_name", "lib_version", "driver_info"}
)  # fmt: skip
_ASYNC_CONNECTIONS = {
    "Connection": aredis.Connection,
    "SSLConnection": aredis.SSLConnection,
    "UnixDomainSocketConnection": aredis.UnixDomainSocketConnection,
}


def transport_for(backend: RedisBackend) -> RedisTransport:
    """``backend``'s transport in the running event loop."""
    return resources().transport(backend, RedisTransport)  # type: ignore[return-value]


def _accepted(connection_class: type) -> set[str]:
    names: set[str] = set()
    for cls in connection_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            names.update(inspect.signature(init).parameters)
    return names


class BoundedConnectionPool(aredis.ConnectionPool):
    """A ``redis.asyncio`` connection pool of at most ``max_connections`` connections in
    use, where a caller beyond the bound waits up to ``timeout`` seconds for one to come
    back (then ``ConnectionError("No connection available")``), as with redis-py's
    ``BlockingConnectionPool``. That one takes a condition and starts a timer on every
    call, a sixth of an uncontended lock cycle; this one does no more than the plain
    pool while a connection is free."""

    def __init__(self, *, timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout = timeout
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        deadline: float | None = None
        while True:
            if len(self._in_use_connections) < self.max_connections:
                try:
                    return await super().get_connection(*args, **kwargs)
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
        await super().release(connection)
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


def _pool_limits() -> dict[str, Any]:
    return {
        "max_connections": int(settings.ASYNC_MAX_CONNECTIONS),
        "timeout": float(settings.ASYNC_POOL_TIMEOUT),
    }


def async_client(backend: RedisBackend) -> Any:
    """A ``redis.asyncio`` client made like the backend's sync client (see the module)."""
    if backend.location:
        kwargs = backend.client_kwargs()
        if backend.options.get("CLUSTER"):
            return _async_cluster(backend.location, kwargs)
        if not isinstance(backend.location, str):
            raise ImproperlyConfigured(
                f"stock_locks backend {backend.alias!r}: LOCATION is one redis:// URL"
            )
        return client_from_url(backend.location, kwargs)
    return client_like(backend.client)  # django-redis's: its location and options


def _copied(kwargs: dict[str, Any], connection_class: type) -> dict[str, Any]:
    accepted = _accepted(connection_class)
    return {
        key: value
        for key, value in kwargs.items()
        if key in accepted and (key in _COPIED or key.startswith("ssl_"))
    }


def client_from_url(url: str, kwargs: dict[str, Any]) -> Any:
    """A ``redis.asyncio`` client of ``url`` with a bounded pool (sync-only options dropped)."""
    pool = BoundedConnectionPool.from_url(
        url, **_pool_limits(), **_copied(kwargs, aredis.SSLConnection)
    )
    return aredis.Redis(connection_pool=pool)


def client_like(sync_client: Any) -> Any:
    """A ``redis.asyncio`` client to the server of the redis-py client ``sync_client``,
    with its connection options and a bounded pool."""
    sync_pool = sync_client.connection_pool
    name = sync_pool.connection_class.__name__
    connection_class = _ASYNC_CONNECTIONS.get(name)
    if connection_class is None:
        raise ImproperlyConfigured(
            f"stock_locks.aio: no asyncio twin of the connection class {name!r}; "
            "configure the backend with a LOCATION"
        )
    pool = BoundedConnectionPool(
        connection_class=connection_class,
        **_pool_limits(),
        **_copied(sync_pool.connection_kwargs, connection_class),
    )
    return aredis.Redis(connection_pool=pool)


def _async_cluster(location: str | Sequence[str], kwargs: dict[str, Any]) -> Any:
    from urllib.parse import urlsplit

    from redis.asyncio.cluster import ClusterNode, RedisCluster

    urls = [location] if isinstance(location, str) else list(location)
    seeds = [ClusterNode(u.hostname or "localhost", u.port or 6379) for u in map(urlsplit, urls)]
    return RedisCluster.from_url(
        urls[0],
        startup_nodes=seeds[1:],
        max_connections=int(settings.ASYNC_MAX_CONNECTIONS),
        **kwargs,
    )


class RedisTransport:
    """Performs a Redis backend's requests in one event loop."""

    def __init__(self, backend: RedisBackend) -> None:
        self.backend = backend
        self._owns_client = backend.async_client is None
        self.client = backend.async_client or async_client(backend)
        self.cluster = is_cluster(self.client)
        self.listeners: dict[int | None, WakeListener] = {}
        self._node_clients: dict[str, Any] = {}
        self._by_type: dict[type, Callable[[Any], Awaitable[Any]]] = {
            Eval: self._eval,
            Pop: self._pop,
            Batch: self._batch,
            Command: self._command,
            GrantConfirmed: self._grant_confirmed,
            Tool: self._tool,
        }

    def __repr__(self) -> str:
        return f"<RedisTransport of {self.backend!r}>"

    async def perform(self, request: Any) -> Any:
        return await self._by_type[type(request)](request)

    # -- requests ----------------------------------------------------------------------------

    async def _eval(self, request: Eval) -> Any:
        script, keys, argv, bounded, head = request
        if bounded:
            return await asyncio.shield(self._bounded_eval(script, keys, argv))
        client = self.client
        try:
            if not self.cluster:
                return await _evalsha_once(client, script.sha, keys, argv, head)
            return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)
        except NoScriptError:
            await client.script_load(script.script)
            return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)

    async def _pop(self, request: Pop) -> bool:
        slot = key_slot(request.key) if self.cluster else None
        listener = self.listeners.get(slot)
        if listener is None:
            listener = self.listeners[slot] = WakeListener(
                lambda: self._own_connection(request.key),
                self.client,
                slot,
                self._refresh_slot_map if self.cluster else None,
            )
        return await listener.wait(request.key, request.seconds)

    async def _batch(self, request: Batch) -> list:
        if self.cluster:  # (one call each, all at once: cluster pipelines vary by version)
            return list(
                await asyncio.gather(
                    *(self._eval(Eval(*call)) for call in request.calls), return_exceptions=True
                )
            )
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            for script, keys, argv in request.calls:
                pipe.evalsha(script.sha, len(keys), *keys, *argv)
            results = await pipe.execute(raise_on_error=False)
            missing = {
                id(request.calls[i][0]): request.calls[i][0]
                for i, reply in enumerate(results)
                if isinstance(reply, NoScriptError)
            }
            if not missing or attempt:
                break
            for script in missing.values():
                await self.client.script_load(script.script)
        return results

    async def _command(self, request: Command) -> Any:
        return await self.client.execute_command(*request.args)

    async def _tool(self, request: Tool) -> Any:
        return await asyncio.to_thread(request.function, self.backend.client)

    async def _grant_confirmed(self, request: GrantConfirmed) -> tuple[Any, Any]:
        keys, argv, replicas, wait_ms = request
        # WAIT counts the replicas that have this connection's writes: one pipeline on
        # the connection of the key's own master.
        node = await self._node_client(keys[0]) if self.cluster else self.client
        for _ in range(2):
            pipe = node.pipeline(transaction=False)
            pipe.evalsha(*_evalsha_args(request))
            pipe.execute_command("WAIT", replicas, wait_ms)
            reply, confirmed = await pipe.execute(raise_on_error=False)
            if not isinstance(reply, NoScriptError):
                break
            await node.script_load(scripts.LOCK_ACQUIRE.script)
        if isinstance(reply, Exception):
            raise reply
        return reply, confirmed

    # -- connections -------------------------------------------------------------------------

    async def _connection_spec(self, key: str) -> tuple[type, dict[str, Any]]:
        if self.cluster:
            await self.client.initialize()  # (once: a no-op when the slot map is known)
            node = self.client.get_node_from_key(key)
            return node.connection_class, dict(node.connection_kwargs)
        pool = self.client.connection_pool
        return pool.connection_class, dict(pool.connection_kwargs)

    async def _own_connection(self, key: str) -> Any:
        """A new connection (not pooled) to the node serving ``key``, connected."""
        connection_class, kwargs = await self._connection_spec(key)
        connection = connection_class(**kwargs)
        await connection.connect()
        return connection

    async def _node_client(self, key: str) -> Any:
        connection_class, kwargs = await self._connection_spec(key)
        name = f"{kwargs.get('host')}:{kwargs.get('port')}"
        client = self._node_clients.get(name)
        if client is None:
            pool = aredis.ConnectionPool(connection_class=connection_class, **kwargs)
            client = self._node_clients[name] = aredis.Redis(connection_pool=pool)
        return client

    async def _refresh_slot_map(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.nodes_manager.initialize()

    async def _bounded_eval(self, script: Any, keys: Sequence[str], argv: Sequence) -> Any:
        connection_class, kwargs = await self._connection_spec(keys[0])
        kwargs.update(
            socket_timeout=GIVE_BACK_TIMEOUT,
            socket_connect_timeout=GIVE_BACK_TIMEOUT,
            retry=None,
            **{k: v for k, v in NO_HANDSHAKE.items() if k in _accepted(connection_class)},
        )
        connection = connection_class(**kwargs)
        try:
            async with asyncio.timeout(GIVE_BACK_TIMEOUT):
                await connection.connect()
                await connection.send_command("EVALSHA", script.sha, len(keys), *keys, *argv)
                try:
                    return await connection.read_response()
                except NoScriptError:
                    await connection.send_command("EVAL", script.script, len(keys), *keys, *argv)
                    return await connection.read_response()
        except TimeoutError as exc:
            raise RedisTimeoutError(f"no reply within {GIVE_BACK_TIMEOUT}s") from exc
        finally:
            with contextlib.suppress(Exception):
                await connection.disconnect()

    async def aclose(self) -> None:
        listeners, self.listeners = list(self.listeners.values()), {}
        for listener in listeners:
            await listener.aclose()
        nodes, self._node_clients = list(self._node_clients.values()), {}
        for node in nodes:
            await node.aclose()
            await node.connection_pool.disconnect()
        if self._owns_client:
            await self.client.aclose()
            pool = getattr(self.client, "connection_pool", None)
            if pool is not None:
                await pool.disconnect()


def _evalsha_args(request: GrantConfirmed) -> tuple:
    return (scripts.LOCK_ACQUIRE.sha, len(request.keys), *request.keys, *request.argv)


async def _evalsha_once(
    client: Any, sha: str, keys: Sequence[str], argv: Sequence, head: CommandHead | None
) -> Any:
    """EVALSHA on a pooled connection without ``execute_command``'s per-call work (and
    with ``head``, packing only ARGV). A transport error drops the connection and
    sends the call again through ``execute_command`` (the client's own retries):
    every script is safe to repeat. Any other exception (a cancellation) drops the
    connection too, so that no reply of this call reaches its next user."""
    pool = client.connection_pool
    idle = pool.take_idle() if type(pool) is BoundedConnectionPool else None
    connection = idle or await pool.get_connection()
    try:
        if head is not None and connection.encoder.encoding == "utf-8":
            encode = connection.encoder.encode
            size = b"*%d\r\n" % (head.count + len(argv))
            data = size + head.data + b"".join(bulk(encode(a)) for a in argv)
            # (what send_packed_command does, without its timer task per call: the bytes
            # reach the socket at once unless its buffer is full)
            writer = connection._writer
            writer.write(data)
            if writer.transport.get_write_buffer_size():
                await asyncio.wait_for(writer.drain(), connection.socket_timeout)
        else:
            await connection.send_command("EVALSHA", sha, len(keys), *keys, *argv)
        return await connection.read_response()
    except (RedisConnectionError, RedisTimeoutError, TimeoutError):
        await connection.disconnect()
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    finally:
        if idle is None:
            await pool.release(connection)
        else:
            pool.put_back(connection)
    return await client.execute_command("EVALSHA", sha, len(keys), *keys, *argv)
