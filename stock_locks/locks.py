"""Token locks in Redis.

A grant is one Lua script and one round trip: the grant's fence (one more than
the last, never below the Redis clock in microseconds), then ``SET key record
NX PX ttl`` where the record is the token followed by the fence, the count and
the holder's metadata (host, pid, thread, caller, acquired-at from the Redis
clock), and an entry in the held-locks index the admin page reads. Release and
extend compare the token inside Lua, so only the holder can do either. A release pushes one element
onto the lock's signal list; waiters block on ``BLPOP`` of that list instead of
polling, and bound each wait by the holder's remaining lease (with a
client-side deadline, ``stock_locks.wakeup``), so a lost wake-up costs at most
one lease.

Why a signal list and not pub/sub: BLPOP hands the wake-up to exactly one
waiter (no thundering herd), needs no listener thread, and its key carries the
lock's hash tag, so it works on Redis Cluster. The woken waiter's own release
wakes the next one.

A hold can change hands: ``Lock(name, token=...)`` adopts the hold of another
object or process by its token (a view takes the lock, a Celery task releases
it), and ``hand_off()`` lets the giving side stop holding it without releasing.
``inspect(name)``, ``Lock.info()`` and ``Lock.remaining()`` read a holder in one
round trip; ``force_release(name)`` and ``release_held_by(host=..., pid=...)``
are the operator's tools (the dashboard and ``manage.py release_locks`` use
them); none of these adds anything to an acquire or a release.

Every call is safe to repeat. A release remembers the released token (the
last few per lock name, for up to one lease), so a release repeated after a
lost reply reports success, and an acquire whose caller gave up (an error or an interrupt
mid-round-trip) is given back by one bounded round trip that also makes a late
copy of that try be refused when it lands.

The argument lists and reply shapes live in small functions below so that an
asyncio twin can run the same scripts (``stock_locks.scripts``) over the same
keys (``stock_locks.keys``) without copying the logic.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Self, cast

from . import _validate, lease, metrics
from .backends import resolve
from .backends.base import Backend
from .backends.redis import (  # noqa: F401  (re-exported: the Redis details of a lock)
    CAPPED,
    NOT_OWNED,
    RELEASED,
    RELEASED_KEPT,
    STILL_HELD,
    acquire_argv,
    acquire_keys,
    backend_for_client,
    extend_keys,
    holder_argv,
    is_cluster,
    release_argv,
    release_keys,
    run_batch,
)
from .conf import settings
from .exceptions import BackendUnavailable, LockError, LockNotOwned, LockTimeout
from .holder import LockInfo, caller_of, process_identity  # noqa: F401  (re-exported)
from .lease import Call

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from redis import Redis

acquire_log = logging.getLogger("stock_locks.lock.acquire")
release_log = logging.getLogger("stock_locks.lock.release")
renewal_log = logging.getLogger("stock_locks.lock.renewal")
force_log = logging.getLogger("stock_locks.lock.force")

_owners = threading.local()


def _thread_holds() -> dict[str, list]:
    """The calling thread's reentrant holds: lock key -> [token, depth].

    Several reentrant Lock objects of one name in one thread share the entry
    (they are one owner). A fresh token is drawn for each outermost grant.
    """
    holds = getattr(_owners, "holds", None)
    if holds is None:
        holds = _owners.holds = {}
    return holds


def seconds_to_ms(seconds: object, what: str, name: str | None) -> int:
    """``seconds`` as whole ms (at least 1), or :class:`LockError` unless a positive,
    finite number (``stock_locks._validate.lease_ms``)."""
    return _validate.lease_ms(seconds, what, name)


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


def pick_backend(backend: Backend | str | None, redis: Any) -> Backend:
    """The backend a primitive runs on: ``redis=`` (an explicit client) wins, else
    ``backend`` (an alias or a backend), else the default."""
    if redis is not None:
        if backend is not None:
            raise LockError("pass either backend= or redis=, not both")
        return backend_for_client(redis)
    return resolve(backend)


def read_info(backend: Backend, name: str, keys: Any) -> LockInfo | None:
    """One atomic read of who holds the lock ``name`` (whose keys are ``keys``)."""
    return backend.execute(Call("lock_inspect", (name, keys)))


class LeaseGuard:
    """``with`` for anything with a lease (Lock, Semaphore): acquire on entry,
    :class:`LockTimeout` when not granted; release on exit. A lease lost during
    the body raises :class:`LockNotOwned` on exit only when the body itself
    succeeded; otherwise the body's exception wins and the loss is logged."""

    kind = "lock"  # for messages
    name: str
    timeout: float | None
    acquire: Callable[[], bool]
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


class _Hold:
    """What one owner knows of its hold: token, fence, how many holds, lost;
    whether the hold was adopted by its token (its fence is then read from
    Redis on first use) or handed off (a later release() does nothing)."""

    __slots__ = ("token", "fence", "holds", "lost", "adopted", "handed_off", "__weakref__")

    def __init__(self) -> None:
        self.token: str | None = None
        self.fence: int | None = None
        self.holds = 0
        self.lost = False
        self.adopted = False
        self.handed_off = False


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.hold = _Hold()


class Lock(LeaseGuard):
    """A mutual-exclusion lock on ``name``, held in Redis for ``ttl`` seconds at most.

    Args:
        name: what is locked, e.g. ``"order:42"``; any non-empty string. Keys
            are ``<prefix>:lock:{<name>}`` plus side keys under the same hash
            tag (``{``, ``}`` and ``%`` in a name are escaped there).
        ttl: the lease in seconds (default ``STOCK_LOCKS["LOCK_TTL"]``, 30). A
            holder that dies frees the lock after at most this long.
        timeout: how long ``acquire()`` waits for a held lock, in seconds.
            ``None`` (default) waits as long as it takes; ``0`` tries once.
        blocking: ``False`` makes ``acquire()`` try once, whatever ``timeout``.
        reentrant: the same owner may acquire again while holding the lock;
            only its last release frees it. The owner is the calling thread
            (any Lock object for ``name`` in that thread). Re-entry keeps the
            fence of the first grant, and is granted only while the owner's
            token still holds the lock (else :class:`LockNotOwned`).
        watchdog: renew the lease every ``ttl / 3`` seconds while held, from one
            renewal thread per process. When a renewal finds the lock taken
            from this holder, ``lost`` becomes True and a WARNING is logged.
        max_hold: with ``watchdog=True``, the longest the lock may be held,
            in seconds from its grant (Redis clock): the watchdog never renews
            the lease past it, so a hung but alive worker loses the lock then;
            its last renewal sets ``lost`` and logs a WARNING on
            ``stock_locks.lock.renewal``. A ``ttl`` longer than ``max_hold``
            is cut to it. ``None`` (default) takes
            ``STOCK_LOCKS["LOCK_MAX_HOLD"]`` (default None: no cap);
            ``math.inf``: no cap. The holder's own ``extend()`` and
            re-entries are not capped (a hung worker makes neither). Given
            without ``watchdog=True``: :class:`LockError`.
        token: adopt the hold of that token instead of acquiring (no round
            trip): the object holds the lock from the start, and
            ``extend()``, ``release()``, ``owned()``, ``remaining()`` act on
            that hold. ``fence`` is read from the holder's record on first use
            (one round trip; :class:`LockNotOwned` if the token no longer holds
            the lock). With ``watchdog=True`` this process renews it from now
            on. Not with ``reentrant=True`` (:class:`LockError`).
        backend: where the lock lives: an alias of ``STOCK_LOCKS["BACKENDS"]``
            (e.g. ``"redlock"``) or a backend object; default ``"default"`` (the
            Redis of ``STOCK_LOCKS["REDIS_ALIAS"]``). What the lock guarantees
            is what that backend's capabilities say (README: "What each
            backend guarantees").
        redis: a redis-py client to use instead (not with ``backend``).
        caller: a label for the admin page (default: the creating function).

    After a grant, ``token`` is the holder's token and ``fence`` the grant's
    fencing token: strictly greater than every earlier grant's fence for this
    name. Pass it to :func:`stock_locks.fencing.fenced_update` so that a holder
    paused past its lease cannot overwrite a newer holder's write.

    Sharing one object between threads: a ``reentrant=True`` Lock keeps its
    holder state per thread (each thread is its own owner): ``token``,
    ``fence``, ``lost`` and ``owned()`` answer for the calling thread, and a
    thread can release only its own holds (:class:`LockError` otherwise). A
    non-reentrant Lock is one holder whatever the thread: one thread may
    acquire and another release, and a second ``acquire()`` while it is held
    raises :class:`LockError` instead of waiting; to have threads wait for
    each other, give each thread its own Lock object (they are cheap).
    As a context manager it raises :class:`LockTimeout` when not granted.

    Handing a hold to another process: the owner of a non-reentrant lock is its
    token, not an object or a process. A view acquires and passes ``lock.token``
    (and ``lock.name``) to a Celery task, which builds ``Lock(name,
    token=token)`` and extends or releases it. Every object with the token holds
    the same hold: whichever releases first frees the lock, and a later
    ``release()`` by another of them is recognised as already released (no
    error) while Redis remembers the token (the last ``RELEASED_KEPT``
    releases of the name, for up to one lease), after that it raises
    :class:`LockNotOwned`; their ``extend()`` raises :class:`LockNotOwned`.
    The giving side should call ``hand_off()`` (no round trip): it returns the
    token, stops this process's renewals of it, and makes this object's later
    ``release()`` (a ``with`` block's end) do nothing. A reentrant lock's owner
    is a thread, so its holds cannot be adopted or handed off.
    """

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
        redis: Redis | None = None,
        caller: str | None = None,
    ) -> None:
        self.backend = pick_backend(backend, redis)
        try:
            self.keys = self.backend.lock_keys(name)
        except ValueError as exc:
            raise LockError(str(exc), name=name if isinstance(name, str) else None) from None
        self.name = name
        self.ttl = settings.LOCK_TTL if ttl is None else ttl
        self._ttl_ms = _validate.lease_ms(self.ttl, "ttl", name)
        self.timeout = _validate.wait_seconds(timeout, "timeout", name)
        self.blocking = _validate.flag(blocking, "blocking", name)
        self.reentrant = _validate.flag(reentrant, "reentrant", name)
        self.watchdog = _validate.flag(watchdog, "watchdog", name)
        self.max_hold, self._max_hold_ms = _max_hold(max_hold, self.watchdog, name)
        if self._max_hold_ms and self._max_hold_ms < self._ttl_ms:
            self.ttl, self._ttl_ms = self.max_hold, self._max_hold_ms
        self.caller = caller or caller_of(sys._getframe(1))
        self._state: Any = self._per_owner() if reentrant else _Hold()
        if token is not None:
            self._adopt(token)

    @property
    def redis(self) -> Any:
        """The redis-py client of a Redis backend (None for other backends)."""
        return getattr(self.backend, "client", None)

    # What differs between this class and its asyncio twin (stock_locks.aio): who owns
    # a reentrant hold, who renews a watchdog lock, and the driver.
    _owner_word = "thread"

    def _per_owner(self) -> Any:
        """A reentrant lock's holder state, one :class:`_Hold` per owner (``.hold``)."""
        return _PerThread()

    def _owner_holds(self) -> dict[str, list]:
        """The calling owner's reentrant holds: lock key -> [token, depth]."""
        return _thread_holds()

    def _renewer(self) -> Any:
        return _watchdog

    def _run(self, steps: lease.Steps[Any]) -> Any:
        return lease.run(steps, self.backend.execute)

    def _adopt(self, token: object) -> None:
        if not isinstance(token, str) or not token:
            raise LockError(f"token must be a non-empty str, got {token!r}", name=self.name)
        if self.reentrant:
            raise LockError(
                f"lock {self.name!r}: a reentrant lock's owner is a thread, so its hold "
                "cannot be adopted by token; use a non-reentrant Lock",
                name=self.name,
            )
        hold = self._state
        hold.token, hold.holds, hold.adopted = token, 1, True
        if self.watchdog:
            self._renewer().add(self, hold)

    def _lost(self, hold: _Hold) -> None:
        hold.lost = True
        metrics.lease_lost("lock", self.backend.alias, self.name)

    def _hold(self) -> _Hold:
        """The calling owner's hold state (the thread's, for a reentrant lock)."""
        return self._state.hold if self.reentrant else self._state

    @property
    def token(self) -> str | None:
        """The calling owner's token of its last grant (None before the first)."""
        return self._hold().token

    @property
    def fence(self) -> int | None:
        """The calling owner's fencing token of its last grant (None before the first).

        For a hold adopted by token, the first read while held fetches the
        grant's fence from the holder's record (one round trip) and raises
        :class:`LockNotOwned` when the token no longer holds the lock.
        """
        return self._run(self._fence_steps())

    def _fence_steps(self) -> lease.Steps[int | None]:
        hold = self._hold()
        if hold.fence is None and hold.adopted and hold.holds:
            info = yield Call("lock_inspect", (self.name, self.keys))
            if info is None or info.token != hold.token:
                self._lost(hold)
                raise LockNotOwned(
                    f"lock {self.name!r} is no longer held by the adopted token", name=self.name
                )
            hold.fence = info.fence
        return hold.fence

    @property
    def lost(self) -> bool:
        """Whether the backend said the calling owner's hold was taken from it."""
        return self._hold().lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self._hold().lost = value

    def __repr__(self) -> str:
        hold = self._hold()
        state = f"fence={hold.fence}" if hold.holds else "not held"
        return f"<Lock {self.name!r} ttl={self.ttl} {state}>"

    # -- public API: each runs one of the *_steps generators below ----------

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; True when granted, False when not granted in time.

        ``blocking`` and ``timeout`` override the constructor's values for this
        call (``None`` keeps them). A blocked call sleeps until a release wakes
        it (on Redis: ``BLPOP`` on the lock's signal list) or the holder's
        lease runs out, never longer than what is left of ``timeout``; each
        sleep ends on a client-side deadline, not on the server's timer tick.

        A retried try (after a lost reply) reuses this call's token, and the
        backend treats "already held by my token" as a grant, so a lost reply
        never strands the lock. If the call ends with any exception (the
        backend unreachable, KeyboardInterrupt, a Celery soft time limit
        mid-round-trip), a grant it may have got is given back before the
        exception propagates, by one round trip bounded by
        ``stock_locks.roundtrip.GIVE_BACK_TIMEOUT``; the backend then
        remembers the token, so a copy of the try still on its way is refused
        when it lands. If even the give-back fails, the lock frees when its
        lease ends.

        Raises :class:`LockError` (no round trip) when an argument is invalid or
        this non-reentrant object already holds the lock;
        :class:`LockNotOwned` when a reentrant owner re-enters a lock its token
        no longer holds (its lease ran out, or it was force-released): nothing
        is granted then; :class:`LockNotReplicated` when
        ``STOCK_LOCKS["REPLICAS"]`` is set and too few replicas confirm; and
        :class:`~stock_locks.exceptions.BackendUnavailable` (for Redis,
        :class:`~stock_locks.exceptions.RedisUnavailable`) when the backend
        cannot be reached.
        """
        return self._run(self._acquire_steps(blocking, timeout))

    def _acquire_steps(self, blocking: bool | None, timeout: float | None) -> lease.Steps[bool]:
        blocking = (
            self.blocking if blocking is None else _validate.flag(blocking, "blocking", self.name)
        )
        timeout = (
            self.timeout
            if timeout is None
            else _validate.wait_seconds(timeout, "timeout", self.name)
        )
        hold = self._hold()
        if hold.holds and not self.reentrant:
            raise LockError(
                f"this Lock object already holds {self.name!r}; "
                "use reentrant=True or another Lock object",
                name=self.name,
            )
        entry = self._owner_holds().get(self.keys.lock) if self.reentrant else None
        token, depth = entry if entry else (secrets.token_hex(16), 0)
        try:
            attempt = yield from lease.acquire(
                lambda patience, waited: Call("lock_try", (self, token, depth, waited)),
                lambda seconds: Call("lock_wait", (self, seconds)),
                blocking=blocking,
                timeout=timeout,
                default_wait=self.ttl,
                give_back=None if depth else Call("lock_release", (self, token, 1, "abandon")),
                what=f"lock {self.name!r}",
                labels=("lock", self.backend.alias),
            )
        except LockNotOwned:
            # The thread's hold is gone: its next acquire starts afresh (new token),
            # while the outer holds still in progress learn it on their release.
            self._lost(hold)
            holds = self._owner_holds()
            if holds.get(self.keys.lock, [None])[0] == token:
                del holds[self.keys.lock]
            raise
        if attempt is None:
            acquire_log.debug("lock %r busy, not granted within %ss", self.name, timeout)
            return False
        self._on_grant(hold, token, cast(int, attempt.fence), attempt.count)
        return True

    def release(self) -> None:
        """Give the lock up; a reentrant owner's hold is decremented, freed at zero.

        Safe to repeat: a release that ran but whose reply was lost reports
        success, since the backend remembers the last ``RELEASED_KEPT``
        released tokens of a lock name (for up to one lease). A lost reply is
        followed by one repeat bounded by ``GIVE_BACK_TIMEOUT``; when that
        fails too, :class:`~stock_locks.exceptions.BackendUnavailable`
        propagates and this owner still holds the lock (call ``release()``
        again). Any other exception during the round trip (KeyboardInterrupt,
        a Celery soft time limit) gives the lock back by one bounded round
        trip, then propagates.

        After ``hand_off()`` it does nothing (the hold is the receiver's).

        Raises :class:`LockError` (no round trip) when the calling owner does
        not hold the lock, and :class:`LockNotOwned` when the backend says its
        token no longer owns it (its lease ran out, or it was force-released):
        nothing is deleted then.
        """
        self._run(self._release_steps())

    def _release_steps(self) -> lease.Steps[None]:
        hold = self._hold()
        if not hold.holds:
            if hold.handed_off:
                release_log.debug("%r was handed off: not released here", self.name)
                return
            raise LockError(
                f"cannot release {self.name!r}: not held by this "
                + (self._owner_word if self.reentrant else "object"),
                name=self.name,
            )
        token = cast(str, hold.token)  # set while held
        depth = 1
        if self.reentrant:
            entry = self._owner_holds().get(self.keys.lock)
            if entry and entry[0] == token:
                depth = entry[1]
        if depth <= 1 and (self.watchdog or self.reentrant):
            # (a reentrant hold may have been registered by another Lock object)
            self._renewer().discard((self.keys.lock, token))
        call = Call("lock_release", (self, token, depth, "release"))
        try:
            result = yield from lease.repeatable(call)
        except (BackendUnavailable, GeneratorExit):
            self._still_held(hold, depth)
            raise
        except BaseException:
            given_back = yield from lease.give_back_once(call)
            if given_back is None:
                release_log.warning(
                    "lock %r: release interrupted and the lock could not be given back; "
                    "release() again, or it frees when its lease ends",
                    self.name,
                )
                self._still_held(hold, depth)
            else:
                self._forget(hold, token, depth, given_back)
            raise
        self._forget(hold, token, depth, result)
        if result == NOT_OWNED:
            self._lost(hold)
            raise LockNotOwned(
                f"lock {self.name!r} is no longer held by this token "
                "(its lease ran out or it was force-released)",
                name=self.name,
            )
        release_log.debug("released %r (fence %s)", self.name, hold.fence)

    def extend(self, seconds: float | None = None) -> None:
        """Reset the lease to ``seconds`` from now (default: this lock's ``ttl``).

        Safe to repeat; a lost reply is followed by one repeat bounded by
        ``GIVE_BACK_TIMEOUT``.

        Raises :class:`LockError` when not held by the calling owner or
        ``seconds`` is not a positive number, :class:`LockNotOwned` when the
        backend says the token lost the lock.
        """
        self._run(self._extend_steps(seconds))

    def _extend_steps(self, seconds: float | None) -> lease.Steps[None]:
        hold = self._hold()
        if not hold.holds:
            raise LockError(f"cannot extend {self.name!r}: not held by this owner", name=self.name)
        ttl_ms = (
            self._ttl_ms if seconds is None else _validate.lease_ms(seconds, "seconds", self.name)
        )
        call = Call("lock_extend", (self, cast(str, hold.token), ttl_ms))
        if (yield from lease.repeatable(call)) != 1:
            self._lost(hold)
            raise LockNotOwned(f"cannot extend {self.name!r}: no longer held", name=self.name)

    def hand_off(self) -> str:
        """Stop holding the lock in this object without releasing it; its token.

        For handing the hold to another process, which adopts it with
        ``Lock(name, token=token)``. No round trip: the lock stays held with
        its lease (it frees when the lease ends unless the receiver extends or
        releases it); this process stops renewing it, and this object's
        ``release()`` (a ``with`` block's end) does nothing until it acquires
        again.

        Raises :class:`LockError` when this object does not hold the lock, or
        for a reentrant lock (whose owner is a thread).
        """
        if self.reentrant:
            raise LockError(
                f"lock {self.name!r}: a reentrant lock's owner is a thread; "
                "its holds cannot be handed off",
                name=self.name,
            )
        hold = self._state
        if not hold.holds:
            raise LockError(f"cannot hand off {self.name!r}: not held", name=self.name)
        token = cast(str, hold.token)
        if self.watchdog:
            self._renewer().discard((self.keys.lock, token))
        hold.holds, hold.handed_off = 0, True
        return token

    def info(self) -> LockInfo | None:
        """Who holds this lock now (whichever owner), or None when it is free.

        One round trip, read atomically. When the holder is the calling
        owner's adopted token, its ``fence`` is kept too.
        """
        return self._run(self._info_steps())

    def _info_steps(self) -> lease.Steps[LockInfo | None]:
        info = yield Call("lock_inspect", (self.name, self.keys))
        hold = self._hold()
        if info is not None and hold.holds and info.token == hold.token and hold.fence is None:
            hold.fence = info.fence
        return info

    def remaining(self) -> float:
        """Seconds left of the calling owner's lease (one round trip).

        0.0 when this owner does not hold the lock, or its token no longer
        does; ``math.inf`` when the lock has no expiry (a session-bound backend).
        """
        return self._run(self._remaining_steps())

    def _remaining_steps(self) -> lease.Steps[float]:
        hold = self._hold()
        if not hold.holds or hold.token is None:
            return 0.0
        info = yield Call("lock_inspect", (self.name, self.keys))
        if info is None or info.token != hold.token:
            return 0.0
        return math.inf if info.remaining is None else info.remaining

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        return self._run(self._token_steps()) is not None

    def owned(self) -> bool:
        """Whether the calling owner's token holds the lock now (one round trip)."""
        hold = self._hold()
        if hold.token is None or not hold.holds:
            return False
        return self._run(self._token_steps()) == hold.token

    def _token_steps(self) -> lease.Steps[str | None]:
        return (yield Call("lock_token", (self.keys,)))

    # -- single backend calls, for tests and tools ----------------------------

    def do_acquire(self, token: str, depth: int, waited: bool = False) -> lease.Attempt:
        """One try: the backend's :class:`~stock_locks.lease.Attempt`.

        Raises :class:`LockNotOwned` for a re-entry (``depth`` > 0) whose token
        no longer holds the lock, :class:`LockError` for a token already given back.
        """
        return self.backend.execute(Call("lock_try", (self, token, depth, waited)))

    def do_release(self, token: str, depth: int, mode: str = "release") -> int:
        """One release round trip: RELEASED, STILL_HELD or NOT_OWNED."""
        return self.backend.execute(Call("lock_release", (self, token, depth, mode)))

    def do_wait(self, seconds: float) -> bool:
        """Block until a release signals (True), or ``seconds`` pass (False)."""
        return self.backend.execute(Call("lock_wait", (self, seconds)))

    # -- bookkeeping (no I/O) --------------------------------------------------

    def _on_grant(self, hold: _Hold, token: str, fence: int, count: int) -> None:
        hold.token = token
        hold.fence = fence
        hold.lost = False
        hold.adopted = hold.handed_off = False
        # An outermost grant (count 1) starts the count afresh: holds left over from a
        # lost lease are not this grant's.
        hold.holds = 1 if count == 1 else hold.holds + 1
        if self.reentrant:
            self._owner_holds()[self.keys.lock] = [token, count]
        if count == 1 and self.watchdog:
            self._renewer().add(self, hold)
        acquire_log.debug("acquired %r fence=%s count=%s", self.name, fence, count)

    def _forget(self, hold: _Hold, token: str, depth: int, result: int) -> None:
        """After a release's outcome is known: this owner holds one hold less."""
        hold.holds = max(0, hold.holds - 1)
        if self.reentrant:
            holds = self._owner_holds()
            if result == STILL_HELD:
                holds[self.keys.lock] = [token, depth - 1]
            elif holds.get(self.keys.lock, [None])[0] == token:
                del holds[self.keys.lock]

    def _still_held(self, hold: _Hold, depth: int) -> None:
        """After a release whose outcome stays unknown: keep the hold (and its renewal)."""
        if depth <= 1 and self.watchdog and hold.holds:
            self._renewer().add(self, hold)


class RedLock(Lock):
    """A :class:`Lock` granted by a majority of independent Redis masters (RedLock).

    Same arguments and guarantees as :class:`Lock`; ``backend`` defaults to
    ``STOCK_LOCKS["REDLOCK_BACKEND"]`` (``"redlock"``), which must be a
    :class:`~stock_locks.backends.redlock.RedLockBackend` alias in
    ``STOCK_LOCKS["BACKENDS"]``. Its fences stay monotonic while a majority of
    the masters keeps its data (``stock_locks.backends.redlock``).

    Raises :class:`LockError` when the backend is not a RedLock backend.
    """

    def __init__(self, name: str, ttl: float | None = None, **options: Any) -> None:
        from .backends.redlock import RedLockBackend

        options.setdefault("backend", settings.REDLOCK_BACKEND)
        options.setdefault("caller", caller_of(sys._getframe(1)))
        super().__init__(name, ttl, **options)
        if not isinstance(self.backend, RedLockBackend):
            raise LockError(
                f"RedLock {name!r}: backend {self.backend.alias!r} is not a RedLock backend",
                name=name,
            )


class _Renewal:
    """One watchdog lock: what to renew, and when."""

    __slots__ = (
        "hold", "backend", "name", "keys", "token", "ttl_ms", "max_hold", "max_hold_ms",
        "interval", "due",
    )  # fmt: skip

    def __init__(self, lock: Lock, hold: _Hold) -> None:
        # Weak: an owner whose Lock object (or thread, for a reentrant lock) is gone
        # is no longer renewed either.
        self.hold = weakref.ref(hold)
        self.backend = lock.backend
        self.name = lock.name
        self.keys = lock.keys
        self.token = hold.token
        self.ttl_ms = lock._ttl_ms
        self.max_hold = lock.max_hold
        self.max_hold_ms = lock._max_hold_ms  # 0: no cap
        self.interval = lock.ttl / 3
        self.due = time.monotonic() + self.interval


class RenewalSchedule:
    """Which watchdog locks to renew when, and what each renewal's outcome means.

    No I/O and no threads: the renewal thread (:class:`Watchdog`) and the asyncio
    renewal task (``stock_locks.aio``) run it. Each lock is renewed every
    ``ttl / 3`` seconds; locks falling due within the next quarter interval are
    renewed with it, in one ``renew_many`` call per backend. A lock whose renewal
    finds its token gone is dropped and marked ``lost``; so is one whose renewal
    was cut by its ``max_hold`` (the lease then ends at the cap, on the Redis
    clock). Only weak references to the holds are kept, so a Lock object that is
    garbage-collected without release is no longer renewed either.
    """

    def __init__(self) -> None:
        self.renewals: dict[tuple[str, str], _Renewal] = {}

    def add(self, lock: Lock, hold: _Hold) -> _Renewal:
        renewal = _Renewal(lock, hold)
        self.renewals[(lock.keys.lock, cast(str, hold.token))] = renewal
        return renewal

    def discard(self, entry: tuple[str, str]) -> None:
        self.renewals.pop(entry, None)

    def __len__(self) -> int:
        return len(self.renewals)

    def take_due(self) -> list[tuple[tuple[str, str], _Renewal]]:
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
    def calls(batch: list) -> list[tuple[Backend, Call, list]]:
        """(backend, its ``renew_many`` call, the batch items it covers) per backend."""
        by_backend: dict[int, tuple[Backend, list]] = {}
        for item in batch:
            by_backend.setdefault(id(item[1].backend), (item[1].backend, []))[1].append(item)
        return [
            (backend, Call("renew_many", ([r for _, r in items],)), items)
            for backend, items in by_backend.values()
        ]

    def failed(self, items: list, exc: BaseException) -> None:
        """The backend could not be asked (BackendUnavailable, mostly): again soon."""
        renewal_log.warning("could not renew %d lock(s), will retry: %s", len(items), exc)
        retry = time.monotonic() + min(1.0, items[0][1].interval / 3)
        for _, renewal in items:
            renewal.due = min(renewal.due, retry)

    def settle(self, items: list, results: list) -> None:
        """Apply ``renew_many``'s results to ``items``."""
        for (entry, renewal), result in zip(items, results, strict=True):
            if result == 1:
                continue
            if isinstance(result, Exception):  # outcome unknown: again soon
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
            if result == CAPPED:
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

    def add(self, lock: Lock, hold: _Hold) -> None:
        with self._cond:
            renewal = self.schedule.add(lock, hold)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=self.THREAD_NAME, daemon=True
                )
                self._thread.start()
            elif renewal.due < self._wake_at:
                self._cond.notify()  # only when this lock falls due before the planned wake-up

    def discard(self, entry: tuple[str, str]) -> None:
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
            for backend, call, items in self.schedule.calls(batch):
                try:
                    results = backend.execute(call)
                except Exception as exc:  # (the thread must live on)
                    with self._cond:
                        self.schedule.failed(items, exc)
                    continue
                with self._cond:
                    self.schedule.settle(items, results)


_watchdog = Watchdog()


# -- by name: introspection and the operator's force release ----------------------

# Locks whose holders release_held_by() reads (and releases) per round trip.
RELEASE_BATCH = 500
# Attempts of force_release(name) without a token when the holder changes meanwhile.
FORCE_ATTEMPTS = 3


def _backend_and_keys(
    name: str, backend: Backend | str | None, redis: Redis | None
) -> tuple[Backend, Any]:
    chosen = pick_backend(backend, redis)
    try:
        return chosen, chosen.lock_keys(name)
    except ValueError as exc:
        raise LockError(str(exc), name=name if isinstance(name, str) else None) from None


def inspect(
    name: str, *, backend: Backend | str | None = None, redis: Redis | None = None
) -> LockInfo | None:
    """Who holds the lock ``name`` now, or None when it is free.

    One round trip (on Redis a read-only script: token, lease left and the
    holder's record at one instant). ``backend``: an alias or backend
    (default ``"default"``); ``redis``: an explicit client instead. Raises
    :class:`LockError` for an invalid name, :class:`BackendUnavailable` when
    the backend cannot be reached.
    """
    chosen, keys = _backend_and_keys(name, backend, redis)
    return read_info(chosen, name, keys)


def _displaced(info: LockInfo, how: str) -> LockInfo:
    force_log.warning(
        "lock %r force-released (%s): holder host=%s pid=%s thread=%s caller=%s fence=%s",
        info.name, how, info.host, info.pid, info.thread, info.caller, info.fence,
    )  # fmt: skip
    return info


def force_release(
    name: str,
    *,
    token: str | None = None,
    backend: Backend | str | None = None,
    redis: Redis | None = None,
) -> LockInfo | None:
    """Free the lock ``name`` whoever holds it; the holder it displaced, or None.

    With ``token``, only that holder is displaced (compare-and-delete: a lock
    that changed hands is left alone, and None returned). Without, whoever
    holds it at the moment of the release. Nothing is audited here: the
    caller writes its own record from the returned :class:`LockInfo` (the
    dashboard writes an ``AuditEntry``). A WARNING is logged on
    ``stock_locks.lock.force``.

    The displaced holder is told: its ``release()`` and ``extend()`` raise
    :class:`LockNotOwned`, its watchdog marks it ``lost``; and once the next
    holder has written or claimed a fenced row (``stock_locks.fencing``), the
    displaced holder's fenced writes to it are refused (its fence is older).
    Waiters are woken as by a release. Two round trips (read, release); a
    release whose reply is lost is repeated once, bounded, and the backend
    recognises the force release that happened (the holder is still returned).

    Raises :class:`LockError` for an invalid name or token,
    :class:`BackendUnavailable` when the backend cannot be reached.
    """
    if token is not None and (not isinstance(token, str) or not token):
        raise LockError(f"token must be None or a non-empty str, got {token!r}", name=name)
    chosen, keys = _backend_and_keys(name, backend, redis)
    for _ in range(FORCE_ATTEMPTS):
        info = read_info(chosen, name, keys)
        if info is None or (token is not None and info.token != token):
            return None
        result = lease.run(lease.repeatable(Call("force_release", (info, keys))), chosen.execute)
        if result == RELEASED:
            return _displaced(info, "by token" if token else "by name")
        if token is not None:
            return None
        # Released or taken over between the read and the release: look again.
    return None


def release_held_by(
    *,
    host: str,
    pid: int | str | None = None,
    dry_run: bool = False,
    backend: Backend | str | None = None,
    redis: Redis | None = None,
) -> list[LockInfo]:
    """Force-release every lock held by processes on ``host`` (and ``pid``).

    For deploy scripts and operators, once those processes are known to be
    gone (a restart, a crashed host): their locks would otherwise stay taken
    until their leases end. ``host`` is the holder's ``socket.gethostname()``
    as recorded at the grant; ``pid`` narrows it to one process (default: any).
    ``dry_run`` releases nothing and returns what would be released.

    Reads the backend's held-locks index (not SCAN), then the holders and the
    releases in batches of ``RELEASE_BATCH`` locks (one round trip each). Each
    release is compare-and-delete on the token read, so a lock that changed
    hands meanwhile is left alone. Returns the displaced holders, by lock
    name; as with :func:`force_release`, the caller audits. Raises
    :class:`LockError` for an invalid host or pid.
    """
    if not isinstance(host, str) or not host:
        raise LockError(f"host must be a non-empty str, got {host!r}")
    if pid is not None and (isinstance(pid, bool) or not str(pid).isdigit()):
        raise LockError(f"pid must be None or a process id, got {pid!r}")
    dry_run = _validate.flag(dry_run, "dry_run")
    wanted_pid = None if pid is None else str(pid)
    chosen = pick_backend(backend, redis)
    names = chosen.execute(Call("held_lock_names", ()))
    displaced: list[LockInfo] = []
    for start in range(0, len(names), RELEASE_BATCH):
        chunk = [(name, chosen.lock_keys(name)) for name in names[start : start + RELEASE_BATCH]]
        infos = chosen.execute(Call("inspect_many", (chunk,)))
        matches = [
            (keys, info)
            for (_, keys), info in zip(chunk, infos, strict=True)
            if info and info.host == host and wanted_pid in (None, info.pid)
        ]
        if dry_run or not matches:
            displaced.extend(info for _, info in matches)
            continue
        results = chosen.execute(Call("force_release_many", (matches,)))
        for (_, info), result in zip(matches, results, strict=True):
            if result == RELEASED:
                displaced.append(_displaced(info, f"held by {host} pid {info.pid}"))
    return displaced


def _after_fork_in_child() -> None:
    # The child owns none of the parent's locks: fresh owner tokens and its own
    # (not yet started) renewal thread (stock_locks.holder renews the identity).
    global _owners, _watchdog
    _owners = threading.local()
    _watchdog = Watchdog()


os.register_at_fork(after_in_child=_after_fork_in_child)
