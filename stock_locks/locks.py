"""Token locks in Redis.

A grant is one Lua script and one round trip: ``SET key token NX PX ttl``, ``INCR``
of the lock's fencing counter and the holder's metadata (host, pid, thread,
caller, acquired-at from the Redis clock) in a side hash with the same lease.
Release and extend compare the token inside Lua, so only the holder can do
either. A release pushes one element onto the lock's signal list; waiters block
on ``BLPOP`` of that list instead of polling, and bound each wait by the
holder's remaining lease, so a lost wake-up costs at most one lease.

Why a signal list and not pub/sub: BLPOP hands the wake-up to exactly one
waiter (no thundering herd), needs no listener thread, and its key carries the
lock's hash tag, so it works on Redis Cluster. The woken waiter's own release
wakes the next one.

The argument lists and reply shapes live in small functions below so that an
asyncio twin can run the same scripts (``stock_locks.scripts``) over the same
keys (``stock_locks.keys``) without copying the logic.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Self

from redis.exceptions import NoScriptError, RedisError

from . import scripts
from .conf import settings
from .connection import blocking_cap, get_redis
from .exceptions import LockError, LockNotOwned, LockNotReplicated, LockTimeout
from .keys import lock_keys

if TYPE_CHECKING:
    from types import FrameType, TracebackType

    from redis import Redis

acquire_log = logging.getLogger("stock_locks.lock.acquire")
release_log = logging.getLogger("stock_locks.lock.release")
renewal_log = logging.getLogger("stock_locks.lock.renewal")

# A release's RELEASED reply; a reentrant release that only decremented is STILL_HELD.
NOT_OWNED, RELEASED, STILL_HELD = 0, 1, 2

# Shortest BLPOP we send: Redis reads a timeout of 0 as "block forever".
MIN_WAIT = 0.001  # seconds


class _Process:
    """This process's identity, as written into holder metadata. Reset after fork."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.pid = str(os.getpid())


_process = _Process()
_owners = threading.local()
# (lock key, owner token) -> how many times that owner holds the lock. Reentrant
# locks only; several Lock objects of one thread share their owner's entry.
_depths: dict[tuple[str, str], int] = {}


def owner_token() -> str:
    """The calling thread's reentrant-owner token: 128 random bits, one per thread."""
    token = getattr(_owners, "token", None)
    if token is None:
        token = _owners.token = secrets.token_hex(16)
    return token


def holder_argv(caller: str, watchdog: bool) -> tuple:
    """The fixed tail of ``lock_acquire.lua``'s ARGV: host, pid, caller, watchdog."""
    return (_process.host, _process.pid, caller, int(watchdog))


def acquire_argv(token: str, ttl_ms: int, depth: int, holder: tuple, waited: bool) -> tuple:
    """ARGV of ``lock_acquire.lua``; ``holder`` comes from :func:`holder_argv`."""
    return (token, ttl_ms, depth, threading.current_thread().name, *holder, int(waited))


def release_argv(token: str, depth: int) -> tuple:
    """ARGV of ``lock_release.lua``."""
    return (token, depth, int(settings.WAKE_SIGNAL_TTL * 1000))


def process_identity() -> tuple[str, str]:
    """(host, pid) of this process, as holder metadata records it (fresh after fork)."""
    return _process.host, _process.pid


def caller_of(frame: FrameType | None) -> str:
    """``module.qualname`` of the code running in ``frame``: a holder's "caller"."""
    if frame is None:
        return "?"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"


def seconds_to_ms(seconds: float, what: str, name: str) -> int:
    """``seconds`` as whole ms (at least 1), or :class:`LockError` unless positive."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise LockError(f"{what} must be a positive number of seconds, got {seconds!r}", name=name)
    return max(1, int(seconds * 1000))


class LeaseGuard:
    """``with`` for anything with a lease (Lock, Semaphore): acquire on entry,
    :class:`LockTimeout` when not granted; release on exit. A lease lost during
    the body raises :class:`LockNotOwned` on exit only when the body itself
    succeeded; otherwise the body's exception wins and the loss is logged."""

    kind = "lock"  # for messages
    name: str
    timeout: float | None

    def __enter__(self) -> Self:
        if self.acquire():
            return self
        raise LockTimeout(
            f"{self.kind} {self.name!r} not granted within {self.timeout}s",
            name=self.name,
            timeout=self.timeout,
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc_type is None:
                raise
            logging.getLogger(f"stock_locks.{self.kind}.release").warning(
                "%s %r: lease lost before its holder finished", self.kind, self.name
            )


class Lock(LeaseGuard):
    """A mutual-exclusion lock on ``name``, held in Redis for ``ttl`` seconds at most.

    Args:
        name: what is locked, e.g. ``"order:42"``. Keys are
            ``<prefix>:lock:{<name>}`` plus side keys under the same hash tag.
        ttl: the lease in seconds (default ``STOCK_LOCKS["LOCK_TTL"]``, 30). A
            holder that dies frees the lock after at most this long.
        timeout: how long ``acquire()`` waits for a held lock, in seconds.
            ``None`` (default) waits as long as it takes; ``0`` tries once.
        blocking: ``False`` makes ``acquire()`` try once, whatever ``timeout``.
        reentrant: the same owner may acquire again while holding the lock;
            only its last release frees it. The owner is the calling thread
            (any Lock object for ``name`` in that thread). Re-entry keeps the
            fence of the first grant.
        watchdog: renew the lease every ``ttl / 3`` seconds while held, from one
            renewal thread per process. When a renewal finds the lock taken
            from this holder, ``lost`` becomes True and a WARNING is logged.
        redis: the redis-py client to use (default: django-redis's client for
            ``STOCK_LOCKS["REDIS_ALIAS"]``).
        caller: a label for the admin page (default: the creating function).

    After a grant, ``token`` is the holder's token and ``fence`` the grant's
    fencing token: strictly greater than every earlier grant's fence for this
    name. Pass it to :func:`stock_locks.fencing.fenced_update` so that a holder
    paused past its lease cannot overwrite a newer holder's write.

    One Lock object is one holder: share it between threads only with
    ``reentrant=True``, or better, create one per thread (it is cheap).
    As a context manager it raises :class:`LockTimeout` when not granted.
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
        redis: Redis | None = None,
        caller: str | None = None,
    ) -> None:
        try:
            self.keys = lock_keys(name)
        except ValueError as exc:
            raise LockError(str(exc), name=name) from None
        self.name = name
        self.ttl = settings.LOCK_TTL if ttl is None else ttl
        self._ttl_ms = seconds_to_ms(self.ttl, "ttl", name)
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise LockError(f"timeout must be None or >= 0 seconds, got {timeout!r}", name=name)
        self.timeout = timeout
        self.blocking = blocking
        self.reentrant = reentrant
        self.watchdog = watchdog
        self.redis = get_redis() if redis is None else redis
        self.caller = caller or caller_of(sys._getframe(1))
        self.token: str | None = None
        self.fence: int | None = None
        self.lost = False
        self._holds = 0
        self._wait_cap = blocking_cap(self.redis)
        self._acquire_keys = (self.keys.lock, self.keys.fence, self.keys.holder)
        self._release_keys = (self.keys.lock, self.keys.holder, self.keys.signal)
        self._extend_keys = (self.keys.lock, self.keys.holder)
        self._holder = holder_argv(self.caller, watchdog)
        self._holder_process = _process

    def __repr__(self) -> str:
        state = f"fence={self.fence}" if self._holds else "not held"
        return f"<Lock {self.name!r} ttl={self.ttl} {state}>"

    # -- public API: local checks, then the do_* methods talk to Redis ------

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; True when granted, False when not granted in time.

        ``blocking`` and ``timeout`` override the constructor's values for this
        call (``None`` keeps them). A blocked call sleeps in ``BLPOP`` on the
        lock's signal list until a release wakes it or the holder's lease runs
        out, never longer than what is left of ``timeout``.

        A retried script call (redis-py retrying after a lost reply) reuses this
        call's token, and the script treats "already held by my token" as a
        grant, so a lost reply never strands the lock. If the call still fails
        with a Redis error, the token is released best-effort before the error
        propagates.

        Raises :class:`LockError` when this non-reentrant object already holds
        the lock, :class:`LockNotReplicated` when ``STOCK_LOCKS["REPLICAS"]`` is
        set and too few replicas confirm, and redis-py's errors when Redis is
        unreachable.
        """
        if blocking is None:
            blocking = self.blocking
        if timeout is None:
            timeout = self.timeout
        elif isinstance(timeout, bool) or timeout < 0:
            raise LockError(f"timeout must be None or >= 0, got {timeout!r}", name=self.name)
        if self._holds and not self.reentrant:
            raise LockError(
                f"this Lock object already holds {self.name!r}; "
                "use reentrant=True or another Lock object",
                name=self.name,
            )
        if self.reentrant:
            token = owner_token()
            depth = _depths.get((self.keys.lock, token), 0)
        else:
            token = secrets.token_hex(16)
            depth = 0
        deadline = None
        if blocking and timeout:
            deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                granted, value, count = self.do_acquire(token, depth, waited)
            except RedisError:
                if depth == 0:
                    self._abandon(token)
                raise
            if granted:
                self._on_grant(token, value, count)
                return True
            if not blocking or timeout == 0:
                acquire_log.debug("lock %r busy, not waiting", self.name)
                return False
            # The holder's lease bounds the wait; -1 (no expiry) waits one of our leases.
            wait = (value + 1) / 1000 if value > 0 else self.ttl
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    acquire_log.debug("lock %r busy, gave up after %ss", self.name, timeout)
                    return False
                wait = min(wait, remaining)
            self.do_wait(wait)
            waited = True

    def release(self) -> None:
        """Give the lock up; a reentrant owner's hold is decremented, freed at zero.

        Raises :class:`LockError` (no round trip) when this object does not hold
        the lock, and :class:`LockNotOwned` when Redis says the token no longer
        owns it (its lease ran out, or it was force-released): nothing is
        deleted then.
        """
        if not self._holds:
            raise LockError(
                f"cannot release {self.name!r}: not held by this object", name=self.name
            )
        token = self.token
        entry = (self.keys.lock, token)
        depth = _depths.get(entry, 1) if self.reentrant else 1
        self._holds -= 1
        if depth <= 1 and (self.watchdog or self.reentrant):
            # (a reentrant hold may have been registered by another Lock object)
            _watchdog.discard(entry)
        result = self.do_release(token, depth)
        if self.reentrant:
            if result == STILL_HELD:
                _depths[entry] = depth - 1
            else:
                _depths.pop(entry, None)
        if result == NOT_OWNED:
            self.lost = True
            raise LockNotOwned(
                f"lock {self.name!r} is no longer held by this token "
                "(its lease ran out or it was force-released)",
                name=self.name,
            )
        release_log.debug("released %r (fence %s)", self.name, self.fence)

    def extend(self, seconds: float | None = None) -> None:
        """Reset the lease to ``seconds`` from now (default: this lock's ``ttl``).

        Raises :class:`LockError` when not held by this object or ``seconds`` is
        not positive, :class:`LockNotOwned` when Redis says the token lost the lock.
        """
        if not self._holds:
            raise LockError(f"cannot extend {self.name!r}: not held by this object", name=self.name)
        ttl_ms = self._ttl_ms if seconds is None else seconds_to_ms(seconds, "seconds", self.name)
        if not self.do_extend(self.token, ttl_ms):
            self.lost = True
            raise LockNotOwned(f"cannot extend {self.name!r}: no longer held", name=self.name)

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        return bool(self.redis.exists(self.keys.lock))

    def owned(self) -> bool:
        """Whether this object's token holds the lock now (one round trip)."""
        if self.token is None:
            return False
        value = self.redis.get(self.keys.lock)
        if isinstance(value, bytes):
            value = value.decode()
        return value == self.token

    # -- the only code that talks to Redis ----------------------------------

    def do_acquire(self, token: str, depth: int, waited: bool = False) -> tuple[bool, int, int]:
        """One acquire round trip: (granted, fence or holder's pttl, count)."""
        if self._holder_process is not _process:  # used in a forked child
            self._holder, self._holder_process = holder_argv(self.caller, self.watchdog), _process
        argv = acquire_argv(token, self._ttl_ms, depth, self._holder, waited)
        replicas = settings.REPLICAS
        if replicas:
            return self._do_acquire_replicated(token, argv, replicas)
        reply = scripts.LOCK_ACQUIRE(self._acquire_keys, argv, client=self.redis)
        if reply[0] == 1:
            return True, int(reply[1]), int(reply[2])
        return False, int(reply[1]), 0

    def _do_acquire_replicated(self, token: str, argv: tuple, replicas: int) -> tuple:
        # WAIT counts the replicas that have this connection's writes, so the
        # script and WAIT share one pipeline (one connection, one round trip).
        wait_ms = max(1, int(settings.REPLICA_TIMEOUT * 1000))
        for _ in range(2):
            pipe = self.redis.pipeline(transaction=False)
            pipe.evalsha(scripts.LOCK_ACQUIRE.sha, 3, *self._acquire_keys, *argv)
            pipe.execute_command("WAIT", replicas, wait_ms)
            reply, confirmed = pipe.execute(raise_on_error=False)
            if not isinstance(reply, NoScriptError):
                break
            self.redis.script_load(scripts.LOCK_ACQUIRE.script)
        if isinstance(reply, Exception):
            raise reply
        if reply[0] != 1:
            return False, int(reply[1]), 0
        if int(reply[2]) == 1 and int(confirmed) < replicas:
            self.do_release(token, 1)
            raise LockNotReplicated(
                f"lock {self.name!r}: {confirmed} of {replicas} replicas confirmed the grant "
                f"within {settings.REPLICA_TIMEOUT}s; grant undone",
                name=self.name,
                required=replicas,
                confirmed=int(confirmed),
            )
        return True, int(reply[1]), int(reply[2])

    def do_release(self, token: str, depth: int) -> int:
        """One release round trip: RELEASED, STILL_HELD or NOT_OWNED."""
        return scripts.LOCK_RELEASE(
            self._release_keys, release_argv(token, depth), client=self.redis
        )

    def do_extend(self, token: str, ttl_ms: int) -> bool:
        """One extend round trip: whether the token still held the lock."""
        return scripts.LOCK_EXTEND(self._extend_keys, (token, ttl_ms), client=self.redis) == 1

    def do_wait(self, seconds: float) -> None:
        """Block until a release signals, or ``seconds`` pass."""
        if self._wait_cap is not None:
            seconds = min(seconds, self._wait_cap * 0.8)
        self.redis.blpop([self.keys.signal], timeout=max(seconds, MIN_WAIT))

    # -- bookkeeping ---------------------------------------------------------

    def _on_grant(self, token: str, fence: int, count: int) -> None:
        self.token = token
        self.fence = fence
        self.lost = False
        self._holds += 1
        if self.reentrant:
            _depths[(self.keys.lock, token)] = count
        if count == 1 and self.watchdog:
            _watchdog.add(self)
        acquire_log.debug("acquired %r fence=%s count=%s", self.name, fence, count)

    def _abandon(self, token: str) -> None:
        """After a failed acquire round trip, undo a grant whose reply may have been lost."""
        try:
            self.do_release(token, 1)
        except RedisError:
            acquire_log.warning(
                "lock %r: acquire failed and the token could not be released; "
                "if it was granted, it frees when its lease runs out",
                self.name,
            )


class _Renewal:
    """One watchdog lock: what to renew, and when."""

    __slots__ = ("lock", "client", "name", "keys", "token", "ttl_ms", "interval", "due")

    def __init__(self, lock: Lock) -> None:
        self.lock = weakref.ref(lock)
        self.client = lock.redis
        self.name = lock.name
        self.keys = lock._extend_keys
        self.token = lock.token
        self.ttl_ms = lock._ttl_ms
        self.interval = lock.ttl / 3
        self.due = time.monotonic() + self.interval


class Watchdog:
    """One daemon thread per process that renews every watchdog lock's lease.

    Each lock is renewed every ``ttl / 3`` seconds; locks falling due within
    the next quarter interval are renewed with it, in one pipelined round trip
    per Redis client. A lock whose renewal finds its token gone is dropped and
    marked ``lost``. The thread holds only weak references, so a Lock object
    that is garbage-collected without release is no longer renewed either.
    """

    THREAD_NAME = "stock_locks-watchdog"

    def __init__(self) -> None:
        self._renewals: dict[tuple[str, str], _Renewal] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_at: float | None = None  # when the sleeping thread next looks; None: never

    def add(self, lock: Lock) -> None:
        renewal = _Renewal(lock)
        with self._cond:
            self._renewals[(lock.keys.lock, lock.token)] = renewal
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=self.THREAD_NAME, daemon=True
                )
                self._thread.start()
            elif self._wake_at is None or renewal.due < self._wake_at:
                self._cond.notify()  # only when this lock falls due before the planned wake-up

    def discard(self, entry: tuple[str, str]) -> None:
        with self._cond:
            self._renewals.pop(entry, None)

    def __len__(self) -> int:
        return len(self._renewals)

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._take_due()
                while not batch:
                    wait = self._next_wait()
                    self._wake_at = None if wait is None else time.monotonic() + wait
                    self._cond.wait(wait)
                    batch = self._take_due()
                self._wake_at = 0.0  # busy renewing: add() need not notify
            self._renew(batch)

    def _take_due(self) -> list[tuple[tuple[str, str], _Renewal]]:
        now = time.monotonic()
        batch = []
        for entry, renewal in list(self._renewals.items()):
            if renewal.lock() is None:
                del self._renewals[entry]
            elif renewal.due - renewal.interval / 4 <= now:
                renewal.due = now + renewal.interval
                batch.append((entry, renewal))
        return batch

    def _next_wait(self) -> float | None:
        if not self._renewals:
            return None
        return max(0.0, min(r.due for r in self._renewals.values()) - time.monotonic())

    def _renew(self, batch: list[tuple[tuple[str, str], _Renewal]]) -> None:
        by_client: dict[int, tuple[Any, list]] = {}
        for item in batch:
            by_client.setdefault(id(item[1].client), (item[1].client, []))[1].append(item)
        for client, items in by_client.values():
            calls = [(scripts.LOCK_EXTEND, r.keys, (r.token, r.ttl_ms)) for _, r in items]
            try:
                results = scripts.run_batch(client, calls)
            except RedisError as exc:
                renewal_log.warning("could not renew %d lock(s), will retry: %s", len(items), exc)
                retry = time.monotonic() + min(1.0, items[0][1].interval / 3)
                for _, renewal in items:
                    renewal.due = min(renewal.due, retry)
                continue
            for (entry, renewal), result in zip(items, results, strict=True):
                if result == 1:
                    continue
                with self._cond:
                    # Released meanwhile: the release discarded it, and nothing is lost.
                    if self._renewals.get(entry) is not renewal:
                        continue
                    del self._renewals[entry]
                lock = renewal.lock()
                if lock is not None:
                    lock.lost = True
                renewal_log.warning(
                    "lock %r lost: its token no longer holds the key (%s); stopped renewing",
                    renewal.name,
                    result,
                )


_watchdog = Watchdog()


def _after_fork_in_child() -> None:
    # The child owns none of the parent's locks: it gets a fresh identity, fresh
    # owner tokens and its own (not yet started) renewal thread.
    global _process, _owners, _watchdog
    _process = _Process()
    _owners = threading.local()
    _depths.clear()
    _watchdog = Watchdog()


os.register_at_fork(after_in_child=_after_fork_in_child)
