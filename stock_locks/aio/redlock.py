"""The asyncio transport of :class:`~stock_locks.backends.redlock.RedLockBackend`.

A :class:`~stock_locks.backends.redlock.Round` sends each master its commands on
one pooled connection, all masters at once, and reads every reply within one
deadline of ``NODE_TIMEOUT``: a master that stalls costs at most that, a dead
one nothing, as on the sync side. A wait is a future registered with the
wake-up listener of the master the lock's waiters use (``MasterPop``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from ..backends.redis import TRANSPORT_ERRORS, Tool
from ..backends.redlock import SCRIPTS_BY_SHA, Failed, MasterPop, RedLockBackend, Round
from .listener import WakeListener
from .redis import client_from_url, client_like
from .runtime import resources

# A master that did not answer in time, or at all.
UNANSWERED: tuple[type[BaseException], ...] = (*TRANSPORT_ERRORS, TimeoutError)


def transport_for(backend: RedLockBackend) -> RedLockTransport:
    """``backend``'s transport in the running event loop."""
    return resources().transport(backend, RedLockTransport)  # type: ignore[return-value]


class RedLockTransport:
    """Performs a RedLock backend's requests in one event loop: one ``redis.asyncio``
    client per master."""

    def __init__(self, backend: RedLockBackend) -> None:
        self.backend = backend
        if backend.locations is not None:
            self.clients = [client_from_url(u, backend.client_kwargs) for u in backend.locations]
        else:
            self.clients = [client_like(client) for client in backend.clients]
        self.listeners: dict[int, WakeListener] = {}

    def __repr__(self) -> str:
        return f"<RedLockTransport of {self.backend!r}>"

    async def perform(self, request: Any) -> Any:
        if type(request) is Round:
            return await self._round(request.commands)
        if type(request) is MasterPop:
            return await self._pop(request)
        assert type(request) is Tool
        return await asyncio.to_thread(request.function, self.backend.clients)

    async def _round(self, commands: Sequence[Sequence[tuple]]) -> list[list[Any]]:
        deadline = asyncio.get_running_loop().time() + self.backend.node_timeout

        async def on_master(index: int, batch: Sequence[tuple]) -> list[Any]:
            if not batch:
                return []
            try:
                async with asyncio.timeout_at(deadline):
                    return await self._master_batch(index, batch)
            except UNANSWERED as exc:
                return [Failed(exc)] * len(batch)

        return list(await asyncio.gather(*(on_master(i, b) for i, b in enumerate(commands))))

    async def _master_batch(self, index: int, batch: Sequence[tuple]) -> list[Any]:
        pool = self.clients[index].connection_pool
        connection = await pool.get_connection()
        try:
            replies = await _send_and_read(connection, batch)
            unknown = [
                i
                for i, reply in enumerate(replies)
                if isinstance(reply, Failed) and isinstance(reply.error, NoScriptError)
            ]
            if unknown:  # this master restarted and lost its scripts: once more, with sources
                evals = [
                    ("EVAL", SCRIPTS_BY_SHA[batch[i][1]].script, *batch[i][2:]) for i in unknown
                ]
                for i, reply in zip(unknown, await _send_and_read(connection, evals), strict=True):
                    replies[i] = reply
            return replies
        except BaseException:
            await connection.disconnect(nowait=True)  # a late reply must not reach the next user
            raise
        finally:
            await pool.release(connection)

    async def _pop(self, request: MasterPop) -> bool:
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
        return await listener.wait(request.key, request.seconds)

    async def aclose(self) -> None:
        listeners, self.listeners = list(self.listeners.values()), {}
        for listener in listeners:
            await listener.aclose()
        for client in self.clients:
            await client.aclose()
            await client.connection_pool.disconnect()


async def _send_and_read(connection: Any, commands: Sequence[tuple]) -> list[Any]:
    await connection.send_packed_command(connection.pack_commands(commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await connection.read_response())
        except ResponseError as exc:  # an error reply: the connection stays usable
            replies.append(Failed(exc))
    return replies
