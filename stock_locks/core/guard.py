"""``with`` and ``async with`` for anything with a lease (a lock, a semaphore): acquire
on entry (:class:`LockTimeout` when not granted), release on exit. A lease lost
during the body raises :class:`LockNotOwned` on exit only when the body itself
succeeded; otherwise the body's exception wins and the loss is logged."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self, TypeVar

from .. import _validate
from ..backends.base import Backend
from ..exceptions import LockNotOwned, LockTimeout
from ..lease import Steps, arun

T = TypeVar("T")


class GuardCore:
    """What both guards share: the refusal and the loss on exit."""

    kind = "lock"  # for messages
    name: str
    blocking: bool
    timeout: float | None

    def _wait_options(
        self, blocking: bool | None, timeout: float | None
    ) -> tuple[bool, float | None]:
        """One acquire's ``blocking`` and ``timeout``: the arguments (checked: no round
        trip for bad ones), else the object's."""
        return (
            self.blocking if blocking is None else _validate.flag(blocking, "blocking", self.name),
            self.timeout
            if timeout is None
            else _validate.wait_seconds(timeout, "timeout", self.name),
        )

    def _not_granted(self) -> LockTimeout:
        return LockTimeout(
            f"{self.kind} {self.name!r} not granted within {self.timeout}s",
            name=self.name,
            timeout=self.timeout,
        )

    def _lost_before_exit(self, exc_type: type[BaseException] | None) -> None:
        """(Inside ``except LockNotOwned``) re-raise it unless the body raised."""
        if exc_type is None:
            raise
        logging.getLogger(f"stock_locks.{self.kind}.release").warning(
            "%s %r: lease lost before its holder finished", self.kind, self.name
        )


class LeaseGuard(GuardCore):
    """``with``: the sync primitives."""

    acquire: Callable[..., bool]
    release: Callable[[], None]

    def __enter__(self) -> Self:
        if self.acquire():
            return self
        raise self._not_granted()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockNotOwned:
            self._lost_before_exit(exc_type)


class AsyncLeaseGuard(GuardCore):
    """``async with``, ``acquire()`` and ``release()`` of the asyncio primitives, each the
    sync class's steps awaited (a plain ``with`` raises TypeError)."""

    _acquire_steps: Callable[[bool | None, float | None], Steps[bool]]
    _release_steps: Callable[[], Steps[None]]
    backend: Backend

    async def _arun(self, steps: Steps[T]) -> T:
        return await arun(steps, self.backend.aexecute)

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """As the sync class's ``acquire()``, awaited (:class:`stock_locks.Lock`,
        :class:`stock_locks.Semaphore`)."""
        return await self._arun(self._acquire_steps(blocking, timeout))

    async def release(self) -> None:
        """As the sync class's ``release()``, awaited."""
        await self._arun(self._release_steps())

    async def __aenter__(self) -> Self:
        if await self.acquire():
            return self
        raise self._not_granted()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockNotOwned:
            self._lost_before_exit(exc_type)

    def __enter__(self) -> Any:
        raise TypeError(f"{type(self).__name__} is asyncio's: use `async with`")

    def __exit__(self, *exc_info: Any) -> None:  # pragma: no cover (never entered)
        pass
