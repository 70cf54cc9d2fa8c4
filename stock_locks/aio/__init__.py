"""stock_locks for asyncio: the same primitives, awaited.

``Lock``, ``RedLock``, ``Semaphore`` and ``FairSemaphore`` take the same
arguments and keep the same guarantees as their sync namesakes (siblings over
the same I/O-free core: the same algorithms, Lua scripts and key layout), on a
``redis.asyncio`` client per event loop made from the same backend settings. A
waiting coroutine holds no connection: one listener per event loop (per hash
slot on a cluster) wakes the waiters of every lock and semaphore. ``locked``,
``lock_model`` and ``limit_concurrency`` are the decorators of
``stock_locks.decorators``: on an ``async def`` function or view they use these
primitives, on a plain one the sync ones. :func:`aclose` closes what was opened
in the running loop (``asyncio.run`` closes it by itself).
"""

from .. import locks as sync_locks
from .. import semaphores as sync_semaphores
from ..guarded import Decorators, Primitives
from ..loops import aclose
from .locks import Lock, RedLock
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

# (stock_locks.decorators re-exports these: it imports this package, so the decorators
# over both sets of primitives are made here)
_decorators = Decorators(
    sync=Primitives(sync_locks.Lock, sync_semaphores.Semaphore, sync_semaphores.FairSemaphore),
    asyncio=Primitives(Lock, Semaphore, FairSemaphore),
)
locked = _decorators.locked
lock_model = _decorators.lock_model
limit_concurrency = _decorators.limit_concurrency
