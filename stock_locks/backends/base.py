"""What every backend provides, and what it may declare it lacks.

A backend is one coordinator (one Redis, a Redis Cluster, RedLock over N
masters, ZooKeeper) seen through the primitive operations the lease
algorithms (``stock_locks.lease``) ask for. Each operation is a method
``verb(*args, bounded=False)``; ``bounded=True`` asks for a clean-up run on a
connection of its own with every step bounded. Backends translate their
transport errors into :class:`~stock_locks.exceptions.BackendUnavailable`
(one type for callers and views), and nothing else.

Capabilities say what a backend guarantees, so that code needing one can
refuse a backend without it (a system check, a skipped contract test):

- ``FENCED``: every grant carries a fencing token greater than every earlier
  grant's for the same name.
- ``LEASED``: a grant ends by itself after its ttl; ``extend()`` and the
  watchdog renew it. (A session-bound backend ends it with the session.)
- ``SESSION_BOUND``: a grant lasts as long as the client's session, not a ttl.
- ``SERVER_CLOCK``: lease ends and grant times come from the coordinator's clock.
- ``WAKE_UP``: a release wakes a waiter; waiting costs no polling.
- ``HOLDER_METADATA``: host, pid, thread, caller and grant time of each holder
  can be read back (the admin page shows them).
- ``SEMAPHORES``: ``Semaphore`` and ``FairSemaphore`` run on it.
- ``FORCE_RELEASE``: an operator can free a lock whoever holds it.
- ``ASYNCIO``: ``stock_locks.aio``'s primitives run on it (:meth:`Backend.aexecute`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..lease import Call

FENCED = "fenced"
LEASED = "leased"
SESSION_BOUND = "session_bound"
SERVER_CLOCK = "server_clock"
WAKE_UP = "wake_up"
HOLDER_METADATA = "holder_metadata"
SEMAPHORES = "semaphores"
FORCE_RELEASE = "force_release"
ASYNCIO = "asyncio"

ALL_CAPABILITIES = frozenset(
    {FENCED, LEASED, SESSION_BOUND, SERVER_CLOCK, WAKE_UP, HOLDER_METADATA, SEMAPHORES,
     FORCE_RELEASE, ASYNCIO}
)  # fmt: skip


class Backend:
    """Base of every backend: an alias, declared capabilities, and ``execute``.

    Lock operations (the ``lock`` argument is the :class:`~stock_locks.locks.Lock`
    asking, which carries its name, ``keys`` from :meth:`lock_keys`, lease and
    holder label):

    - ``lock_try(lock, token, depth, waited) -> Attempt``
    - ``lock_release(lock, token, depth, mode) -> int`` (``RELEASED``,
      ``STILL_HELD``, ``NOT_OWNED``; ``mode`` is release, abandon or force)
    - ``lock_extend(lock, token, ttl_ms, max_hold_ms) -> int`` (1, 0, ``CAPPED``)
    - ``lock_wait(lock, seconds) -> bool`` (woken before ``seconds`` passed)
    - ``lock_inspect(name, keys) -> LockInfo | None``
    - ``renew_many(renewals) -> list`` (watchdog: each an extend, batched)

    Semaphore operations: ``semaphore_try``, ``semaphore_release``,
    ``semaphore_refresh``, ``semaphore_wait``, ``semaphore_state``.
    """

    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias!r}>"

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def execute(self, call: Call) -> Any:
        """Perform ``call`` (the synchronous drivers' one entry point)."""
        return getattr(self, call.verb)(*call.args, bounded=call.bounded)

    async def aexecute(self, call: Call) -> Any:
        """Perform ``call`` under asyncio (the asyncio drivers' one entry point); only
        on a backend that declares ``ASYNCIO``."""
        raise NotImplementedError(f"{self!r} does not support asyncio")

    def lock_keys(self, name: str) -> Any:
        """Where lock ``name`` lives on this backend. Raises ValueError for a bad name."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop connections this backend opened itself (not a shared client's)."""
