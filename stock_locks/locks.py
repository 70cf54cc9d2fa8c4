"""Token locks: :class:`Lock` on one Redis (or any backend), :class:`RedLock` over a
majority of independent masters.

A grant is one Lua script and one round trip: the grant's fence (one more than
the last, never below the Redis clock in microseconds), then ``SET key record
PX ttl`` where the record is the token followed by the fence, the count and
the holder's metadata (host, pid, thread, caller, acquired-at from the Redis
clock) and the name's state carried from holder to holder (the last fence, the
tokens released lately, until when the admin page's held-locks index lists it).
A release leaves a tombstone of that state in the key. Release and
extend compare the token inside Lua, so only the holder can do either. A
release pushes one element onto the lock's signal list; waiters block on
``BLPOP`` of that list instead of polling, and bound each wait by the holder's
remaining lease (with a client-side deadline), so a lost wake-up costs at most
one lease.

Why a signal list and not pub/sub: BLPOP hands the wake-up to exactly one
waiter (no thundering herd), needs no listener thread, and its key carries the
lock's hash tag, so it works on Redis Cluster. The woken waiter's own release
wakes the next one.

The steps of every call are written once, without I/O, in
:mod:`stock_locks.core.lock`; this module runs them on the calling thread, and
:mod:`stock_locks.aio` awaits them. The operator's tools (who holds a lock,
force release) are :mod:`stock_locks.operations`.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, TypeVar

from . import lease
from .conf import settings
from .core.guard import LeaseGuard
from .core.lock import Hold, LockCore, check_redlock
from .holder import LockInfo, caller_of
from .watchdog import Watchdog, thread_watchdog

__all__ = ["Lock", "LockInfo", "RedLock"]

T = TypeVar("T")

_owners = threading.local()


def _thread_holds() -> dict[str, Hold]:
    """The calling thread's reentrant holds in progress (see ``LockCore._owner_holds``).

    Several reentrant Lock objects of one name in one thread share the entry
    (they are one owner). A fresh token is drawn for each outermost grant.
    """
    holds: dict[str, Hold] | None = getattr(_owners, "holds", None)
    if holds is None:
        holds = _owners.holds = {}
    return holds


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.hold = Hold()


class Lock(LeaseGuard, LockCore):
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
            is what that backend's capabilities say (docs/backends.md: "What
            each backend guarantees").
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
    releases of the name, carried in its lock key), after that it raises
    :class:`LockNotOwned`; their ``extend()`` raises :class:`LockNotOwned`.
    The giving side should call ``hand_off()`` (no round trip): it returns the
    token, stops this process's renewals of it, and makes this object's later
    ``release()`` (a ``with`` block's end) do nothing. A reentrant lock's owner
    is a thread, so its holds cannot be adopted or handed off.
    """

    def _per_owner(self) -> Any:
        return _PerThread()

    def _owner_holds(self) -> dict[str, Hold]:
        return _thread_holds()

    def _renewer(self) -> Watchdog:
        return thread_watchdog()

    def _run(self, steps: lease.Steps[T]) -> T:
        return lease.run(steps, self.backend.execute)

    @property
    def fence(self) -> int | None:
        """The calling owner's fencing token of its last grant (None before the first).

        For a hold adopted by token, the first read while held fetches the
        grant's fence from the holder's record (one round trip) and raises
        :class:`LockNotOwned` when the token no longer holds the lock.
        """
        return self._run(self._fence_steps())

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
        ``GIVE_BACK_TIMEOUT`` (``stock_locks.backends.redis.requests``); the
        backend then remembers the token, so a copy of the try still on its way
        is refused when it lands. If even the give-back fails, the lock frees
        when its lease ends.

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

    def release(self) -> None:
        """Give the lock up; a reentrant owner's hold is decremented, freed at zero.

        Safe to repeat: a release that ran but whose reply was lost reports
        success, since the backend remembers the last ``RELEASED_KEPT``
        released tokens of a lock name (in its lock key). A lost reply is
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

    def extend(self, seconds: float | None = None) -> None:
        """Reset the lease to ``seconds`` from now (default: this lock's ``ttl``).

        Safe to repeat; a lost reply is followed by one repeat bounded by
        ``GIVE_BACK_TIMEOUT``.

        Raises :class:`LockError` when not held by the calling owner or
        ``seconds`` is not a positive number, :class:`LockNotOwned` when the
        backend says the token lost the lock.
        """
        self._run(self._extend_steps(seconds))

    def info(self) -> LockInfo | None:
        """Who holds this lock now (whichever owner), or None when it is free.

        One round trip, read atomically. When the holder is the calling
        owner's adopted token, its ``fence`` is kept too.
        """
        return self._run(self._info_steps())

    def remaining(self) -> float:
        """Seconds left of the calling owner's lease (one round trip).

        0.0 when this owner does not hold the lock, or its token no longer
        does; ``math.inf`` when the lock has no expiry (a session-bound backend).
        """
        return self._run(self._remaining_steps())

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        return self._run(self._token_steps()) is not None

    def owned(self) -> bool:
        """Whether the calling owner's token holds the lock now (one round trip)."""
        return self._run(self._owned_steps())

    # -- single backend calls, for tests and tools -----------------------------------------

    def do_acquire(self, token: str, count: int, waited: bool = False) -> lease.Attempt:
        """One try: the backend's :class:`~stock_locks.lease.Attempt`.

        Raises :class:`LockNotOwned` for a re-entry (``count`` > 0) whose token
        no longer holds the lock, :class:`LockError` for a token already given back.
        """
        return self.backend.execute(self._try_call(token, count, waited))

    def do_release(self, token: str, count: int, mode: str = "release") -> int:
        """One release round trip: RELEASED, STILL_HELD or NOT_OWNED."""
        return self.backend.execute(self._release_call(token, count, mode))

    def do_wait(self, seconds: float) -> bool:
        """Block until a release signals (True), or ``seconds`` pass (False)."""
        return self.backend.execute(self._wait_call(seconds))


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
        options.setdefault("backend", settings.REDLOCK_BACKEND)
        options.setdefault("caller", caller_of(sys._getframe(1)))
        super().__init__(name, ttl, **options)
        check_redlock(self)


def _after_fork_in_child() -> None:
    global _owners
    _owners = threading.local()  # (the child owns none of the parent's locks)


os.register_at_fork(after_in_child=_after_fork_in_child)
