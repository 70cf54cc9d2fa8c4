"""RedLock: one lock over N independent Redis masters, granted by a majority.

Configured as a ``BACKENDS`` alias::

    "redlock": {
        "BACKEND": "stock_locks.backends.redlock.RedLockBackend",
        "LOCATION": ["redis://a:6379/0", "redis://b:6379/0", "redis://c:6379/0"],
        "OPTIONS": {"NODE_TIMEOUT": 0.2, "RETRY_DELAY": 0.2},
    }

The rules are :mod:`.quorum` (pure functions), the operations :mod:`.backend`,
the transports :mod:`.transport` (redis-py) and :mod:`.aio_transport`
(``redis.asyncio``).
"""

from .backend import RedLockBackend

__all__ = ["RedLockBackend"]
