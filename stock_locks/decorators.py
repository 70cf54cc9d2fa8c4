"""Decorators that run a function, view or Celery task under a lock or a semaphore:
``locked``, ``lock_model``, ``limit_concurrency`` (see :mod:`stock_locks.guarded`
for what they answer and raise). On an ``async def`` function or view they use
the :mod:`stock_locks.aio` primitives by themselves, on a plain one the sync ones.

(They are made in :mod:`stock_locks.aio` over both sets of primitives, and are the
same objects here: a package that imported this module could not be imported by it.)
"""

from __future__ import annotations

from .aio import limit_concurrency, lock_model, locked
from .guarded import (
    locked_response,
    stale_fence_response,
    too_many_response,
    unavailable_response,
)

__all__ = [
    "limit_concurrency",
    "lock_model",
    "locked",
    "locked_response",
    "stale_fence_response",
    "too_many_response",
    "unavailable_response",
]
