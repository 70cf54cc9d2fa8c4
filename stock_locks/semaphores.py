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
  ``ticket`` (counter) and one wake-up list per waiter: the fair semaphore's;
- ``holders`` + ``:gone`` (:func:`gone_key`): zset, given-back holder id ->
  until when it is remembered (ms, one lease), so that a repeated release
  reports success and a late copy of an abandoned try is refused.

:class:`Semaphore` is not fair: whoever tries when a permit is free gets it. A
refused caller sleeps in ``BLPOP`` on the signal list, which every release
pushes to while someone may be waiting. :class:`FairSemaphore` admits waiters
in arrival order: a waiter takes a ticket once (``INCR`` inside Lua: the server
decides the order, so a client whose clock runs ahead steals nothing) and is
admitted only when its rank in the queue is below the number of free permits.
Each waiter sleeps on its own list. Whatever changes the holders or the queue
(a release, a grant, a waiter leaving, an ended lease or lapsed place cleared)
wakes exactly the waiters among the first ``limit`` in line whose turn it
brings forward, so a permit freed by an ended lease goes to the next waiter
when the lease ends, not when that waiter planned to look again.

Either way nobody polls: each sleep is bounded by the moment the caller's turn
could come without a wake-up (the lease end that would free its permit, and
for a fair waiter the lapse of the place just ahead of it) and by its timeout,
on a client-side deadline (``stock_locks.wakeup``), not on the server's timer
tick. A lost wake-up costs at most one lease, never a deadlock. A call that
ends with an exception mid-round-trip (KeyboardInterrupt, a Celery soft time
limit, a lost connection) gives back what it may hold by one bounded round
trip. And a holder never times out without knowing:
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
from typing import TYPE_CHECKING, Any

from . import _validate, lease, metrics
from .backends.base import Backend
from .backends.redis import gone_key  # noqa: F401  (re-exported)
from .conf import settings
from .connection import decoded
from .exceptions import BackendUnavailable, LockError, LockNotOwned
from .holder import caller_of
from .lease import Attempt, Call
from .locks import LeaseGuard, pick_backend

if TYPE_CHECKING:
    from redis import Redis

acquire_log = logging.getLogger("stock_locks.semaphore.acquire")
release_log = logging.getLogger("stock_locks.semaphore.release")
refresh_log = logging.getLogger("stock_locks.semaphore.refresh")

# The scripts' "patience" argument: how long the caller sleeps before its next try.
NO_WAIT = 0  # a last try: do not wait (a fair waiter leaves the queue when refused)
NO_BOUND = -1  # the caller waits as long as it takes


def check_limit(limit: object, name: str | None = None) -> int:
    """``limit`` if it is an int >= 1 (not a bool), else :class:`LockError`
    (``stock_locks._validate.limit``)."""
    return _validate.limit(limit, name)


def check_timeout(timeout: object, name: str | None = None) -> float | None:
    """``timeout`` if it is None or a number of seconds >= 0 (not NaN, not a bool),
    else :class:`LockError` (``stock_locks._validate.wait_seconds``)."""
    return _validate.wait_seconds(timeout, "timeout", name)


def _patience_ms(seconds: float) -> int:
    if seconds <= 0:
        return NO_WAIT
    if math.isinf(seconds):
        return NO_BOUND
    return max(1, int(seconds * 1000))


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

    Every argument is checked here, before any round trip (:class:`LockError`
    names a bad one). One object is one holder at a time, identified by ``id``
    (128 random bits): a retried try within one ``acquire()`` call is granted
    the permit it already holds. Each hold gets a fresh ``id`` once the last
    one was given back. Create one object per thread (it is cheap). As a
    context manager it raises :class:`LockTimeout` when no permit is granted.
    """

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
        redis: Redis | None = None,
        caller: str | None = None,
    ) -> None:
        self.backend = pick_backend(backend, redis)
        try:
            self.keys: Any = self.backend.semaphore_keys(name)  # type: ignore[attr-defined]
        except ValueError as exc:
            raise LockError(str(exc), name=name) from None
        except AttributeError:
            raise LockError(
                f"semaphore {name!r}: backend {self.backend.alias!r} has no semaphores",
                name=name,
            ) from None
        self.name = name
        self.limit = _validate.limit(limit, name)
        self.ttl = settings.SEMAPHORE_TTL if ttl is None else ttl
        self._ttl_ms = _validate.lease_ms(self.ttl, "ttl", name)
        self.timeout = _validate.wait_seconds(timeout, "timeout", name)
        self.blocking = _validate.flag(blocking, "blocking", name)
        self.caller = caller or caller_of(sys._getframe(1))
        self.id = secrets.token_hex(16)
        self.lost = False
        self._held = False
        self._spent = False  # this id was given back: the next acquire takes a new one
        self._lease_ms = self._ttl_ms  # the lease of the current hold (refresh may change it)

    @property
    def redis(self) -> Any:
        """The redis-py client of a Redis backend (None for other backends)."""
        return getattr(self.backend, "client", None)

    def __repr__(self) -> str:
        state = "held" if self._held else "not held"
        return f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} {state}>"

    def _run(self, steps: lease.Steps[Any]) -> Any:
        return lease.run(steps, self.backend.execute)

    # -- public API: each runs one of the *_steps generators below ----------

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take a permit; True when granted, False when none was granted in time.

        ``blocking`` and ``timeout`` override the constructor's values for this
        call (``None`` keeps them). Each try is one round trip. A refused call
        sleeps until a release wakes it, or until the lease that would free a
        permit ends, never longer than what is left of ``timeout``; the sleep
        ends on a client-side deadline (``stock_locks.wakeup``), not on the
        server's timer tick.

        A try whose reply is lost and retried is granted the permit it already
        holds. If the call ends with any exception (the backend unreachable,
        KeyboardInterrupt, a Celery soft time limit arriving mid-round trip),
        the permit or place in the queue it may have been granted is given
        back before the exception propagates, by one round trip bounded by
        ``GIVE_BACK_TIMEOUT``, and this hold's id is remembered for one lease,
        so that a copy of the try still on its way is refused when it lands.
        If even the give-back fails, a permit it had frees when its lease ends.

        Raises :class:`LockError` (no round trip) when this object already
        holds a permit or an argument is invalid, and
        :class:`~stock_locks.exceptions.BackendUnavailable` when the backend
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
        self._lease_ms = self._ttl_ms
        try:
            attempt = yield from lease.acquire(
                lambda patience, waited: Call("semaphore_try", (self, _patience_ms(patience))),
                lambda seconds: Call("semaphore_wait", (self, seconds)),
                blocking=blocking,
                timeout=timeout,
                default_wait=self.ttl,
                give_back=Call("semaphore_release", (self, True)),
                what=f"{self.kind} {self.name!r}",
                on_refused=self._on_refused,
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

    def _lost(self) -> None:
        self.lost = True
        metrics.lease_lost(self.kind, self.backend.alias, self.name)

    def _on_refused(self, attempt: Attempt) -> None:
        """After a refused try (a fair waiter follows its ticket)."""

    def release(self) -> None:
        """Give the permit back, waking the waiters it lets in.

        Safe to repeat: a release that ran but whose reply was lost reports
        success, since the backend remembers the given-back id for one lease.
        A lost reply is followed by one repeat bounded by
        ``GIVE_BACK_TIMEOUT``; when that fails too,
        :class:`~stock_locks.exceptions.BackendUnavailable` propagates and this
        object still holds the permit (call ``release()`` again). Any other
        exception during the round trip (KeyboardInterrupt, a Celery soft time
        limit) gives the permit back by one bounded round trip, then propagates.

        Raises :class:`LockError` (no round trip) when this object holds no
        permit, and :class:`LockNotOwned` when the backend says its lease had
        already ended (its permit was free to others meanwhile); the entry is
        removed either way, and this object may acquire again.
        """
        self._run(self._release_steps())

    def _release_steps(self) -> lease.Steps[None]:
        if not self._held:
            raise LockError(
                f"cannot release {self.name!r}: no permit held by this object", name=self.name
            )
        call = Call("semaphore_release", (self, False))
        try:
            live = (yield from lease.repeatable(call)) == 1
        except (BackendUnavailable, GeneratorExit):
            raise  # still held: release() again
        except BaseException:
            if (yield from lease.give_back_once(call)) is None:
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

    def refresh(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` seconds from now (default: this semaphore's ``ttl``).

        Safe to repeat; a lost reply is followed by one repeat bounded by
        ``GIVE_BACK_TIMEOUT`` (when that fails too,
        :class:`~stock_locks.exceptions.BackendUnavailable` propagates and the
        lease is as the server left it).

        Raises :class:`LockError` (no round trip) when this object holds no
        permit or ``ttl`` is not a positive number, and :class:`LockNotOwned`
        when the lease has already ended on the server's clock (then ``lost``
        is set and nothing is renewed; ``release()`` raises too).
        """
        self._run(self._refresh_steps(ttl))

    def _refresh_steps(self, ttl: float | None) -> lease.Steps[None]:
        if not self._held:
            raise LockError(
                f"cannot refresh {self.name!r}: no permit held by this object", name=self.name
            )
        ttl_ms = self._ttl_ms if ttl is None else _validate.lease_ms(ttl, "ttl", self.name)
        if (yield from lease.repeatable(Call("semaphore_refresh", (self, ttl_ms)))) != 1:
            self._lost()
            refresh_log.warning("semaphore %r: lease ended before it was refreshed", self.name)
            raise LockNotOwned(
                f"cannot refresh {self.name!r}: this holder's lease had already ended",
                name=self.name,
            )
        self._lease_ms = ttl_ms

    def holders(self) -> list[dict[str, Any]]:
        """The live holders, oldest grant first (one round trip).

        Each is a dict: ``identifier``, ``host``, ``pid``, ``thread``, ``caller``,
        ``acquired_at`` (seconds since the epoch, server clock) and ``remaining``
        (seconds left of its lease). Holders whose lease has ended are left out.
        """
        return snapshot_of(self._run(self._state_steps()))["holders"]

    def _state_steps(self) -> lease.Steps[list]:
        return (yield Call("semaphore_state", (self.keys,)))

    # -- single backend calls, for tests and tools ----------------------------

    def do_acquire(self, patience_ms: int) -> Attempt:
        """One try: the backend's :class:`~stock_locks.lease.Attempt` (``wait``: how
        long to sleep before the next try when refused).

        ``patience_ms`` is the longest the caller will sleep (``NO_WAIT``: it
        will not; ``NO_BOUND``: as long as it takes); with ``NO_WAIT`` a
        refused fair waiter is not queued, and leaves the queue if it was.
        """
        attempt = self.backend.execute(Call("semaphore_try", (self, patience_ms)))
        if not attempt.granted:
            self._on_refused(attempt)
        return attempt

    def do_release(self, abandon: bool = False) -> bool:
        """One release round trip: whether this id held a live permit (or this
        repeats a release that found one). A fair semaphore's also leaves the
        queue. ``abandon`` (after a failed acquire) also remembers the id when it
        held nothing, so that a late copy of the acquire is refused."""
        return self.backend.execute(Call("semaphore_release", (self, abandon))) == 1

    def do_wait(self, seconds: float) -> bool:
        """Sleep until a wake-up arrives (True), or ``seconds`` pass (False)."""
        return self.backend.execute(Call("semaphore_wait", (self, seconds)))


class FairSemaphore(Semaphore):
    """A :class:`Semaphore` that admits waiters in arrival order.

    Same arguments and methods. A waiter takes a ticket once, on its first
    refused try, and is admitted only when its rank in the queue is below the
    number of free permits: nobody who came later, and no caller that does not
    wait (``timeout=0``), can take a permit while an earlier waiter waits.
    ``ticket`` is this object's ticket in its last acquire (None when it was
    admitted without queueing).

    Whatever frees a permit or moves a waiter forward (a release, a grant, a
    waiter leaving, and the next try of anyone after a lease ended) wakes the
    waiters whose turn it brings closer, so a permit freed by an ended lease
    goes to the next waiter when that lease ends.

    A waiter that gives up leaves the queue in its last try and lets the next
    ones in; one whose acquire ends with an exception leaves by a give-back.
    A waiter that dies keeps its place only until
    ``STOCK_LOCKS["FAIR_QUEUE_GRACE"]`` seconds past its planned next try; one
    that comes back later than that (a long pause) joins the queue again at
    the end, with a new ticket, and a WARNING is logged.
    """

    fair = True

    def _on_refused(self, attempt: Attempt) -> None:
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


def _semaphore_keys(backend: Backend, name: str) -> Any:
    try:
        return backend.semaphore_keys(name)  # type: ignore[attr-defined]
    except ValueError as exc:
        raise LockError(str(exc), name=name) from None


def evict_holder(
    name: str,
    holder_id: str,
    *,
    backend: Backend | str | None = None,
    redis: Redis | None = None,
    limit: int | None = None,
) -> bool:
    """Take the permit of holder ``holder_id`` away (an operator's action); whether it
    held a live one. Wakes the waiters this lets in. The evicted holder's next
    ``refresh()`` or ``release()`` raises :class:`LockNotOwned`. ``limit``: the
    semaphore's stored limit when the caller has just read it (else one more read)."""
    chosen = pick_backend(backend, redis)
    keys = _semaphore_keys(chosen, name)
    if limit is None:
        limit = _snapshot(chosen, keys)["limit"]
    limit = limit or 1
    return chosen.execute(Call("semaphore_evict", (keys, holder_id, limit))) == 1


def semaphore_state(
    name: str, *, backend: Backend | str | None = None, redis: Redis | None = None
) -> dict[str, Any]:
    """What the admin page shows of one semaphore, read in one round trip.

    Returns ``{"name", "limit", "holders", "waiting"}``: ``limit`` as stored by
    the last grant (None when nobody holds or waits), ``holders`` as
    :meth:`Semaphore.holders`, ``waiting`` the length of a fair semaphore's
    queue (places about to lapse included; 0 for a plain semaphore).
    """
    chosen = pick_backend(backend, redis)
    return {"name": name, **_snapshot(chosen, _semaphore_keys(chosen, name))}


def _snapshot(backend: Backend, keys: Any) -> dict[str, Any]:
    return snapshot_of(backend.execute(Call("semaphore_state", (keys,))))


def snapshot_of(state: list) -> dict[str, Any]:
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
