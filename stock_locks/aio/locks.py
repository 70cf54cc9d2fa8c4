"""``Lock`` and ``RedLock`` for asyncio: the sync classes' algorithms, awaited.

Each method here is one line: it runs the same ``*_steps`` generator as the
sync method of the same name (``stock_locks.locks``) with the asyncio driver
(:func:`stock_locks.lease.arun`) on the backend's asyncio transport. What
differs is who owns a hold and who renews it:

- The owner of a reentrant lock is the calling task (``asyncio.current_task()``)
  or the object given as ``owner=``; never a context variable, which child
  tasks would inherit. Each task re-enters only its own holds.
- Watchdog renewals run as one task per event loop, on the same
  :class:`~stock_locks.locks.RenewalSchedule` the renewal thread uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import weakref
from types import TracebackType
from typing import Any, Self

from .. import lease, locks
from ..backends.base import ASYNCIO
from ..exceptions import LockError, LockNotOwned
from ..holder import LockInfo, caller_of
from .runtime import resources

log = logging.getLogger("stock_locks.aio")


def _owner(explicit: Any) -> Any:
    if explicit is not None:
        return explicit
    task = asyncio.current_task()
    if task is None:
        raise LockError("a reentrant stock_locks.aio lock is used inside a task, or with owner=")
    return task


class _PerTask:
    """A reentrant lock's :class:`~stock_locks.locks._Hold` per owner (task)."""

    def __init__(self, owner: Any) -> None:
        self._explicit = owner
        self._holds: weakref.WeakKeyDictionary[Any, locks._Hold] = weakref.WeakKeyDictionary()

    @property
    def hold(self) -> locks._Hold:
        owner = _owner(self._explicit)
        hold = self._holds.get(owner)
        if hold is None:
            hold = self._holds[owner] = locks._Hold()
        return hold


# Each owner's reentrant holds: lock key -> [token, depth] (the sync side's per thread).
_owner_holds: weakref.WeakKeyDictionary[Any, dict[str, list]] = weakref.WeakKeyDictionary()


class AsyncLeaseGuard:
    """``async with`` for an asyncio primitive: acquire on entry (:class:`LockTimeout`
    when not granted), release on exit, as :class:`~stock_locks.locks.LeaseGuard`."""

    async def __aenter__(self) -> Self:
        if await self.acquire():  # type: ignore[attr-defined]
            return self
        raise self._not_granted()  # type: ignore[attr-defined]

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()  # type: ignore[attr-defined]
        except LockNotOwned:
            self._lost_before_exit(exc_type)  # type: ignore[attr-defined]

    def __enter__(self) -> Any:
        raise TypeError(f"{type(self).__name__} is asyncio's: use `async with`")

    def __exit__(self, *exc_info: Any) -> None:  # pragma: no cover (never entered)
        pass

    async def _arun(self, steps: lease.Steps[Any]) -> Any:
        return await lease.arun(steps, self.backend.aexecute)  # type: ignore[attr-defined]


def _check_asyncio(primitive: Any) -> None:
    if not primitive.backend.has(ASYNCIO):
        raise LockError(
            f"{type(primitive).__name__} {primitive.name!r}: backend "
            f"{primitive.backend.alias!r} does not support asyncio",
            name=primitive.name,
        )


class Lock(AsyncLeaseGuard, locks.Lock):
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
        _check_asyncio(self)

    def _per_owner(self) -> Any:
        return _PerTask(self._explicit_owner)

    def _owner_holds(self) -> dict[str, list]:
        owner = _owner(self._explicit_owner)
        holds = _owner_holds.get(owner)
        if holds is None:
            holds = _owner_holds[owner] = {}
        return holds

    def _renewer(self) -> AsyncWatchdog:
        found = resources()
        if found.watchdog is None:
            found.watchdog = AsyncWatchdog()
        return found.watchdog

    @property
    def fence(self) -> int | None:
        """The calling owner's fencing token of its last grant (None before the first,
        or for an adopted hold until :meth:`read_fence`)."""
        return self._hold().fence

    async def read_fence(self) -> int | None:
        """The calling owner's fence, read from the holder's record for an adopted hold
        (:class:`LockNotOwned` if its token no longer holds the lock)."""
        return await self._arun(self._fence_steps())

    async def acquire(  # type: ignore[override]
        self, blocking: bool | None = None, timeout: float | None = None
    ) -> bool:
        """As :meth:`stock_locks.Lock.acquire`, awaited."""
        return await self._arun(self._acquire_steps(blocking, timeout))

    async def release(self) -> None:  # type: ignore[override]
        """As :meth:`stock_locks.Lock.release`, awaited."""
        await self._arun(self._release_steps())

    async def extend(self, seconds: float | None = None) -> None:  # type: ignore[override]
        """As :meth:`stock_locks.Lock.extend`, awaited."""
        await self._arun(self._extend_steps(seconds))

    async def info(self) -> LockInfo | None:  # type: ignore[override]
        """As :meth:`stock_locks.Lock.info`, awaited."""
        return await self._arun(self._info_steps())

    async def remaining(self) -> float:  # type: ignore[override]
        """As :meth:`stock_locks.Lock.remaining`, awaited."""
        return await self._arun(self._remaining_steps())

    async def locked(self) -> bool:  # type: ignore[override]
        """Whether anyone holds the lock now (one round trip)."""
        return await self._arun(self._token_steps()) is not None

    async def owned(self) -> bool:  # type: ignore[override]
        """Whether the calling owner's token holds the lock now (one round trip)."""
        hold = self._hold()
        if hold.token is None or not hold.holds:
            return False
        return await self._arun(self._token_steps()) == hold.token


class RedLock(Lock, locks.RedLock):
    """:class:`stock_locks.RedLock` for asyncio (a majority of independent masters):
    same arguments and guarantees; every master of a round is asked at once."""


class AsyncWatchdog:
    """The renewal task of one event loop: the sync watchdog's schedule, awaited.

    The task starts with the first watchdog lock and ends when nothing has been
    registered for ``IDLE_WAIT`` seconds (the next lock starts it again)."""

    IDLE_WAIT = locks.Watchdog.IDLE_WAIT

    def __init__(self) -> None:
        self.schedule = locks.RenewalSchedule()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._wake_at = 0.0

    def add(self, lock: locks.Lock, hold: locks._Hold) -> None:
        renewal = self.schedule.add(lock, hold)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="stock_locks.aio watchdog"
            )
        elif renewal.due < self._wake_at:
            self._wake.set()

    def discard(self, entry: tuple[str, str]) -> None:
        self.schedule.discard(entry)

    def __len__(self) -> int:
        return len(self.schedule)

    async def _run(self) -> None:
        while True:
            batch = self.schedule.take_due()
            if not batch:
                wait = self.schedule.next_wait()
                woken = await self._sleep(self.IDLE_WAIT if wait is None else wait)
                if wait is None and not woken and not self.schedule.renewals:
                    return  # idle: the next add() starts the task again
                continue
            for backend, call, items in self.schedule.calls(batch):
                try:
                    results = await backend.aexecute(call)
                except Exception as exc:  # (the task must live on)
                    self.schedule.failed(items, exc)
                    continue
                self.schedule.settle(items, results)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until add() wakes it; whether it was woken."""
        self._wake.clear()
        self._wake_at = time.monotonic() + seconds
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._wake_at = 0.0

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
