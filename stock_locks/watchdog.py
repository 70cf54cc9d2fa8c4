"""Lease renewal of watchdog locks: one schedule, a thread per process and a task per
event loop that run it.

:class:`RenewalSchedule` decides which watchdog locks to renew when and what each
renewal's outcome means, with no I/O and no threads. :class:`Watchdog` runs it
in one daemon thread per process (``Lock(watchdog=True)``), :class:`AsyncWatchdog`
in one task per event loop (``stock_locks.aio.Lock(watchdog=True)``). Renewals
of one backend that fall due together go in one ``renew_many`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, cast

from . import metrics
from .backends.base import Backend, Call, ExtendOutcome, LockBackend, LockSpec, call

if TYPE_CHECKING:
    from .core.lock import Hold, LockCore

renewal_log = logging.getLogger("stock_locks.lock.renewal")

Entry = tuple[str, str]  # (lock key, token)
Batch = list[tuple[Entry, "Renewal"]]


class Renewal:
    """One watchdog lock: what to renew, and when."""

    __slots__ = (
        "hold", "backend", "name", "spec", "token", "ttl_ms", "max_hold", "max_hold_ms",
        "interval", "due",
    )  # fmt: skip

    def __init__(self, lock: LockCore, hold: Hold) -> None:
        # Weak: an owner whose Lock object (or thread, for a reentrant lock) is gone
        # is no longer renewed either.
        self.hold = weakref.ref(hold)
        self.backend: Backend = lock.backend
        self.name = lock.name
        self.spec: LockSpec = lock.spec
        self.token = str(hold.token)
        self.ttl_ms = lock.spec.ttl_ms
        self.max_hold = lock.max_hold
        self.max_hold_ms = lock.max_hold_ms  # 0: no cap
        self.interval = lock.ttl / 3
        self.due = time.monotonic() + self.interval


class RenewalSchedule:
    """Which watchdog locks to renew when, and what each renewal's outcome means.

    Each lock is renewed every ``ttl / 3`` seconds; locks falling due within the
    next quarter interval are renewed with it, in one ``renew_many`` call per
    backend. A lock whose renewal finds its token gone is dropped and marked
    ``lost``; so is one whose renewal was cut by its ``max_hold`` (the lease then
    ends at the cap, on the Redis clock). Only weak references to the holds are
    kept, so a Lock object that is garbage-collected without release is no
    longer renewed either.
    """

    def __init__(self) -> None:
        self.renewals: dict[Entry, Renewal] = {}

    def add(self, lock: LockCore, hold: Hold) -> Renewal:
        renewal = Renewal(lock, hold)
        self.renewals[(lock.keys.lock, renewal.token)] = renewal
        return renewal

    def discard(self, entry: Entry) -> None:
        self.renewals.pop(entry, None)

    def __len__(self) -> int:
        return len(self.renewals)

    def take_due(self) -> Batch:
        """The renewals due now (their next due time set already)."""
        now = time.monotonic()
        batch = []
        for entry, renewal in list(self.renewals.items()):
            if renewal.hold() is None:
                del self.renewals[entry]
            elif renewal.due - renewal.interval / 4 <= now:
                renewal.due = now + renewal.interval
                batch.append((entry, renewal))
        return batch

    def next_wait(self) -> float | None:
        """Seconds until the next renewal falls due (None: nothing to renew)."""
        if not self.renewals:
            return None
        return max(0.0, min(r.due for r in self.renewals.values()) - time.monotonic())

    @staticmethod
    def calls(batch: Batch) -> list[tuple[Backend, Call[Any], Batch]]:
        """(backend, its ``renew_many`` call, the batch items it covers) per backend."""
        by_backend: dict[int, tuple[Backend, Batch]] = {}
        for item in batch:
            by_backend.setdefault(id(item[1].backend), (item[1].backend, []))[1].append(item)
        return [
            (backend, call(cast(LockBackend, backend).renew_many, [r for _, r in items]), items)
            for backend, items in by_backend.values()
        ]

    def failed(self, items: Batch, exc: BaseException) -> None:
        """The backend could not be asked (BackendUnavailable, mostly): again soon."""
        renewal_log.warning("could not renew %d lock(s), will retry: %s", len(items), exc)
        retry = time.monotonic() + min(1.0, items[0][1].interval / 3)
        for _, renewal in items:
            renewal.due = min(renewal.due, retry)

    def settle(self, items: Batch, results: list[Any]) -> None:
        """Apply ``renew_many``'s results to ``items``."""
        for (entry, renewal), result in zip(items, results, strict=True):
            if result == ExtendOutcome.EXTENDED:
                continue
            if isinstance(result, BaseException):  # outcome unknown: again soon
                renewal_log.warning("could not renew lock %r, will retry: %s", renewal.name, result)
                renewal.due = min(renewal.due, time.monotonic() + min(1.0, renewal.interval / 3))
                continue
            # Released meanwhile: the release discarded it, and nothing is lost.
            if self.renewals.get(entry) is not renewal:
                continue
            del self.renewals[entry]
            hold = renewal.hold()
            if hold is not None:
                hold.lost = True
                metrics.lease_lost("lock", "watchdog", renewal.name)
            if result == ExtendOutcome.CAPPED:
                renewal_log.warning(
                    "lock %r held for max_hold (%ss) since its grant: stopped renewing, "
                    "its lease ends at the cap",
                    renewal.name,
                    renewal.max_hold,
                )
                continue
            renewal_log.warning(
                "lock %r lost: its token no longer holds the key (%s); stopped renewing",
                renewal.name,
                result,
            )


class Watchdog:
    """One daemon thread per process that renews every watchdog lock's lease
    (on the :class:`RenewalSchedule`; renewals of one backend in one round trip)."""

    THREAD_NAME = "stock_locks-watchdog"
    IDLE_WAIT = 1.0  # seconds between looks while nothing is registered

    def __init__(self) -> None:
        self.schedule = RenewalSchedule()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0  # when the sleeping thread next looks

    def add(self, lock: LockCore, hold: Hold) -> None:
        with self._cond:
            renewal = self.schedule.add(lock, hold)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=self.THREAD_NAME, daemon=True
                )
                self._thread.start()
            elif renewal.due < self._wake_at:
                self._cond.notify()  # only when this lock falls due before the planned wake-up

    def discard(self, entry: Entry) -> None:
        with self._cond:
            self.schedule.discard(entry)

    def __len__(self) -> int:
        return len(self.schedule)

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self.schedule.take_due()
                while not batch:
                    # With nothing to renew it still looks now and then, so that a lock
                    # taken and released many times a second (each add() after a
                    # discard()) does not wake it every time.
                    wait = self.schedule.next_wait()
                    wait = self.IDLE_WAIT if wait is None else wait
                    self._wake_at = time.monotonic() + wait
                    self._cond.wait(wait)
                    batch = self.schedule.take_due()
                self._wake_at = 0.0  # busy renewing: add() need not notify
            for backend, renewing, items in self.schedule.calls(batch):
                try:
                    results = backend.execute(renewing)
                except Exception as exc:  # (the thread must live on)
                    with self._cond:
                        self.schedule.failed(items, exc)
                    continue
                with self._cond:
                    self.schedule.settle(items, results)


class AsyncWatchdog:
    """The renewal task of one event loop: the thread's schedule, awaited.

    The task starts with the first watchdog lock and ends when nothing has been
    registered for ``IDLE_WAIT`` seconds (the next lock starts it again)."""

    IDLE_WAIT = Watchdog.IDLE_WAIT

    def __init__(self) -> None:
        self.schedule = RenewalSchedule()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._wake_at = 0.0

    def add(self, lock: LockCore, hold: Hold) -> None:
        renewal = self.schedule.add(lock, hold)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="stock_locks.aio watchdog"
            )
        elif renewal.due < self._wake_at:
            self._wake.set()

    def discard(self, entry: Entry) -> None:
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
            for backend, renewing, items in self.schedule.calls(batch):
                try:
                    results = await backend.aexecute(renewing)
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


_watchdog = Watchdog()


def thread_watchdog() -> Watchdog:
    """This process's renewal thread's watchdog (a forked child gets its own)."""
    return _watchdog


def _after_fork_in_child() -> None:
    global _watchdog
    _watchdog = Watchdog()  # (the child owns none of the parent's locks)


os.register_at_fork(after_in_child=_after_fork_in_child)
