"""Counting semaphores in Redis: at most ``limit`` holders of a name at once.

The holders of a semaphore sit in a sorted set scored by when their lease ends,
on the Redis clock (``TIME`` inside Lua), so no client's clock matters and a
holder that dies frees its permit when its lease ends. One script, one round
trip, removes ended leases and grants a permit when fewer than ``limit``
holders remain. Each holder's metadata (host, pid, thread, caller, acquired-at
from the Redis clock) is a field of a side hash, removed with its entry, and
every key expires after the last lease, so an abandoned semaphore vanishes.

Keys (``stock_locks.keys.semaphore_keys``), all under one hash tag:

- ``holders``: zset, holder id -> lease end (ms since the epoch, Redis clock);
- ``meta``: hash, ``limit`` (of the last grant), holder id -> JSON
  ``{"host", "pid", "thread", "caller", "acquired_at"}`` (ms), and, for a
  plain semaphore, ``waiting``: until when (ms) a refused caller may sleep;
- ``signal``: the plain semaphore's wake-up list;
- ``queue`` (id -> ticket), ``alive`` (id -> when its place lapses, ms),
  ``ticket`` (counter) and one wake-up list per waiter: the fair semaphore's.

:class:`Semaphore` is not fair: whoever tries when a permit is free gets it. A
refused caller sleeps in ``BLPOP`` on the signal list, which every release
pushes to while someone may be waiting. :class:`FairSemaphore` admits waiters
in arrival order: a waiter takes a ticket once (``INCR`` inside Lua: the server
decides the order, so a client whose clock runs ahead steals nothing) and is
admitted only when its rank in the queue is below the number of free permits.
Each waiter sleeps on its own list, and whatever frees a permit (a release, an
ended lease, a waiter leaving) wakes exactly the waiters it lets in.

Either way nobody polls: each sleep is bounded by the moment the caller's turn
could come without a wake-up (the lease end that would free its permit, and
for a fair waiter the lapse of the place just ahead of it), by its timeout and
by the socket timeout (``connection.blocking_cap``). A lost wake-up costs at
most one lease, never a deadlock. And a holder never times out without knowing:
``refresh()`` and ``release()`` compare its lease with the server's clock and
raise :class:`LockNotOwned` once it has ended, because from then on its permit
was free to someone else.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from . import scripts
from .conf import settings
from .connection import blocking_cap, get_redis
from .exceptions import LockError, LockNotOwned
from .keys import SemaphoreKeys, semaphore_keys
from .locks import MIN_WAIT, LeaseGuard, caller_of, process_identity, seconds_to_ms

if TYPE_CHECKING:
    from redis import Redis

acquire_log = logging.getLogger("stock_locks.semaphore.acquire")
release_log = logging.getLogger("stock_locks.semaphore.release")
refresh_log = logging.getLogger("stock_locks.semaphore.refresh")

# The scripts' "patience" argument: how long the caller sleeps before its next try.
NO_WAIT = 0  # a last try: do not wait (a fair waiter leaves the queue when refused)
NO_BOUND = -1  # the caller waits as long as it takes


def check_limit(limit: object, name: str | None = None) -> int:
    """``limit`` if it is an int >= 1 (not a bool), else :class:`LockError`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise LockError(f"limit must be an int >= 1, got {limit!r}", name=name)
    return limit


def check_timeout(timeout: object, name: str | None = None) -> float | None:
    """``timeout`` if it is None or a number of seconds >= 0, else :class:`LockError`."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise LockError(f"timeout must be None or >= 0 seconds, got {timeout!r}", name=name)
    return timeout


def _patience_ms(seconds: float) -> int:
    if seconds <= 0:
        return NO_WAIT
    if math.isinf(seconds):
        return NO_BOUND
    return max(1, int(seconds * 1000))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Semaphore(LeaseGuard):
    """At most ``limit`` holders of ``name`` at once, each for ``ttl`` seconds at most.

    Not fair: a permit goes to whoever tries first once it is free. Use
    :class:`FairSemaphore` to admit waiters in arrival order.

    Args:
        name: what is limited, e.g. ``"exports"``. Keys are
            ``<prefix>:sem:{<name>}`` plus side keys under the same hash tag.
        limit: how many holders at once (an int >= 1). Every user of ``name``
            must pass the same limit.
        ttl: the lease of a permit in seconds (default
            ``STOCK_LOCKS["SEMAPHORE_TTL"]``, 30). A holder that dies frees its
            permit after at most this long; a live one calls ``refresh()``.
        timeout: how long ``acquire()`` waits for a permit, in seconds.
            ``None`` (default) waits as long as it takes; ``0`` tries once.
        blocking: ``False`` makes ``acquire()`` try once, whatever ``timeout``.
        redis: the redis-py client to use (default: django-redis's client for
            ``STOCK_LOCKS["REDIS_ALIAS"]``).
        caller: a label for the admin page (default: the creating function).

    One object is one holder, identified by ``id`` (128 random bits, kept for
    the object's life): a retried acquire with the same id is granted the
    permit it already holds. Create one object per thread (it is cheap). As a
    context manager it raises :class:`LockTimeout` when no permit is granted.
    """

    kind = "semaphore"

    ticket: int | None = None  # FairSemaphore: this waiter's ticket; always None here

    def __init__(
        self,
        name: str,
        limit: int,
        ttl: float | None = None,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        redis: Redis | None = None,
        caller: str | None = None,
    ) -> None:
        try:
            self.keys: SemaphoreKeys = semaphore_keys(name)
        except ValueError as exc:
            raise LockError(str(exc), name=name) from None
        self.name = name
        self.limit = check_limit(limit, name)
        self.ttl = settings.SEMAPHORE_TTL if ttl is None else ttl
        self._ttl_ms = seconds_to_ms(self.ttl, "ttl", name)
        self.timeout = check_timeout(timeout, name)
        self.blocking = blocking
        self.redis = get_redis() if redis is None else redis
        self.caller = caller or caller_of(sys._getframe(1))
        self.id = secrets.token_hex(16)
        self.lost = False
        self._held = False
        self._wait_cap = blocking_cap(self.redis)
        self._setup_keys()

    def _setup_keys(self) -> None:
        keys = self.keys
        self._acquire_keys: tuple[str, ...] = (keys.holders, keys.meta)
        self._release_keys: tuple[str, ...] = (keys.holders, keys.meta, keys.signal)
        self._refresh_keys: tuple[str, ...] = (keys.holders, keys.meta)
        self._wake_key = keys.signal

    def __repr__(self) -> str:
        state = "held" if self._held else "not held"
        return f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} {state}>"

    # -- public API: local checks, then the do_* methods talk to Redis ------

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take a permit; True when granted, False when none was granted in time.

        ``blocking`` and ``timeout`` override the constructor's values for this
        call (``None`` keeps them). Each try is one round trip. A refused call
        sleeps in ``BLPOP`` until a release wakes it, or until the lease that
        would free a permit ends, never longer than what is left of ``timeout``
        and never past the socket timeout (long waits are sliced into tries).

        A try whose reply is lost and retried (redis-py's retry) is granted the
        permit it already holds. If the call still fails with a Redis error,
        the permit (or place in the queue) is given back best-effort before
        the error propagates.

        Raises :class:`LockError` when this object already holds a permit or
        ``timeout`` is negative, and redis-py's errors when Redis is unreachable.
        """
        if blocking is None:
            blocking = self.blocking
        timeout = self.timeout if timeout is None else check_timeout(timeout, self.name)
        if self._held:
            raise LockError(
                f"this {type(self).__name__} object already holds a permit of {self.name!r}; "
                "use another object",
                name=self.name,
            )
        self.ticket = None
        deadline = None
        if blocking and timeout:
            deadline = time.monotonic() + timeout
        try:
            while True:
                if not blocking or timeout == 0:
                    patience = 0.0
                elif deadline is None:
                    patience = math.inf
                else:
                    patience = max(0.0, deadline - time.monotonic())
                if patience and self._wait_cap is not None:
                    patience = min(patience, self._wait_cap * 0.8)
                granted, wait_ms = self.do_acquire(_patience_ms(patience))
                if granted:
                    self._held = True
                    self.lost = False
                    acquire_log.debug("acquired a permit of %r (limit %s)", self.name, self.limit)
                    return True
                if not patience:
                    acquire_log.debug("semaphore %r full, not waiting longer", self.name)
                    return False
                self.do_wait(wait_ms / 1000)
        except BaseException:
            self._abandon()
            raise

    def release(self) -> None:
        """Give the permit back, waking a waiter.

        Raises :class:`LockError` (no round trip) when this object holds no
        permit, and :class:`LockNotOwned` when Redis says its lease had already
        ended (its permit was free to others meanwhile); the entry is removed
        either way, and this object may acquire again.
        """
        if not self._held:
            raise LockError(
                f"cannot release {self.name!r}: no permit held by this object", name=self.name
            )
        self._held = False
        if not self.do_release():
            self.lost = True
            raise LockNotOwned(
                f"semaphore {self.name!r}: this holder's lease had ended before the release "
                "(its permit was free to others)",
                name=self.name,
            )
        release_log.debug("released a permit of %r", self.name)

    def refresh(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` seconds from now (default: this semaphore's ``ttl``).

        Raises :class:`LockError` (no round trip) when this object holds no
        permit or ``ttl`` is not positive, and :class:`LockNotOwned` when the
        lease has already ended on the Redis clock (then ``lost`` is set and
        nothing is renewed; ``release()`` raises too).
        """
        if not self._held:
            raise LockError(
                f"cannot refresh {self.name!r}: no permit held by this object", name=self.name
            )
        ttl_ms = self._ttl_ms if ttl is None else seconds_to_ms(ttl, "ttl", self.name)
        if not self.do_refresh(ttl_ms):
            self.lost = True
            refresh_log.warning("semaphore %r: lease ended before it was refreshed", self.name)
            raise LockNotOwned(
                f"cannot refresh {self.name!r}: this holder's lease had already ended",
                name=self.name,
            )

    def holders(self) -> list[dict[str, Any]]:
        """The live holders, oldest grant first (one round trip).

        Each is a dict: ``identifier``, ``host``, ``pid``, ``thread``, ``caller``,
        ``acquired_at`` (seconds since the epoch, Redis clock) and ``remaining``
        (seconds left of its lease). Holders whose lease has ended are left out.
        """
        return _snapshot(self.redis, self.keys)["holders"]

    # -- the only code that talks to Redis ----------------------------------

    def _holder_argv(self) -> tuple:
        host, pid = process_identity()  # fresh in a forked child
        return (host, pid, threading.current_thread().name, self.caller)

    def do_acquire(self, patience_ms: int) -> tuple[bool, int]:
        """One try: (granted, ms to sleep before the next try when refused).

        ``patience_ms`` is the longest the caller will sleep (``NO_WAIT``: it
        will not; ``NO_BOUND``: as long as it takes).
        """
        argv = (self.id, self.limit, self._ttl_ms, patience_ms, *self._holder_argv())
        reply = scripts.SEM_ACQUIRE(self._acquire_keys, argv, client=self.redis)
        if reply[0] == 1:
            return True, 0
        return False, int(reply[1])

    def do_release(self) -> bool:
        """One release round trip: whether this id held a live permit."""
        argv = (self.id, self.limit, int(settings.WAKE_SIGNAL_TTL * 1000))
        return scripts.SEM_RELEASE(self._release_keys, argv, client=self.redis) == 1

    def do_refresh(self, ttl_ms: int) -> bool:
        """One refresh round trip: whether the lease was live and is renewed."""
        argv = (self.id, ttl_ms)
        return scripts.SEM_REFRESH(self._refresh_keys, argv, client=self.redis) == 1

    def do_wait(self, seconds: float) -> None:
        """Sleep until a wake-up arrives, or ``seconds`` pass."""
        if self._wait_cap is not None:
            seconds = min(seconds, self._wait_cap * 0.8)
        self.redis.blpop([self._wake_key], timeout=max(seconds, MIN_WAIT))

    def _abandon(self) -> None:
        """After a failed acquire, give back a permit or place whose reply may have been lost."""
        try:
            self.do_release()
        except RedisError:
            acquire_log.warning(
                "semaphore %r: acquire failed and its permit or place could not be given "
                "back; if it was taken, it frees when its lease or place lapses",
                self.name,
            )


class FairSemaphore(Semaphore):
    """A :class:`Semaphore` that admits waiters in arrival order.

    Same arguments and methods. A waiter takes a ticket once, on its first
    refused try, and is admitted only when its rank in the queue is below the
    number of free permits: nobody who came later, and no caller that does not
    wait (``timeout=0``), can take a permit while an earlier waiter waits.
    ``ticket`` is this object's ticket in its last acquire (None when it was
    admitted without queueing).

    A waiter that gives up leaves the queue in its last try and lets the next
    ones in. A waiter that dies keeps its place only until
    ``STOCK_LOCKS["WAKE_SIGNAL_TTL"]`` seconds past its planned next try; one
    that comes back later than that (a long pause) joins the queue again at
    the end, with a new ticket, and a WARNING is logged.
    """

    def _setup_keys(self) -> None:
        keys = self.keys
        self._acquire_keys = (
            keys.holders, keys.meta, keys.queue, keys.alive, keys.ticket, keys.wake_prefix,
        )  # fmt: skip
        self._release_keys = self._acquire_keys
        self._refresh_keys = (keys.holders, keys.meta, keys.queue, keys.alive, keys.ticket)
        self._wake_key = keys.wake_prefix + self.id

    def do_acquire(self, patience_ms: int) -> tuple[bool, int]:
        """One try: (granted, ms to sleep before the next try when queued).

        ``patience_ms`` as for :meth:`Semaphore.do_acquire`; with ``NO_WAIT``
        a refused caller is not queued, and leaves the queue if it was.
        """
        grace_ms = int(settings.WAKE_SIGNAL_TTL * 1000)
        argv = (self.id, self.limit, self._ttl_ms, patience_ms, grace_ms, *self._holder_argv())
        reply = scripts.FAIR_ACQUIRE(self._acquire_keys, argv, client=self.redis)
        if reply[0] == 1:
            return True, 0
        ticket = int(reply[3]) or None
        if ticket is not None:
            if self.ticket is not None and ticket != self.ticket:
                acquire_log.warning(
                    "fair semaphore %r: a waiter came back after its place lapsed; "
                    "queued again with ticket %s (was %s)",
                    self.name,
                    ticket,
                    self.ticket,
                )
            self.ticket = ticket
        return False, int(reply[1])

    def do_release(self) -> bool:
        """One round trip: give back the permit, or leave the queue; whether a live
        permit was held. Wakes the waiters this lets in."""
        argv = (self.id, self.limit, int(settings.WAKE_SIGNAL_TTL * 1000))
        return scripts.FAIR_RELEASE(self._release_keys, argv, client=self.redis) == 1


def semaphore_state(name: str, *, redis: Redis | None = None) -> dict[str, Any]:
    """What the admin page shows of one semaphore, read in one round trip.

    Returns ``{"name", "limit", "holders", "waiting"}``: ``limit`` as stored by
    the last grant (None when nobody holds or waits), ``holders`` as
    :meth:`Semaphore.holders`, ``waiting`` the length of a fair semaphore's
    queue (places about to lapse included; 0 for a plain semaphore).
    """
    try:
        keys = semaphore_keys(name)
    except ValueError as exc:
        raise LockError(str(exc), name=name) from None
    return {"name": name, **_snapshot(get_redis() if redis is None else redis, keys)}


def _snapshot(client: Redis, keys: SemaphoreKeys) -> dict[str, Any]:
    reply = scripts.SEM_STATE((keys.holders, keys.meta, keys.queue), (), client=client)
    _now_ms, limit, waiting, flat = reply
    holders = []
    for member, remaining_ms, metadata in zip(flat[::3], flat[1::3], flat[2::3], strict=True):
        info = json.loads(metadata) if metadata else {}
        acquired_at = info.get("acquired_at")
        holders.append(
            {
                "identifier": _text(member),
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
