"""The lock, written once without I/O: arguments, the owner's hold, and the steps of
every call. :class:`stock_locks.Lock` runs these steps on the calling thread
and :class:`stock_locks.aio.Lock` awaits them; what differs between the two is
who owns a reentrant hold (a thread, a task), who renews a watchdog lock (a
thread, a task) and the driver, each a hook here.

A hold can change hands: an object built with ``token=`` adopts the hold of
another object or process by its token (a view takes the lock, a Celery task
releases it), and ``hand_off()`` lets the giving side stop holding it without
releasing.

Every call is safe to repeat. The backend remembers the last few released
tokens of a lock name in its lock key, so a release repeated after a lost
reply reports success, and an acquire whose caller gave up (an error or an
interrupt mid-round-trip) is given back by one bounded round trip that also
makes a late copy of that try be refused when it lands.
"""

from __future__ import annotations

import logging
import math
import secrets
import sys
import weakref
from typing import Any, cast

from .. import _validate, lease, metrics
from ..backends import resolve
from ..backends.base import (
    Attempt,
    Backend,
    Call,
    LockBackend,
    LockSpec,
    ReleaseMode,
    ReleaseOutcome,
    call,
)
from ..backends.redis.backend import backend_for_client
from ..backends.redlock import RedLockBackend
from ..conf import settings
from ..exceptions import BackendUnavailable, LockError, LockNotOwned
from ..holder import LockInfo, caller_of
from .guard import GuardCore

acquire_log = logging.getLogger("stock_locks.lock.acquire")
release_log = logging.getLogger("stock_locks.lock.release")


def pick_backend(backend: Backend | str | None, redis: Any) -> Backend:
    """The backend a primitive runs on: ``redis=`` (an explicit client) wins, else
    ``backend`` (an alias or a backend), else the default."""
    if redis is not None:
        if backend is not None:
            raise LockError("pass either backend= or redis=, not both")
        return backend_for_client(redis)
    return resolve(backend)


def lock_backend(backend: Backend) -> LockBackend:
    """``backend`` seen through the lock seam (every backend class implements it)."""
    return cast(LockBackend, backend)


def _max_hold(value: object, watchdog: bool, name: str) -> tuple[float | None, int]:
    """(max_hold in seconds or None, in ms or 0) of a lock: the argument, else the setting."""
    what = "max_hold"
    if value is None:
        value, what = settings.LOCK_MAX_HOLD, 'STOCK_LOCKS["LOCK_MAX_HOLD"]'
        if value is None or not watchdog:
            return None, 0
    elif not watchdog:
        raise LockError(
            f"lock {name!r}: max_hold caps the watchdog's renewals; it needs watchdog=True",
            name=name,
        )
    if isinstance(value, float) and value == math.inf:
        return None, 0
    return cast(float, value), _validate.lease_ms(value, what, name)


class Hold:
    """What one owner knows of its hold: token, fence, how many holds (``count``),
    whether it was lost; whether the hold was adopted by its token (its fence is
    then read from the backend on first use) or handed off (a later release()
    does nothing). A reentrant hold is its owner's (thread or task), shared by
    every Lock object of the name there; ``holders``: weak references to the
    objects whose holds are in progress, one per hold."""

    __slots__ = (
        "token", "fence", "count", "lost", "adopted", "handed_off", "holders", "__weakref__",
    )  # fmt: skip

    def __init__(self) -> None:
        self.token: str | None = None
        self.fence: int | None = None
        self.count = 0
        self.lost = False
        self.adopted = False
        self.handed_off = False
        self.holders: list[weakref.ref[Any]] = []

    def orphaned(self) -> bool:
        """Whether holds are counted and every object that took them is gone (dropped
        without a release): nobody in progress would learn that the hold was lost."""
        return bool(self.count) and not any(ref() is not None for ref in self.holders)


def _new_token() -> str:
    return secrets.token_hex(16)


class LockCore(GuardCore):
    """The arguments and steps of a lock (the public classes document them:
    :class:`stock_locks.Lock`). A subclass provides the owner hooks:
    :meth:`_per_owner`, :meth:`_owner_holds`, :meth:`_renewer`."""

    kind = "lock"
    _owner_word = "thread"  # who owns a reentrant hold, for messages

    def __init__(
        self,
        name: str,
        ttl: float | None = None,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        reentrant: bool = False,
        watchdog: bool = False,
        max_hold: float | None = None,
        token: str | None = None,
        backend: Backend | str | None = None,
        redis: Any = None,
        caller: str | None = None,
    ) -> None:
        self.backend = pick_backend(backend, redis)
        self.ttl = settings.LOCK_TTL if ttl is None else ttl
        ttl_ms = _validate.lease_ms(self.ttl, "ttl", name)
        self.timeout = _validate.wait_seconds(timeout, "timeout", name)
        self.blocking = _validate.flag(blocking, "blocking", name)
        self.reentrant = _validate.flag(reentrant, "reentrant", name)
        self.watchdog = _validate.flag(watchdog, "watchdog", name)
        self.max_hold, self.max_hold_ms = _max_hold(max_hold, self.watchdog, name)
        if self.max_hold_ms and self.max_hold_ms < ttl_ms:
            self.ttl, ttl_ms = self.max_hold, self.max_hold_ms
        self.caller = caller or caller_of(sys._getframe(1))
        self._ops = lock_backend(self.backend)
        # (a backend that can make a waiter's next try at its wake-up)
        self._wait_try = getattr(self._ops, "lock_wait_try", None)
        try:
            self.spec: LockSpec = self._ops.lock_spec(
                name, ttl_ms=ttl_ms, caller=self.caller, watchdog=self.watchdog
            )
        except ValueError as exc:
            raise LockError(str(exc), name=name if isinstance(name, str) else None) from None
        self.name = name
        self.keys = self.spec.keys
        self._state: Any = self._per_owner() if reentrant else Hold()
        if token is not None:
            self._adopt(token)

    # -- the owner hooks -----------------------------------------------------------------

    def _per_owner(self) -> Any:
        """A reentrant lock's holder state: an object whose ``hold`` is the calling
        owner's :class:`Hold`."""
        raise NotImplementedError

    def _owner_holds(self) -> dict[str, Hold]:
        """The calling owner's reentrant holds in progress: backend alias and lock key ->
        its :class:`Hold` (shared by every Lock object of the name in that owner)."""
        raise NotImplementedError

    def _renewer(self) -> Any:
        """The watchdog that renews this lock's lease (``add``, ``discard``)."""
        raise NotImplementedError

    # -- state -------------------------------------------------------------------------------

    @property
    def redis(self) -> Any:
        """The redis-py client of a Redis backend (None for other backends)."""
        return getattr(self.backend, "client", None)

    @property
    def ttl_ms(self) -> int:
        return self.spec.ttl_ms

    def _hold(self) -> Hold:
        """The calling owner's hold state: for a reentrant lock the owner's hold in
        progress (whichever object took it), else this object's last one in that owner."""
        if not self.reentrant:
            return cast(Hold, self._state)
        shared = self._owner_holds().get(self._owner_key)
        if shared is not None:
            self._state.hold = shared
            return shared
        return cast(Hold, self._state.hold)

    @property
    def _owner_key(self) -> str:
        return f"{self.backend.alias}\0{self.keys.lock}"

    @property
    def token(self) -> str | None:
        """The calling owner's token of its last grant (None before the first)."""
        return self._hold().token

    @property
    def lost(self) -> bool:
        """Whether the backend said the calling owner's hold was taken from it."""
        return self._hold().lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self._hold().lost = value

    def __repr__(self) -> str:
        hold = self._hold()
        state = f"fence={hold.fence}" if hold.count else "not held"
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl} {state}>"

    def _adopt(self, token: object) -> None:
        if not isinstance(token, str) or not token:
            raise LockError(f"token must be a non-empty str, got {token!r}", name=self.name)
        if any(c.isspace() for c in token):
            # The lock key keeps released tokens separated by spaces, and record fields
            # by newlines: such a token could never be told apart (lua/lib/lock_record.lua).
            raise LockError(f"a token cannot contain whitespace, got {token!r}", name=self.name)
        if self.reentrant:
            raise LockError(
                f"lock {self.name!r}: a reentrant lock's owner is a {self._owner_word}, so "
                "its hold cannot be adopted by token; use a non-reentrant Lock",
                name=self.name,
            )
        hold = self._state
        hold.token, hold.count, hold.adopted = token, 1, True
        if self.watchdog:
            self._renewer().add(self, hold)

    def _lost(self, hold: Hold) -> None:
        hold.lost = True
        metrics.lease_lost("lock", self.backend.alias, self.name)

    def hand_off(self) -> str:
        """Stop holding the lock in this object without releasing it; its token.

        For handing the hold to another process, which adopts it with
        ``Lock(name, token=token)``. No round trip: the lock stays held with
        its lease (it frees when the lease ends unless the receiver extends or
        releases it); this process stops renewing it, and this object's
        ``release()`` (a ``with`` block's end) does nothing until it acquires
        again.

        Raises :class:`LockError` when this object does not hold the lock, or
        for a reentrant lock (whose owner is a thread or task).
        """
        if self.reentrant:
            raise LockError(
                f"lock {self.name!r}: a reentrant lock's owner is a {self._owner_word}; "
                "its holds cannot be handed off",
                name=self.name,
            )
        hold = self._state
        if not hold.count:
            raise LockError(f"cannot hand off {self.name!r}: not held", name=self.name)
        token = cast(str, hold.token)
        if self.watchdog:
            self._renewer().discard((self.keys.lock, token))
        hold.count, hold.handed_off = 0, True
        return token

    # -- the steps of each call (no I/O: a driver runs them) ---------------------------------

    def _fence_steps(self) -> lease.Steps[int | None]:
        hold = self._hold()
        if hold.fence is None and hold.adopted and hold.count:
            info = yield call(self._ops.lock_inspect, self.name, self.keys)
            if info is None or info.token != hold.token:
                self._lost(hold)
                raise LockNotOwned(
                    f"lock {self.name!r} is no longer held by the adopted token", name=self.name
                )
            hold.fence = info.fence
        return hold.fence

    def _acquire_steps(self, blocking: bool | None, timeout: float | None) -> lease.Steps[bool]:
        blocking, timeout = self._wait_options(blocking, timeout)
        hold = self._hold()
        if hold.count and not self.reentrant:
            raise LockError(
                f"this Lock object already holds {self.name!r}; "
                "use reentrant=True or another Lock object",
                name=self.name,
            )
        try:
            attempt, token = yield from self._grant_steps(hold, blocking, timeout)
        except LockNotOwned:
            # The owner's hold is gone: its next acquire starts afresh (new token). The
            # holds still in progress learn it on their release; when there are none
            # (their objects were dropped without a release), this acquire is that next one.
            orphaned = hold.orphaned()
            self._lost(hold)
            self._unregister(hold)
            if not orphaned:
                raise
            hold = self._state.hold = Hold()
            attempt, token = yield from self._grant_steps(hold, blocking, timeout)
        if attempt is None:
            acquire_log.debug("lock %r busy, not granted within %ss", self.name, timeout)
            return False
        self._on_grant(hold, token, cast(int, attempt.fence), attempt.count)
        return True

    def _grant_steps(
        self, hold: Hold, blocking: bool, timeout: float | None
    ) -> lease.Steps[tuple[Attempt | None, str]]:
        """Wait for a grant (a re-entry of ``hold`` when it is the owner's reentrant hold
        in progress): (the attempt, None when not granted within ``timeout``; its token)."""
        ops, spec = self._ops, self.spec
        reentry = self.reentrant and hold.count > 0
        token, count = (cast(str, hold.token), hold.count) if reentry else (_new_token(), 0)
        wait_try = self._wait_try

        def wait(seconds: float) -> Call[Any]:
            if wait_try is None:
                return call(ops.lock_wait, spec, seconds)
            return call(wait_try, spec, seconds, token, count)

        attempt = yield from lease.acquire(
            lambda patience, waited: call(ops.lock_try, spec, token, count, waited, hold),
            wait,
            blocking=blocking,
            timeout=timeout,
            default_wait=self.ttl,
            give_back=(
                None if count else call(ops.lock_release, spec, token, 1, ReleaseMode.ABANDON)
            ),
            what=f"lock {self.name!r}",
            labels=("lock", self.backend.alias),
        )
        return attempt, token

    def _release_steps(self) -> lease.Steps[None]:
        hold = self._hold()
        if not hold.count:
            if hold.handed_off:
                release_log.debug("%r was handed off: not released here", self.name)
                return
            raise LockError(
                f"cannot release {self.name!r}: not held by this "
                + (self._owner_word if self.reentrant else "object"),
                name=self.name,
            )
        token = cast(str, hold.token)  # set while held
        count = hold.count if self.reentrant else 1
        if count <= 1 and (self.watchdog or self.reentrant):
            # (a reentrant hold may have been registered by another Lock object)
            self._renewer().discard((self.keys.lock, token))
        releasing = call(self._ops.lock_release, self.spec, token, count, ReleaseMode.RELEASE)
        try:
            result = yield from lease.repeatable(releasing)
        except (BackendUnavailable, GeneratorExit):
            self._still_held(hold, count)
            raise
        except BaseException:
            given_back = yield from lease.give_back_once(releasing)
            if given_back is None:
                release_log.warning(
                    "lock %r: release interrupted and the lock could not be given back; "
                    "release() again, or it frees when its lease ends",
                    self.name,
                )
                self._still_held(hold, count)
            else:
                self._forget(hold, token, count, given_back)
            raise
        self._forget(hold, token, count, result)
        if result == ReleaseOutcome.NOT_OWNED:
            self._lost(hold)
            raise LockNotOwned(
                f"lock {self.name!r} is no longer held by this token "
                "(its lease ran out or it was force-released)",
                name=self.name,
            )
        release_log.debug("released %r (fence %s)", self.name, hold.fence)

    def _extend_steps(self, seconds: float | None) -> lease.Steps[None]:
        hold = self._hold()
        if not hold.count:
            raise LockError(f"cannot extend {self.name!r}: not held by this owner", name=self.name)
        ttl_ms = (
            self.spec.ttl_ms
            if seconds is None
            else _validate.lease_ms(seconds, "seconds", self.name)
        )
        extending = call(self._ops.lock_extend, self.spec, cast(str, hold.token), ttl_ms, 0)
        if (yield from lease.repeatable(extending)) != 1:
            self._lost(hold)
            raise LockNotOwned(f"cannot extend {self.name!r}: no longer held", name=self.name)

    def _info_steps(self) -> lease.Steps[LockInfo | None]:
        info = yield call(self._ops.lock_inspect, self.name, self.keys)
        hold = self._hold()
        if info is not None and hold.count and info.token == hold.token and hold.fence is None:
            hold.fence = info.fence
        return info

    def _remaining_steps(self) -> lease.Steps[float]:
        hold = self._hold()
        if not hold.count or hold.token is None:
            return 0.0
        info = yield call(self._ops.lock_inspect, self.name, self.keys)
        if info is None or info.token != hold.token:
            return 0.0
        return math.inf if info.remaining is None else info.remaining

    def _token_steps(self) -> lease.Steps[str | None]:
        return (yield call(self._ops.lock_token, self.keys))

    def _owned_steps(self) -> lease.Steps[bool]:
        hold = self._hold()
        if hold.token is None or not hold.count:
            return False
        return (yield from self._token_steps()) == hold.token

    # -- single backend calls, for tests and tools (``do_*`` on the surfaces) ------------

    def _try_call(self, token: str, count: int, waited: bool) -> Call[Attempt]:
        return call(self._ops.lock_try, self.spec, token, count, waited, None)

    def _release_call(self, token: str, count: int, mode: str) -> Call[ReleaseOutcome]:
        return call(self._ops.lock_release, self.spec, token, count, ReleaseMode(mode))

    def _wait_call(self, seconds: float) -> Call[bool]:
        return call(self._ops.lock_wait, self.spec, seconds)

    # -- bookkeeping (no I/O) ----------------------------------------------------------------

    def _on_grant(self, hold: Hold, token: str, fence: int, count: int) -> None:
        hold.token = token
        hold.fence = fence
        hold.lost = False
        hold.adopted = hold.handed_off = False
        # An outermost grant (count 1) starts the count afresh: holds left over from a
        # lost lease are not this grant's.
        hold.count = 1 if count == 1 else hold.count + 1
        if self.reentrant:
            hold.count = count  # (the backend's count of the owner's holds)
            if count == 1:
                hold.holders.clear()
            hold.holders.append(weakref.ref(self))
            self._owner_holds()[self._owner_key] = hold
        if count == 1 and self.watchdog:
            self._renewer().add(self, hold)
        acquire_log.debug("acquired %r fence=%s count=%s", self.name, fence, count)

    def _forget(self, hold: Hold, token: str, count: int, result: int) -> None:
        """After a release's outcome is known: this owner holds one hold less."""
        hold.count = max(0, hold.count - 1)
        if self.reentrant:
            hold.count = count - 1 if result == ReleaseOutcome.STILL_HELD else 0
            mine = [i for i, ref in enumerate(hold.holders) if ref() is self]
            if hold.holders:
                del hold.holders[mine[-1] if mine else -1]
            if not hold.count:
                self._unregister(hold)

    def _unregister(self, hold: Hold) -> None:
        """The owner's reentrant hold ``hold`` is over (released or lost)."""
        holds = self._owner_holds()
        if holds.get(self._owner_key) is hold:
            del holds[self._owner_key]
        hold.holders.clear()

    def _still_held(self, hold: Hold, count: int) -> None:
        """After a release whose outcome stays unknown: keep the hold (and its renewal)."""
        if count <= 1 and self.watchdog and hold.count:
            self._renewer().add(self, hold)


def check_redlock(lock: LockCore) -> None:
    """:class:`LockError` unless ``lock`` runs on a RedLock backend."""
    if not isinstance(lock.backend, RedLockBackend):
        raise LockError(
            f"RedLock {lock.name!r}: backend {lock.backend.alias!r} is not a RedLock backend",
            name=lock.name,
        )
