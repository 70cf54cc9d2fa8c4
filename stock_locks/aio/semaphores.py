"""``Semaphore`` and ``FairSemaphore`` for asyncio: siblings of the sync classes over the
same I/O-free core (:mod:`stock_locks.core.semaphore`), awaited.

A waiting coroutine holds no connection: the event loop's wake-up listener wakes
it (a fair waiter's own wake-up list is one more key of that listener).
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from ..backends.base import Attempt
from ..core.guard import AsyncLeaseGuard
from ..core.semaphore import SemaphoreCore, snapshot_of
from ..holder import caller_of
from .locks import check_asyncio

T = TypeVar("T")


class Semaphore(AsyncLeaseGuard, SemaphoreCore):
    """:class:`stock_locks.Semaphore` for asyncio: same arguments and guarantees; every
    method that talks to the backend is a coroutine (``async with sem:``).

    Cancellation: a task cancelled while waiting leaves nothing behind (a fair
    waiter leaves the queue); one cancelled after its grant but before it saw the
    reply gives the permit back, then the cancellation propagates."""

    def __init__(self, name: str, limit: int, ttl: float | None = None, **options: Any):
        options.setdefault("caller", caller_of(sys._getframe(1)))
        super().__init__(name, limit, ttl, **options)
        check_asyncio(self)

    async def refresh(self, ttl: float | None = None) -> None:
        """As :meth:`stock_locks.Semaphore.refresh`, awaited."""
        await self._arun(self._refresh_steps(ttl))

    async def holders(self) -> list[dict[str, Any]]:
        """As :meth:`stock_locks.Semaphore.holders`, awaited."""
        holders: list[dict[str, Any]] = snapshot_of(await self._arun(self._state_steps()))[
            "holders"
        ]
        return holders

    async def do_acquire(self, patience_ms: int) -> Attempt:
        """As :meth:`stock_locks.Semaphore.do_acquire`, awaited."""
        attempt = await self.backend.aexecute(self._try(patience_ms))
        if not attempt.granted:
            self._on_refused(attempt)
        return attempt

    async def do_release(self, abandon: bool = False) -> bool:
        """As :meth:`stock_locks.Semaphore.do_release`, awaited."""
        return await self.backend.aexecute(self._releasing(abandon)) == 1

    async def do_wait(self, seconds: float) -> bool:
        """As :meth:`stock_locks.Semaphore.do_wait`, awaited."""
        return await self.backend.aexecute(self._wait_call(seconds))


class FairSemaphore(Semaphore):
    """:class:`stock_locks.FairSemaphore` for asyncio: waiters admitted in arrival order."""

    fair = True
