"""``Semaphore`` and ``FairSemaphore`` for asyncio: the sync classes' algorithms, awaited.

As with the locks (``stock_locks.aio.locks``), each method runs the sync
class's ``*_steps`` generator with the asyncio driver; a waiting coroutine
holds no connection (the event loop's wake-up listener wakes it; a fair
waiter's own wake-up list is one more key of that listener).
"""

from __future__ import annotations

import sys
from typing import Any

from .. import semaphores
from ..holder import caller_of
from .locks import AsyncLeaseGuard, _check_asyncio


class Semaphore(AsyncLeaseGuard, semaphores.Semaphore):
    """:class:`stock_locks.Semaphore` for asyncio: same arguments and guarantees; every
    method that talks to the backend is a coroutine (``async with sem:``).

    Cancellation: a task cancelled while waiting leaves nothing behind (a fair
    waiter leaves the queue); one cancelled after its grant but before it saw the
    reply gives the permit back, then the cancellation propagates."""

    def __init__(self, name: str, limit: int, ttl: float | None = None, **options: Any):
        options.setdefault("caller", caller_of(sys._getframe(1)))
        super().__init__(name, limit, ttl, **options)
        _check_asyncio(self)

    async def acquire(  # type: ignore[override]
        self, blocking: bool | None = None, timeout: float | None = None
    ) -> bool:
        """As :meth:`stock_locks.Semaphore.acquire`, awaited."""
        return await self._arun(self._acquire_steps(blocking, timeout))

    async def release(self) -> None:  # type: ignore[override]
        """As :meth:`stock_locks.Semaphore.release`, awaited."""
        await self._arun(self._release_steps())

    async def refresh(self, ttl: float | None = None) -> None:  # type: ignore[override]
        """As :meth:`stock_locks.Semaphore.refresh`, awaited."""
        await self._arun(self._refresh_steps(ttl))

    async def holders(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """As :meth:`stock_locks.Semaphore.holders`, awaited."""
        return semaphores.snapshot_of(await self._arun(self._state_steps()))["holders"]


class FairSemaphore(Semaphore, semaphores.FairSemaphore):
    """:class:`stock_locks.FairSemaphore` for asyncio: waiters admitted in arrival order."""
