"""The ``redis.asyncio`` transport: performs the Redis backend's requests in one event
loop, as ``transport.py`` does on redis-py, with the same policies (they are the
requests module's).

- One client per backend and event loop (``stock_locks.loops``), built from the
  backend's options (``client.py``: a bounded pool, Sentinel followed).
- A wait is a future registered with the loop's :class:`WakeListener` for the
  node (per hash slot on a cluster), not a connection blocked in ``BLPOP``.
- A bounded request runs on a connection of its own, made by the pool's
  connection class from its arguments, every step within ``GIVE_BACK_TIMEOUT``,
  its set-up in the same packet as the request, shielded from a second
  cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...keys import key_slot
from ...loops import resources
from ..base import GIVE_BACK_TIMEOUT
from . import requests as rq
from .client import _Bounded, bounded_arguments
from .cluster import is_cluster
from .errors import NODE_ERRORS
from .listener import WakeListener
from .protocol import CommandHead

if TYPE_CHECKING:
    from .backend import RedisBackend


def transport_for(backend: RedisBackend) -> AsyncRedisTransport:
    """``backend``'s transport in the running event loop."""
    transport = resources().transport(backend, AsyncRedisTransport)
    assert isinstance(transport, AsyncRedisTransport)
    return transport


class AsyncRedisTransport:
    """Performs a Redis backend's requests in one event loop."""

    def __init__(self, backend: RedisBackend) -> None:
        self.backend = backend
        self._owns_client = backend.async_client is None
        self.client = backend.async_client or backend.make_async_client()
        self.cluster = is_cluster(self.client)
        self.listeners: dict[int | None, WakeListener] = {}
        self._node_clients: dict[str, Any] = {}
        self._by_type = rq.dispatch(self, bounded=False)
        self._bounded_by_type = rq.dispatch(self, bounded=True)

    def __repr__(self) -> str:
        return f"<AsyncRedisTransport of {self.backend!r}>"

    async def perform(self, request: Any) -> Any:
        return await self._by_type[type(request)](request)

    async def perform_bounded(self, request: Any) -> Any:
        return await self._bounded_by_type[type(request)](request)

    # -- requests ----------------------------------------------------------------------------

    async def script(self, request: rq.Script) -> Any:
        script, keys, argv, head, repeatable = request
        if repeatable and not self.cluster:
            return await _evalsha_once(self.client, script.sha, keys, argv, head)
        return await self.client.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)

    async def command(self, request: rq.Command) -> Any:
        return await self.client.execute_command(*request.args)

    async def pipeline(self, request: rq.Pipeline) -> list[Any]:
        node = await self._node_client(request.key) if self.cluster else self.client
        try:
            return await _pipelined(node, request.commands)
        except NODE_ERRORS:
            await self.refresh_routes(rq.RefreshRoutes())
            raise

    async def batch(self, request: rq.Batch) -> list[Any]:
        if not self.cluster:
            return await _pipelined(self.client, [command for _, command in request.commands])
        # (one call each, all at once: cluster pipelines vary by version)
        return list(
            await asyncio.gather(
                *(self.client.execute_command(*command) for _, command in request.commands),
                return_exceptions=True,
            )
        )

    async def pop(self, request: rq.Pop) -> bytes | None:
        slot = key_slot(request.key) if self.cluster else None
        listener = self.listeners.get(slot)
        if listener is None:
            listener = self.listeners[slot] = WakeListener(
                lambda: self._own_connection(request.key),
                self.client,
                slot,
                self._refresh_slot_map if self.cluster else None,
            )
        return b"1" if await listener.wait(request.key, request.seconds) else None

    async def pop_then(self, request: rq.PopThen) -> tuple[bytes | None, Any]:
        # (the wait goes through the loop's listener: the try is the caller's)
        return await self.pop(rq.Pop(request.key, request.seconds)), None

    async def refresh_routes(self, request: rq.RefreshRoutes) -> None:
        if self.cluster:
            await self._refresh_slot_map()

    async def blocking(self, request: rq.Blocking) -> Any:
        return await asyncio.to_thread(request.function)

    async def bounded(self, key: str | None, command: tuple[Any, ...]) -> Any:
        return await asyncio.shield(self._on_own_connection(key, command))

    # -- connections -------------------------------------------------------------------------

    async def _connection_spec(self, key: str | None) -> tuple[type, dict[str, Any]]:
        if self.cluster:
            await self.client.initialize()  # (once: a no-op when the slot map is known)
            node = (
                self.client.get_node_from_key(key)
                if key is not None
                else self.client.get_default_node()
            )
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

    async def _on_own_connection(self, key: str | None, command: tuple[Any, ...]) -> Any:
        connection_class, kwargs = await self._connection_spec(key)
        arguments, prelude = bounded_arguments(connection_class, kwargs, GIVE_BACK_TIMEOUT)
        connection = connection_class(**arguments)
        try:
            async with asyncio.timeout(GIVE_BACK_TIMEOUT):
                # (connect() first: a Sentinel-managed connection finds the primary there)
                await connection.connect()
                await connection.send_packed_command(connection.pack_commands([*prelude, command]))
                for _ in prelude:
                    await connection.read_response()
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


async def _pipelined(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))


async def _evalsha_once(
    client: Any, sha: str, keys: Sequence[str], argv: Sequence[Any], head: CommandHead | None
) -> Any:
    """EVALSHA on a pooled connection without ``execute_command``'s per-call work (and
    with ``head``, packing only ARGV). A transport error drops the connection and
    sends the call again through ``execute_command`` (the client's own retries):
    every script is safe to repeat. An error reply leaves it pooled; any other exception
    (a cancellation) drops the connection too, so that no reply of this call reaches its
    next user."""
    pool = client.connection_pool
    idle = pool.take_idle() if isinstance(pool, _Bounded) else None
    connection = idle or await pool.get_connection()
    try:
        if head is not None and connection.encoder.encoding == "utf-8":
            data = head.pack(connection.encoder.encode, argv)
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
    except ResponseError as exc:
        # (an error reply, read whole, e.g. NOSCRIPT: the connection stays usable, unless
        # READONLY says it reaches a replica now)
        if isinstance(exc, ReadOnlyError):
            await connection.disconnect()
        raise
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    finally:
        if idle is None:
            await pool.release(connection)
        else:
            pool.put_back(connection)
    return await client.execute_command("EVALSHA", sha, len(keys), *keys, *argv)
