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
on a client-side deadline (``stock_locks.backends.redis.wakeup``), not on the server's timer
tick. A lost wake-up costs at most one lease, never a deadlock. A call that
ends with an exception mid-round-trip (KeyboardInterrupt, a Celery soft time
limit, a lost connection) gives back what it may hold by one bounded round
trip. And a holder never times out without knowing:
``refresh()`` and ``release()`` compare its lease with the server's clock and
raise :class:`LockNotOwned` once it has ended, because from then on its permit
was free to someone else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from . import lease
from .backends.base import Attempt
from .core.guard import LeaseGuard
from .core.semaphore import NO_BOUND, NO_WAIT, SemaphoreCore, snapshot_of

if TYPE_CHECKING:
    pass

__all__ = ["NO_BOUND", "NO_WAIT", "FairSemaphore", "Semaphore"]

T = TypeVar("T")


class Semaphore(LeaseGuard, SemaphoreCore):
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

    def _run(self, steps: lease.Steps[T]) -> T:
        return lease.run(steps, self.backend.execute)

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take a permit; True when granted, False when none was granted in time.

        ``blocking`` and ``timeout`` override the constructor's values for this
        call (``None`` keeps them). Each try is one round trip. A refused call
        sleeps until a release wakes it, or until the lease that would free a
        permit ends, never longer than what is left of ``timeout``; the sleep
        ends on a client-side deadline (``stock_locks.backends.redis.wakeup``), not on the
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

    def holders(self) -> list[dict[str, Any]]:
        """The live holders, oldest grant first (one round trip).

        Each is a dict: ``identifier``, ``host``, ``pid``, ``thread``, ``caller``,
        ``acquired_at`` (seconds since the epoch, server clock) and ``remaining``
        (seconds left of its lease). Holders whose lease has ended are left out.
        """
        holders: list[dict[str, Any]] = snapshot_of(self._run(self._state_steps()))["holders"]
        return holders

    # -- single backend calls, for tests and tools -----------------------------------------

    def do_acquire(self, patience_ms: int) -> Attempt:
        """One try: the backend's :class:`~stock_locks.lease.Attempt` (``wait``: how
        long to sleep before the next try when refused).

        ``patience_ms`` is the longest the caller will sleep (``NO_WAIT``: it
        will not; ``NO_BOUND``: as long as it takes); with ``NO_WAIT`` a
        refused fair waiter is not queued, and leaves the queue if it was.
        """
        attempt = self.backend.execute(self._try(patience_ms))
        if not attempt.granted:
            self._on_refused(attempt)
        return attempt

    def do_release(self, abandon: bool = False) -> bool:
        """One release round trip: whether this id held a live permit (or this
        repeats a release that found one). A fair semaphore's also leaves the
        queue. ``abandon`` (after a failed acquire) also remembers the id when it
        held nothing, so that a late copy of the acquire is refused."""
        return self.backend.execute(self._releasing(abandon)) == 1

    def do_wait(self, seconds: float) -> bool:
        """Sleep until a wake-up arrives (True), or ``seconds`` pass (False)."""
        return self.backend.execute(self._wait_call(seconds))


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
