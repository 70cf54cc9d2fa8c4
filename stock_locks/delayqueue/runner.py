"""Draining a delay queue: claimed batches handled, acknowledged together, given back
when they run long; and a waiter that sleeps until the queue has work.

Draining a batch (:func:`drain`): finished items are acknowledged together when
the batch ends. A batch is worked on for at most a quarter of the visibility
timeout (``GIVE_BACK_SHARE``); after that, the items not yet started go back to
the queue, due now, and the finished ones are acknowledged, by a helper thread
if a handler is still running. So a handler that hangs holds up only its own
item, which is delivered again when its visibility runs out, never the rest
of its batch. Give one handler call well under the visibility timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import metrics
from ..backends.redis.cluster import blocking_cap
from ..backends.redis.errors import REDIS_ERRORS, REDIS_FAILURES
from ..conf import settings
from ..exceptions import MissingHandler, RedisUnavailable
from .handlers import HANDLERS, celery_task_named

if TYPE_CHECKING:
    from .queue import DelayQueue, Item

log = logging.getLogger("stock_locks.delayqueue")

# A batch is worked on for at most this share of its visibility timeout; then
# its unstarted items go back to the queue and its finished ones are acknowledged.
GIVE_BACK_SHARE = 0.25
# How many times drain sends the end-of-batch ack (safe to repeat) when Redis does
# not answer: a lost reply must not make a handled batch run again.
SETTLE_ATTEMPTS = 3


@dataclass
class DrainResult:
    handled: int = 0
    dispatched: int = 0  # sent to Celery
    failed: int = 0  # will be retried
    dead: int = 0  # went to the dead-letter set
    released: int = 0  # given back unstarted (a batch ran long), due again now
    batches: int = 0
    errors: list[str] = field(default_factory=list)


def drain(queue: DelayQueue, *, limit: int | None = None, max_batches: int = 50) -> DrainResult:
    """Claim due items in batches and handle each; ack each batch in one round trip.

    An item is handled by the handler registered for its task, else sent to
    the Celery task of that name. A handler that raises, or a task with
    neither, makes the item fail: it is retried after a backoff, and
    dead-lettered after ``max_attempts`` deliveries. Stops when nothing is
    due, or after ``max_batches`` batches.

    A batch is worked on for at most ``GIVE_BACK_SHARE`` of the visibility
    timeout: then its unstarted items are given back (due now) and its
    finished ones acknowledged, by a helper thread while a handler still
    runs, so a hanging handler makes only its own item be delivered again.
    Blocks while handlers run. Raises ``redis.RedisError`` when Redis fails
    (an ack is first tried ``SETTLE_ATTEMPTS`` times); handled items not
    acknowledged are delivered again.
    """
    result = DrainResult()
    keeper: _Keeper | None = None
    share = queue.visibility_timeout * GIVE_BACK_SHARE
    try:
        for _ in range(max_batches):
            started = time.monotonic()  # before the claim: its deadline is later
            items = queue.claim(limit)
            if not items:
                break
            result.batches += 1
            batch = _Batch(items, started + share, started + queue.visibility_timeout)
            if keeper is None:
                keeper = _Keeper(queue, share / 4)
            keeper.batch = batch
            try:
                _work(queue, batch, result)
            except BaseException:
                keeper.batch = None
                _settle(queue, batch, result, quiet=True)
                raise
            keeper.batch = None
            _settle(queue, batch, result)
    finally:
        if keeper is not None:
            keeper.close()
    metrics.seen("drainer")  # the dashboard's heartbeat of the drainers (and of beat's ticks)
    return result


def _work(queue: DelayQueue, batch: _Batch, result: DrainResult) -> None:
    pending, done, give_back_at = batch.pending, batch.done, batch.give_back_at
    clock = time.monotonic
    # The first item starts while the claim's visibility surely lasts (so a slow
    # claim still makes progress), the others only before the give-back time.
    # Taking items with popleft (atomic) races safely with the keeper's settle.
    until = batch.visible_until
    while pending and clock() < until:
        try:
            item = pending.popleft()
        except IndexError:  # the keeper gave the rest back
            return
        if _handle(queue, item, result):
            done.append(item.id)
        until = give_back_at


def _settle(queue: DelayQueue, batch: _Batch, result: DrainResult, *, quiet: bool = False) -> None:
    """Ack and give back what is left of a batch; a failed connection is tried again
    (both scripts are safe to repeat). ``quiet``: log a failure instead of raising."""
    try:
        for attempt in range(1, SETTLE_ATTEMPTS + 1):
            try:
                batch.settle(queue)
                break
            except RedisUnavailable as exc:
                if attempt == SETTLE_ATTEMPTS:
                    raise
                log.warning(
                    "delay queue %r: acknowledging a batch failed (%s), trying again",
                    queue.name, exc,
                )  # fmt: skip
    except REDIS_FAILURES as exc:
        if not quiet:
            raise
        log.warning("delay queue %r: could not acknowledge a batch: %s", queue.name, exc)
    finally:
        result.released += batch.given_back - batch.counted
        batch.counted = batch.given_back


def _handle(queue: DelayQueue, item: Item, result: DrainResult) -> bool:
    func = HANDLERS.get(item.task)
    celery_task = None if func is not None else celery_task_named(item.task)
    try:
        if func is not None:
            func(item.payload)
            result.handled += 1
        elif celery_task is not None:
            celery_task.apply_async(args=(item.payload,))
            result.dispatched += 1
        else:
            # Not dead at once: the drainer may be an old deploy, or the
            # module registering the handler was not imported (yet).
            raise MissingHandler(
                f"no handler or Celery task is registered for task {item.task!r} in this "
                f"process (is it in an installed app's "
                f"{settings.DELAY_QUEUE_HANDLERS_MODULE!r} module?)"
            )
        return True
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        outcome = queue._fail(item.id, error, None, queue.max_attempts, item.attempts)
        log.warning(
            "delay queue %r: item %r (%s) failed on delivery %d, %s: %s",
            queue.name, item.id, item.task, item.attempts, outcome, error,
        )  # fmt: skip
        result.failed += outcome == "retry"
        result.dead += outcome == "dead"
        if outcome == "dead":
            metrics.dead_lettered(queue.name)
        result.errors.append(error)
        return False


class _Batch:
    """A claimed batch being worked on, shared by the drainer and its keeper thread.

    The drainer takes items from ``pending`` one by one; whoever settles takes
    what is left. Both use ``deque.popleft`` (atomic), so an item is either
    handled by the drainer or given back, never both.
    """

    __slots__ = ("pending", "done", "give_back_at", "visible_until", "acked", "to_release",
                 "given_back", "counted", "kept", "lock")  # fmt: skip

    def __init__(self, items: list[Item], give_back_at: float, visible_until: float) -> None:
        self.pending = deque(items)
        self.done: list[str] = []  # ids handled; done[:acked] are acknowledged
        self.give_back_at = give_back_at  # time.monotonic()
        self.visible_until = visible_until  # time.monotonic(), at or before the claim's deadline
        self.acked = 0
        self.to_release: list[Item] = []  # taken back, not yet confirmed by Redis
        self.given_back = 0
        self.counted = 0  # given_back already added to a DrainResult
        self.kept = False  # the keeper has settled this batch
        self.lock = threading.Lock()  # one settle at a time

    def settle(self, queue: DelayQueue) -> None:
        """Acknowledge the finished items and give back the unstarted ones, in one
        round trip. Safe to repeat; raises RedisUnavailable (a later call retries)."""
        with self.lock:
            while True:
                try:
                    self.to_release.append(self.pending.popleft())
                except IndexError:
                    break
                self.given_back += 1
            end = len(self.done)
            ids = self.done[self.acked : end]
            if self.to_release:
                queue.ack_and_release(ids, self.to_release)
            elif ids:
                queue.ack(*ids)
            self.acked = end
            self.to_release = []


class _Keeper:
    """A drain's helper thread: settles a batch whose handler runs past its give-back time.

    Without it, items finished before a hanging handler would wait unacknowledged
    (and the unstarted ones in flight) until the visibility ran out, and the whole
    batch would be delivered again. The running handler's own item is left in
    flight: if it never returns, its visibility runs out and it is delivered again.
    """

    def __init__(self, queue: DelayQueue, period: float) -> None:
        self.queue = queue
        self.period = period  # seconds between looks
        self.batch: _Batch | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"stock_locks-dq-keeper-{queue.name}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            batch = self.batch
            if batch is None or batch.kept or time.monotonic() < batch.give_back_at:
                continue
            try:
                batch.settle(self.queue)
            except REDIS_FAILURES as exc:
                log.warning("delay queue %r: keeper: %s", self.queue.name, exc)
                continue  # tried again at the next look, and by the drainer at the end
            batch.kept = True
            log.warning(
                "delay queue %r: a batch is still being handled at %.0f%% of its visibility "
                "timeout; acknowledged %d finished items, gave %d unstarted back",
                self.queue.name, GIVE_BACK_SHARE * 100, batch.acked, batch.given_back,
            )  # fmt: skip


class QueueWaiter:
    """Lets a runner sleep until its queue has work, without polling.

    Redis times out blocked commands only every 100 ms, so the timer is a
    precise local wait on an Event, computed from the Redis clock; one
    listener thread, blocked in BLPOP on the queue's signal list, sets the
    Event when a schedule moves the next due time earlier.
    """

    def __init__(self, queue: DelayQueue) -> None:
        self.queue = queue
        self.event = threading.Event()
        self._closed = False
        cap = blocking_cap(queue.redis)
        self._slice = 1.0 if cap is None else min(1.0, cap * 0.5)  # seconds per BLPOP
        self._thread = threading.Thread(
            target=self._listen, name=f"stock_locks-dq-{queue.name}", daemon=True
        )
        self._thread.start()

    def wait(self, max_wait: float) -> None:
        """Return when an item is due (or due for redelivery), when an earlier item
        is scheduled, or after ``max_wait`` seconds."""
        self.event.clear()  # before reading: a signal after the read is not lost
        stats = self.queue.stats()
        if stats["due_now"]:
            return
        pending = [v for v in (stats["next_due_in"], stats["next_redelivery_in"]) if v is not None]
        self.event.wait(min([max_wait, *pending]))

    def close(self) -> None:
        self._closed = True
        self.event.set()

    def _listen(self) -> None:
        while not self._closed:
            try:
                if self.queue.redis.blpop([self.queue.keys.signal], timeout=self._slice):
                    self.event.set()
            except REDIS_ERRORS as exc:
                log.warning("delay queue %r: signal listener: %s", self.queue.name, exc)
                self.event.set()  # let the runner look, and meet the error itself
                threading.Event().wait(self._slice)
