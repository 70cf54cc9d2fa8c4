"""The ``redis.asyncio`` transport of RedLock: the same :class:`~.transport.Round`, every
master asked at once on one pooled connection each, every reply read within one
deadline of ``NODE_TIMEOUT``; a wait is a future registered with the wake-up
listener of the master the lock's waiters use (:class:`~.transport.MasterPop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from ...loops import resources
from ..redis.client import async_client
from ..redis.errors import UNAVAILABLE_ERRORS
from ..redis.listener import WakeListener
from ..redis.requests import Blocking
from .quorum import Failed
from .transport import MasterPop, Round

if TYPE_CHECKING:
    from .backend import RedLockBackend

# A master that did not answer in time, or at all.
UNANSWERED: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, TimeoutError)


def transport_for(backend: RedLockBackend) -> AsyncRedLockTransport:
    """``backend``'s transport in the running event loop."""
    transport = resources().transport(backend, AsyncRedLockTransport)
    assert isinstance(transport, AsyncRedLockTransport)
    return transport


class AsyncRedLockTransport:
    """Performs a RedLock backend's requests in one event loop: one ``redis.asyncio``
    client per master, made like its sync client."""

    def __init__(self, backend: RedLockBackend) -> None:
        self.backend = backend
        self.clients = [
            async_client(options, client)
            for options, client in zip(backend.masters, backend.clients, strict=True)
        ]
        self.listeners: dict[int, WakeListener] = {}

    def __repr__(self) -> str:
        return f"<AsyncRedLockTransport of {self.backend!r}>"

    async def perform(self, request: Any) -> Any:
        if type(request) is Round:
            return await self._round(request.commands)
        if type(request) is MasterPop:
            return await self._pop(request)
        assert type(request) is Blocking
        return await asyncio.to_thread(request.function)

    async def _round(self, commands: Sequence[Sequence[tuple[Any, ...]]]) -> list[list[Any]]:
        deadline = asyncio.get_running_loop().time() + self.backend.node_timeout

        async def on_master(index: int, batch: Sequence[tuple[Any, ...]]) -> list[Any]:
            if not batch:
                return []
            try:
                async with asyncio.timeout_at(deadline):
                    return await self._master_batch(index, batch)
            except UNANSWERED as exc:
                return [Failed(exc)] * len(batch)

        return list(await asyncio.gather(*(on_master(i, b) for i, b in enumerate(commands))))

    async def _master_batch(self, index: int, batch: Sequence[tuple[Any, ...]]) -> list[Any]:
        pool = self.clients[index].connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command(connection.pack_commands(batch))
            replies: list[Any] = []
            for _ in batch:
                try:
                    replies.append(await connection.read_response())
                except ResponseError as exc:  # an error reply: the connection stays usable
                    replies.append(Failed(exc))
            return replies
        except BaseException:
            await connection.disconnect(nowait=True)  # a late reply must not reach the next user
            raise
        finally:
            await pool.release(connection)

    async def _pop(self, request: MasterPop) -> bytes | None:
        listener = self.listeners.get(request.master)
        if listener is None:
            pool = self.clients[request.master].connection_pool

            async def connect() -> Any:
                connection = pool.connection_class(**pool.connection_kwargs)
                await connection.connect()
                return connection

            listener = self.listeners[request.master] = WakeListener(
                connect, self.clients[request.master], None
            )
        return b"1" if await listener.wait(request.key, request.seconds) else None

    async def aclose(self) -> None:
        listeners, self.listeners = list(self.listeners.values()), {}
        for listener in listeners:
            await listener.aclose()
        for client in self.clients:
            await client.aclose()
            await client.connection_pool.disconnect()
