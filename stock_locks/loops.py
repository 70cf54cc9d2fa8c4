"""What stock_locks keeps per event loop, and its closing with the loop.

Every asyncio client, wake-up listener and watchdog task belongs to one event
loop (a ``redis.asyncio`` connection cannot be used from another). They live in
the loop's :class:`LoopResources`, made on first use inside that loop. A keeper
task waits for the loop's end: ``asyncio.run`` (and so uvicorn, Django's ASGI
test client, ``async_to_sync``) cancels every task before it closes the loop,
and the keeper then closes the clients and stops the tasks. :func:`aclose`
does the same on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("stock_locks.aio")


class Transport(Protocol):
    """An asyncio transport of one backend in one event loop."""

    async def perform(self, request: Any) -> Any: ...

    async def aclose(self) -> None: ...


class LoopResources:
    """One event loop's transports (by backend) and watchdog."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transports: dict[Any, Transport] = {}
        self.watchdog: Any = None
        self.closed = False
        self._keeper = loop.create_task(self._keep(), name="stock_locks.aio keeper")

    def transport(self, backend: Any, make: Callable[[Any], Transport]) -> Transport:
        """``backend``'s transport in this loop, made by ``make(backend)`` on first use."""
        transport = self.transports.get(backend)
        if transport is None:
            transport = self.transports[backend] = make(backend)
        return transport

    async def _keep(self) -> None:
        try:
            await asyncio.Event().wait()  # until the loop's end cancels every task
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Stop the watchdog and close every transport (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if _by_loop.get(self.loop) is self:
            del _by_loop[self.loop]
        if self.watchdog is not None:
            await self.watchdog.stop()
        transports, self.transports = list(self.transports.values()), {}
        for transport in transports:
            try:
                await transport.aclose()
            except Exception as exc:  # (closing must go on: the loop is ending)
                log.debug("closing %r: %s", transport, exc)
        if asyncio.current_task() is not self._keeper:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopResources] = (
    weakref.WeakKeyDictionary()
)


def resources() -> LoopResources:
    """The running loop's :class:`LoopResources` (made on first use).

    Raises RuntimeError outside a running event loop.
    """
    loop = asyncio.get_running_loop()
    found = _by_loop.get(loop)
    if found is None:
        found = _by_loop[loop] = LoopResources(loop)
    return found


async def aclose() -> None:
    """Close what stock_locks opened in the running loop (clients, listener
    connections, the watchdog task). The next use opens them again. Held locks
    are not released: their leases run out (or release them first)."""
    found = _by_loop.get(asyncio.get_running_loop())
    if found is not None:
        await found.aclose()
