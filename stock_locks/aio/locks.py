"""``Lock`` and ``RedLock`` for asyncio: siblings of the sync classes over the same
I/O-free core (:mod:`stock_locks.core.lock`), awaited.

Each method runs the same steps as the sync method of the same name, with the
asyncio driver on the backend's asyncio transport. What differs is who owns a
hold and who renews it:

- The owner of a reentrant lock is the calling task (``asyncio.current_task()``)
  or the object given as ``owner=``; never a context variable, which child
  tasks would inherit. Each task re-enters only its own holds.
- Watchdog renewals run as one task per event loop, on the same
  :class:`~stock_locks.watchdog.RenewalSchedule` the renewal thread uses.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import Any, TypeVar

from ..backends.base import ASYNCIO, Attempt
from ..conf import settings
from ..core.guard import AsyncLeaseGuard
from ..core.lock import Hold, LockCore, check_redlock
from ..exceptions import LockError
from ..holder import LockInfo, caller_of
from ..loops import resources
from ..watchdog import AsyncWatchdog

T = TypeVar("T")


def _owner(explicit: Any) -> Any:
    if explicit is not None:
        return explicit
    task = asyncio.current_task()
    if task is None:
        raise LockError("a reentrant stock_locks.aio lock is used inside a task, or with owner=")
    return task


class _PerTask:
    """A reentrant lock's :class:`~stock_locks.core.lock.Hold` per owner (task)."""

    def __init__(self, owner: Any) -> None:
        self._explicit = owner
        self._holds: weakref.WeakKeyDictionary[Any, Hold] = weakref.WeakKeyDictionary()

    @property
    def hold(self) -> Hold:
        owner = _owner(self._explicit)
        hold = self._holds.get(owner)
        if hold is None:
            hold = self._holds[owner] = Hold()
        return hold

    @hold.setter
    def hold(self, hold: Hold) -> None:
        self._holds[_owner(self._explicit)] = hold


# Each owner's reentrant holds in progress (the sync side's per thread).
_owner_holds: weakref.WeakKeyDictionary[Any, dict[str, Hold]] = weakref.WeakKeyDictionary()


def check_asyncio(primitive: Any) -> None:
    """:class:`LockError` unless the primitive's backend runs under asyncio."""
    if not primitive.backend.has(ASYNCIO):
        raise LockError(
            f"{type(primitive).__name__} {primitive.name!r}: backend "
            f"{primitive.backend.alias!r} does not support asyncio",
            name=primitive.name,
        )


def loop_watchdog() -> AsyncWatchdog:
    """The running event loop's renewal task's watchdog."""
    found = resources()
    if found.watchdog is None:
        found.watchdog = AsyncWatchdog()
    watchdog: AsyncWatchdog = found.watchdog
    return watchdog


class Lock(AsyncLeaseGuard, LockCore):
    """:class:`stock_locks.Lock` for asyncio: same arguments and guarantees.

    Every method that talks to the backend is a coroutine (``await
    lock.acquire()``, ``async with lock:``). A waiting ``acquire()`` holds no
    connection: it awaits a wake-up from the event loop's listener, bounded by
    the holder's lease and its timeout.

    ``owner``: who owns a reentrant lock's holds; default the calling task. Any
    object that can be weakly referenced (a request, a task). Child tasks are
    other owners.

    Cancellation: a task cancelled while waiting leaves nothing behind; one
    cancelled after its grant but before it saw the reply gives the grant back
    (one bounded round trip, shielded), then the cancellation propagates.

    ``fence`` gives the fence of the owner's last grant without I/O; for a hold
    adopted by ``token=`` it is None until ``await lock.read_fence()``.
    """

    _owner_word = "task"

    def __init__(self, name: str, ttl: float | None = None, *, owner: Any = None, **options: Any):
        options.setdefault("caller", caller_of(sys._getframe(1)))
        if owner is not None:
            try:
                weakref.ref(owner)
            except TypeError:
                raise LockError(
                    f"owner must be an object that can be weakly referenced, got {owner!r}",
                    name=name,
                ) from None
        self._explicit_owner = owner
        super().__init__(name, ttl, **options)
        check_asyncio(self)

    def _per_owner(self) -> Any:
        return _PerTask(self._explicit_owner)

    def _owner_holds(self) -> dict[str, Hold]:
        owner = _owner(self._explicit_owner)
        holds = _owner_holds.get(owner)
        if holds is None:
            holds = _owner_holds[owner] = {}
        return holds

    def _renewer(self) -> AsyncWatchdog:
        return loop_watchdog()

    @property
    def fence(self) -> int | None:
        """The calling owner's fencing token of its last grant (None before the first,
        or for an adopted hold until :meth:`read_fence`)."""
        return self._hold().fence

    async def read_fence(self) -> int | None:
        """The calling owner's fence, read from the holder's record for an adopted hold
        (:class:`LockNotOwned` if its token no longer holds the lock)."""
        return await self._arun(self._fence_steps())

    async def extend(self, seconds: float | None = None) -> None:
        """As :meth:`stock_locks.Lock.extend`, awaited."""
        await self._arun(self._extend_steps(seconds))

    async def info(self) -> LockInfo | None:
        """As :meth:`stock_locks.Lock.info`, awaited."""
        return await self._arun(self._info_steps())

    async def remaining(self) -> float:
        """As :meth:`stock_locks.Lock.remaining`, awaited."""
        return await self._arun(self._remaining_steps())

    async def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        return await self._arun(self._token_steps()) is not None

    async def owned(self) -> bool:
        """Whether the calling owner's token holds the lock now (one round trip)."""
        return await self._arun(self._owned_steps())

    async def do_acquire(self, token: str, count: int, waited: bool = False) -> Attempt:
        """As :meth:`stock_locks.Lock.do_acquire`, awaited."""
        return await self.backend.aexecute(self._try_call(token, count, waited))

    async def do_release(self, token: str, count: int, mode: str = "release") -> int:
        """As :meth:`stock_locks.Lock.do_release`, awaited."""
        return await self.backend.aexecute(self._release_call(token, count, mode))

    async def do_wait(self, seconds: float) -> bool:
        """As :meth:`stock_locks.Lock.do_wait`, awaited."""
        return await self.backend.aexecute(self._wait_call(seconds))


class RedLock(Lock):
    """:class:`stock_locks.RedLock` for asyncio (a majority of independent masters):
    same arguments and guarantees; every master of a round is asked at once."""

    def __init__(self, name: str, ttl: float | None = None, **options: Any) -> None:
        options.setdefault("backend", settings.REDLOCK_BACKEND)
        options.setdefault("caller", caller_of(sys._getframe(1)))
        super().__init__(name, ttl, **options)
        check_redlock(self)
