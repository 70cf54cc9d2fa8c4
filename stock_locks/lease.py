"""The lease algorithms, written once and without I/O, and the driver that runs them.

Every primitive with a lease (:class:`~stock_locks.locks.Lock`,
:class:`~stock_locks.semaphores.Semaphore`, :class:`FairSemaphore`, on any
backend) acquires, releases and extends through the generators here. A
generator yields :class:`~stock_locks.backends.base.Call` objects (what to ask
the backend, type-checked against its operation) and receives their results; it
decides everything else: the deadline, bounding each wait by the holder's lease,
when to give a grant back, when to repeat a call whose reply was lost. The
surfaces drive them with :func:`run` (sync) or :func:`arun` (asyncio), each call
going to the backend's ``execute`` or ``aexecute``. Backends use the same
drivers one level down: each backend operation is a generator of transport
requests (a script call, a blocking pop), performed by a sync or an async
transport.

The failure rules, in one place:

- A backend error means the outcome is unknown (the request may have run):
  backends raise :class:`~stock_locks.exceptions.BackendUnavailable` for it.
- Every call is safe to repeat. A release or extend whose reply was lost is
  repeated once, bounded (:func:`repeatable`).
- An acquire that ends with any exception other than a backend's answer
  (:class:`~stock_locks.exceptions.LockError`: nothing is held then) gives back
  what it may have been granted, bounded, before the exception propagates.
  Under asyncio a cancellation is such an exception: a coroutine cancelled
  after its grant but before it saw the reply gives the grant back.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from . import metrics
from .backends.base import Attempt, Call, arun, bounded, run
from .exceptions import BackendUnavailable, LockError

__all__ = [
    "Attempt",
    "Call",
    "Steps",
    "acquire",
    "arun",
    "bounded",
    "give_back_once",
    "repeatable",
    "run",
]

T = TypeVar("T")
log = logging.getLogger("stock_locks.lease")


Steps = Generator[Call[Any], Any, T]


def acquire(
    try_call: Callable[[float, bool], Call[Attempt]],
    wait_call: Callable[[float], Call[Any]],
    *,
    blocking: bool,
    timeout: float | None,
    default_wait: float,
    give_back: Call[Any] | None,
    what: str,
    on_refused: Callable[[Attempt], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    labels: tuple[str, str] = ("lock", "default"),
) -> Steps[Attempt | None]:
    """Try until granted; the granting :class:`Attempt`, or None when not granted in time.

    ``try_call(patience, waited)`` builds one try: ``patience`` is how long the
    caller will sleep after a refusal (0: this is its last try; ``math.inf``: no
    bound), ``waited`` whether it slept before this try. A refused caller sleeps
    (``wait_call(seconds)``) until a wake-up or the holder's lease end
    (``Attempt.wait``, else ``default_wait``), never past ``timeout``. A wait may
    answer with an :class:`Attempt`: the backend made the next try itself at the
    wake-up (one round trip for both); otherwise a try follows every wait. A wait
    that answers None may have left such a try to run later (its reply lost): an
    acquire that then ends without a grant gives back (``give_back``, bounded), so
    that the try is refused if it still lands.
    ``blocking=False`` or ``timeout=0``: one try. ``timeout=None``: no deadline.

    Any exception but a :class:`LockError` (the backend's own answer) first
    gives back what this acquire may hold (``give_back``, bounded; None: nothing
    to give back, e.g. a reentrant re-entry), then propagates. ``on_refused``
    sees every refusal (a fair semaphore follows its ticket). The outcome and the
    time it took are recorded in :mod:`stock_locks.metrics` under ``labels``
    (primitive, backend alias).
    """
    began = clock()
    deadline = began + timeout if blocking and timeout else None
    waited = False
    attempt: Attempt | None = None  # (a try the backend made at a wake-up)
    unsure = False  # (a try the backend sent at a wake-up may still run)
    try:
        while True:
            if not blocking or timeout == 0:
                patience = 0.0
            elif deadline is None:
                patience = math.inf
            else:
                patience = max(0.0, deadline - clock())
            if attempt is None:
                attempt = yield try_call(patience, waited)
            if attempt.granted:
                metrics.lock_acquired(*labels, "granted", clock() - began)
                return attempt
            if on_refused is not None:
                on_refused(attempt)
            if not patience:
                metrics.lock_acquired(*labels, "timeout", clock() - began)
                if unsure and give_back is not None:
                    yield from give_back_once(give_back)
                return None
            wait = default_wait if attempt.wait is None else attempt.wait
            attempt = None
            if deadline is not None:
                remaining = deadline - clock()
                if remaining <= 0:
                    continue  # a last try without patience (a fair waiter leaves its queue)
                wait = min(wait, remaining)
            woken = yield wait_call(wait)
            waited = True
            if isinstance(woken, Attempt):
                attempt = woken
            elif woken is None:
                unsure = True
    except (LockError, GeneratorExit):
        raise  # the backend answered (nothing is held), or the generator is being closed
    except BaseException as exc:
        if isinstance(exc, BackendUnavailable):
            metrics.lock_acquired(*labels, "error", clock() - began)
        if give_back is not None:
            outcome = yield from give_back_once(give_back)
            if outcome is None:
                log.warning(
                    "%s: acquire failed and what it may hold could not be given back; "
                    "if it was granted, it frees when its lease runs out",
                    what,
                )
        raise


def repeatable(call: Call[T]) -> Steps[T]:
    """``call``'s result; after a lost reply (:class:`BackendUnavailable`), one bounded
    repeat's. When the repeat fails too, the first error propagates."""
    try:
        result: T = yield call
    except BackendUnavailable as error:
        try:
            result = yield bounded(call)
        except BackendUnavailable:
            raise error from None
    return result


def give_back_once(call: Call[T]) -> Steps[T | None]:
    """``call`` run once, bounded, after an interruption; its result, or None when it
    failed too (whatever it raised is swallowed: the interruption is what propagates)."""
    try:
        result: T = yield bounded(call)
    except BaseException:
        return None
    return result
