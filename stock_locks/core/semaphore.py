"""The semaphore, written once without I/O: arguments, the holder's state and the
steps of every call. :class:`stock_locks.Semaphore` runs these steps on the
calling thread and :class:`stock_locks.aio.Semaphore` awaits them.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import sys
from typing import Any, cast

from .. import _validate, lease, metrics
from ..backends.base import Attempt, Backend, SemaphoreBackend, SemaphoreSpec, call
from ..backends.redis.protocol import decoded
from ..conf import settings
from ..exceptions import BackendUnavailable, LockError, LockNotOwned
from ..holder import caller_of
from .guard import GuardCore
from .lock import pick_backend

acquire_log = logging.getLogger("stock_locks.semaphore.acquire")
release_log = logging.getLogger("stock_locks.semaphore.release")
refresh_log = logging.getLogger("stock_locks.semaphore.refresh")

# The scripts' "patience" argument: how long the caller sleeps before its next try.
NO_WAIT = 0  # a last try: do not wait (a fair waiter leaves the queue when refused)
NO_BOUND = -1  # the caller waits as long as it takes


def patience_ms(seconds: float) -> int:
    if seconds <= 0:
        return NO_WAIT
    if math.isinf(seconds):
        return NO_BOUND
    return max(1, int(seconds * 1000))


def semaphore_backend(backend: Backend, name: str) -> SemaphoreBackend:
    """``backend`` as a :class:`SemaphoreBackend`, or :class:`LockError`."""
    if not hasattr(backend, "semaphore_keys"):
        raise LockError(
            f"semaphore {name!r}: backend {backend.alias!r} has no semaphores", name=name
        )
    return cast(SemaphoreBackend, backend)


def semaphore_keys(backend: Backend, name: str) -> Any:
    """The keys of semaphore ``name`` on ``backend``; :class:`LockError` for a bad name."""
    try:
        return semaphore_backend(backend, name).semaphore_keys(name)
    except ValueError as exc:
        raise LockError(str(exc), name=name) from None


class SemaphoreCore(GuardCore):
    """The arguments and steps of a semaphore (the public classes document them:
    :class:`stock_locks.Semaphore`)."""

    kind = "semaphore"
    fair = False  # FairSemaphore: True

    ticket: int | None = None  # FairSemaphore: this waiter's ticket; always None here

    def __init__(
        self,
        name: str,
        limit: int,
        ttl: float | None = None,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        backend: Backend | str | None = None,
        redis: Any = None,
        caller: str | None = None,
    ) -> None:
        self.backend = pick_backend(backend, redis)
        self._ops = semaphore_backend(self.backend, name)
        self.keys = semaphore_keys(self.backend, name)
        self.name = name
        self.limit = _validate.limit(limit, name)
        self.ttl = settings.SEMAPHORE_TTL if ttl is None else ttl
        ttl_ms = _validate.lease_ms(self.ttl, "ttl", name)
        self.timeout = _validate.wait_seconds(timeout, "timeout", name)
        self.blocking = _validate.flag(blocking, "blocking", name)
        self.caller = caller or caller_of(sys._getframe(1))
        self.spec = SemaphoreSpec(name, self.keys, self.limit, ttl_ms, self.caller, self.fair)
        self.id = secrets.token_hex(16)
        self.lost = False
        self._held = False
        self._spent = False  # this id was given back: the next acquire takes a new one
        self._lease_ms = ttl_ms  # the lease of the current hold (refresh may change it)

    @property
    def redis(self) -> Any:
        """The redis-py client of a Redis backend (None for other backends)."""
        return getattr(self.backend, "client", None)

    def __repr__(self) -> str:
        state = "held" if self._held else "not held"
        return f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} {state}>"

    def _lost(self) -> None:
        self.lost = True
        metrics.lease_lost(self.kind, self.backend.alias, self.name)

    def _on_refused(self, attempt: Attempt) -> None:
        """After a refused try: a fair waiter follows its ticket."""
        ticket = attempt.ticket
        if ticket is None:
            return
        if self.ticket is not None and ticket != self.ticket:
            acquire_log.warning(
                "fair semaphore %r: a waiter came back after its place lapsed; "
                "queued again with ticket %s (was %s)",
                self.name,
                ticket,
                self.ticket,
            )
        self.ticket = ticket

    def _try(self, patience: int) -> lease.Call[Attempt]:
        return call(self._ops.semaphore_try, self.spec, self.id, self.spec.ttl_ms, patience)

    def _releasing(self, abandon: bool) -> lease.Call[int]:
        return call(self._ops.semaphore_release, self.spec, self.id, self._lease_ms, abandon)

    def _wait_call(self, seconds: float) -> lease.Call[bool]:
        return call(self._ops.semaphore_wait, self.spec, self.id, seconds)

    # -- the steps of each call (no I/O: a driver runs them) ---------------------------------

    def _acquire_steps(self, blocking: bool | None, timeout: float | None) -> lease.Steps[bool]:
        blocking, timeout = self._wait_options(blocking, timeout)
        if self._held:
            raise LockError(
                f"this {type(self).__name__} object already holds a permit of {self.name!r}; "
                "use another object",
                name=self.name,
            )
        if self._spent:
            self.id = secrets.token_hex(16)
            self._spent = False
        self.ticket = None
        self._lease_ms = self.spec.ttl_ms
        ops, spec, holder = self._ops, self.spec, self.id
        try:
            attempt = yield from lease.acquire(
                lambda patience, waited: self._try(patience_ms(patience)),
                lambda seconds: call(ops.semaphore_wait, spec, holder, seconds),
                blocking=blocking,
                timeout=timeout,
                default_wait=self.ttl,
                give_back=self._releasing(True),
                what=f"{self.kind} {self.name!r}",
                on_refused=self._on_refused if self.fair else None,
                labels=(self.kind, self.backend.alias),
            )
        except BaseException:
            self._spent = True  # given back (or refused as given back): a new id next time
            raise
        if attempt is None:
            acquire_log.debug("%s %r full, not waiting longer", self.kind, self.name)
            return False
        self._held = True
        self.lost = False
        acquire_log.debug("acquired a permit of %r (limit %s)", self.name, self.limit)
        return True

    def _release_steps(self) -> lease.Steps[None]:
        if not self._held:
            raise LockError(
                f"cannot release {self.name!r}: no permit held by this object", name=self.name
            )
        releasing = self._releasing(False)
        try:
            live = (yield from lease.repeatable(releasing)) == 1
        except (BackendUnavailable, GeneratorExit):
            raise  # still held: release() again
        except BaseException:
            if (yield from lease.give_back_once(releasing)) is None:
                release_log.warning(
                    "%s %r: release interrupted and the permit could not be given back; "
                    "release() again, or it frees when its lease ends",
                    self.kind,
                    self.name,
                )
            else:
                self._held, self._spent = False, True
            raise
        self._held, self._spent = False, True
        if not live:
            self._lost()
            raise LockNotOwned(
                f"semaphore {self.name!r}: this holder's lease had ended before the release "
                "(its permit was free to others)",
                name=self.name,
            )
        release_log.debug("released a permit of %r", self.name)

    def _refresh_steps(self, ttl: float | None) -> lease.Steps[None]:
        if not self._held:
            raise LockError(
                f"cannot refresh {self.name!r}: no permit held by this object", name=self.name
            )
        ttl_ms = self.spec.ttl_ms if ttl is None else _validate.lease_ms(ttl, "ttl", self.name)
        refreshing = call(self._ops.semaphore_refresh, self.spec, self.id, ttl_ms)
        if (yield from lease.repeatable(refreshing)) != 1:
            self._lost()
            refresh_log.warning("semaphore %r: lease ended before it was refreshed", self.name)
            raise LockNotOwned(
                f"cannot refresh {self.name!r}: this holder's lease had already ended",
                name=self.name,
            )
        self._lease_ms = ttl_ms

    def _state_steps(self) -> lease.Steps[list[Any]]:
        return (yield call(self._ops.semaphore_state, self.keys))


def snapshot_of(state: list[Any]) -> dict[str, Any]:
    """``{"limit", "holders", "waiting"}`` from a ``semaphore_state`` reply."""
    _now_ms, limit, waiting, flat = state
    holders = []
    for member, remaining_ms, metadata in zip(flat[::3], flat[1::3], flat[2::3], strict=True):
        info = json.loads(metadata) if metadata else {}
        acquired_at = info.get("acquired_at")
        holders.append(
            {
                "identifier": decoded(member),
                "host": info.get("host"),
                "pid": info.get("pid"),
                "thread": info.get("thread"),
                "caller": info.get("caller"),
                "acquired_at": None if acquired_at is None else acquired_at / 1000,
                "remaining": int(remaining_ms) / 1000,
            }
        )
    holders.sort(key=lambda holder: holder["acquired_at"] or 0)
    return {"limit": None if limit is None else int(limit), "holders": holders, "waiting": waiting}
