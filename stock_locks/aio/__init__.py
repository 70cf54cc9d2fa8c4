"""stock_locks for asyncio: the same primitives, awaited.

``Lock``, ``RedLock``, ``Semaphore`` and ``FairSemaphore`` take the same
arguments and keep the same guarantees as their sync namesakes (they run the
same algorithms, Lua scripts and key layout), on a ``redis.asyncio`` client
per event loop made from the same backend settings. A waiting coroutine holds
no connection: one listener per event loop (per hash slot on a cluster)
wakes the waiters of every lock and semaphore. ``locked``, ``lock_model`` and
``limit_concurrency`` are the sync decorators: on an ``async def`` function or
view they use these primitives by themselves. :func:`aclose` closes what was
opened in the running loop (``asyncio.run`` closes it by itself).
"""

from ..decorators import limit_concurrency, lock_model, locked
from .locks import Lock, RedLock
from .runtime import aclose
from .semaphores import FairSemaphore, Semaphore

__all__ = [
    "FairSemaphore",
    "Lock",
    "RedLock",
    "Semaphore",
    "aclose",
    "limit_concurrency",
    "lock_model",
    "locked",
]
