"""stock_locks: Redis locks and stock reservations that stop a Django shop from overselling.

Public API::

    from stock_locks import Lock, RedLock, LockInfo, Semaphore, FairSemaphore, DelayQueue
    from stock_locks import locked, lock_model, limit_concurrency
    from stock_locks.operations import inspect, force_release, release_held_by

Importing this package loads no models and touches no settings; names are
imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .decorators import limit_concurrency, lock_model, locked
    from .delayqueue import DelayQueue
    from .locks import Lock, LockInfo, RedLock
    from .semaphores import FairSemaphore, Semaphore

__all__ = [
    "DelayQueue",
    "FairSemaphore",
    "Lock",
    "LockInfo",
    "RedLock",
    "Semaphore",
    "limit_concurrency",
    "lock_model",
    "locked",
]

_WHERE = {
    "Lock": ".locks",
    "LockInfo": ".locks",
    "RedLock": ".locks",
    "Semaphore": ".semaphores",
    "FairSemaphore": ".semaphores",
    "DelayQueue": ".delayqueue",
    "locked": ".decorators",
    "lock_model": ".decorators",
    "limit_concurrency": ".decorators",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'stock_locks' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value
