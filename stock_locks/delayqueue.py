"""A delay queue in Redis: items due at a time, claimed in atomic batches, at least once.

Layout (one hash tag per queue, so every script runs on Redis Cluster): a
sorted set of due items scored by due time (the Redis clock), a hash of their
payloads, an in-flight sorted set scored by visibility deadline, a dead-letter
sorted set, and the delivery counts and last errors.

    queue = DelayQueue("default")
    queue.schedule("shop.expire_order", {"order": 42}, delay=900, id="expire-order-42")
    queue.cancel("expire-order-42")              # paid in time

    @queue.handler("shop.expire_order")
    def expire_order(payload): ...

    queue.drain()                                 # what the Celery beat task does

Delivery is at least once: ``claim`` moves a batch in flight in one script; an
item not acknowledged before its visibility timeout is due again, and after
``max_attempts`` deliveries it goes to the dead-letter set with its last
error. Handlers must therefore be idempotent (by business id). Two drainers
never get the same item while its visibility lasts.

Where handlers live: a module named ``delay_handlers`` in any installed app
(``STOCK_LOCKS["DELAY_QUEUE_HANDLERS_MODULE"]``). stock_locks imports it in
every process when Django is ready, the way Celery finds ``tasks`` modules, so
a Celery worker or ``run_delay_queue`` knows every handler before it drains.
An item whose task has no handler (nor a Celery task of that name) is retried
with the usual backoff, then dead-lettered: a deploy that briefly runs a
drainer without the new handler loses nothing.

Draining a batch (``drain``): finished items are acknowledged together when the
batch ends. A batch is worked on for at most a quarter of the visibility
timeout (``GIVE_BACK_SHARE``); after that, the items not yet started go back to
the queue, due now, and the finished ones are acknowledged, by a helper thread
if a handler is still running. So a handler that hangs holds up only its own
item, which is delivered again when its visibility runs out, never the rest
of its batch. Give one handler call well under the visibility timeout.

Lost replies (the request ran, the answer never came back): ``schedule`` and
``cancel`` of an item id are safe to call again (one copy, or none); a
``claim`` whose reply was lost leaves its items in flight, unseen, and they are
due again when their visibility runs out (that delivery is counted); ``ack``
and ``release`` are safe to repeat, and ``drain`` repeats a failed ack itself.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import metrics, scripts
from .backends.redis import run_batch
from .conf import settings
from .connection import REDIS_ERRORS, STALE_ROUTE_ERRORS, blocking_cap, get_redis
from .exceptions import StockLocksError
from .keys import delay_queue_keys

log = logging.getLogger("stock_locks.delayqueue")

Handler = Callable[[Any], Any]
# Task name -> handler, for every queue of this process.
HANDLERS: dict[str, Handler] = {}
MAX_RETRY_DELAY = 300  # seconds between deliveries of a failing item, at most
MAX_ID = 200  # characters
# A batch is worked on for at most this share of its visibility timeout; then
# its unstarted items go back to the queue and its finished ones are acknowledged.
GIVE_BACK_SHARE = 0.25
# How many times drain sends the end-of-batch ack (safe to repeat) when the
# connection fails: a lost reply must not make a handled batch run again.
SETTLE_ATTEMPTS = 3
# The failures after which drain sends the ack again: a lost reply, a cluster mid-failover.
SETTLE_RETRY_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    *STALE_ROUTE_ERRORS,
)


class InvalidSchedule(StockLocksError, ValueError):
    """A schedule call was malformed; nothing was scheduled."""


class MissingHandler(StockLocksError, LookupError):
    """A claimed item's task has no handler and no Celery task in this process."""


class Item(NamedTuple):
    """A claimed item: handle it, then ``ack`` (or ``fail``, or ``release``) it.

    Immutable. A named tuple rather than a frozen dataclass: a claim builds
    hundreds per round trip, and this is the cheapest immutable record to build.
    """

    id: str
    task: str
    payload: Any
    attempts: int  # deliveries so far, this one included
    # When this delivery's visibility ends (epoch ms, Redis clock); it also
    # identifies the delivery, for :meth:`DelayQueue.release`.
    deadline_ms: int = 0


@dataclass
class DrainResult:
    handled: int = 0
    dispatched: int = 0  # sent to Celery
    failed: int = 0  # will be retried
    dead: int = 0  # went to the dead-letter set
    released: int = 0  # given back unstarted (a batch ran long), due again now
    batches: int = 0
    errors: list[str] = field(default_factory=list)


def _ms(value: float | int) -> int:
    return int(round(value * 1000))


def _epoch_ms_to_datetime(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


class DelayQueue:
    """A named delay queue.

    Args:
        name: the queue's name; keys are ``<prefix>:dq:{<name>}:...``.
        max_attempts: deliveries before an item goes to the dead-letter set
            (default ``STOCK_LOCKS["DELAY_QUEUE_MAX_ATTEMPTS"]``, 5).
        visibility_timeout: seconds a claimed item stays invisible to other
            drainers (default ``DELAY_QUEUE_VISIBILITY``, 30). One handler call
            must take well under this, or its item is delivered again; ``drain``
            gives a batch's unstarted items back after ``GIVE_BACK_SHARE`` of it.
        redis: the client (default: django-redis's for ``REDIS_ALIAS``).
    """

    def __init__(
        self,
        name: str = "default",
        *,
        max_attempts: int | None = None,
        visibility_timeout: float | None = None,
        redis: Any = None,
    ) -> None:
        try:
            self.keys = delay_queue_keys(name)
        except ValueError as exc:
            raise InvalidSchedule(str(exc)) from None
        self.name = name
        self.max_attempts = (
            settings.DELAY_QUEUE_MAX_ATTEMPTS if max_attempts is None else max_attempts
        )
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise InvalidSchedule(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if self.max_attempts < 1:
            raise InvalidSchedule(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        self.visibility_timeout = _positive(
            settings.DELAY_QUEUE_VISIBILITY if visibility_timeout is None else visibility_timeout,
            "visibility_timeout",
        )
        self.redis = get_redis() if redis is None else redis
        k = self.keys
        self._all_keys = (k.due, k.items, k.attempts, k.errors, k.inflight, k.dead)
        self._ack_keys = (k.inflight, k.items, k.attempts, k.errors)
        self._release_keys = (k.due, k.inflight, k.attempts, k.signal)

    def __repr__(self) -> str:
        return f"<DelayQueue {self.name!r}>"

    # -- producing -------------------------------------------------------------

    def schedule(
        self,
        task: str,
        payload: Any = None,
        *,
        delay: float | None = None,
        eta: dt.datetime | None = None,
        id: str | None = None,
    ) -> str:
        """Schedule ``task`` with a JSON-serialisable ``payload``; returns the item id.

        Due ``delay`` seconds from now by the Redis clock, or at ``eta`` (an
        aware datetime); with neither, due now. Scheduling an existing ``id``
        again replaces its payload and due time (never a second copy), even if
        it is in flight or dead. So with an ``id``, a call whose reply was lost
        (``redis.ConnectionError`` or ``TimeoutError``) is safe to repeat;
        without one, a repeat adds a second item. One round trip. Raises
        :class:`InvalidSchedule` for a bad argument, before any round trip.
        """
        if not isinstance(task, str) or not task:
            raise InvalidSchedule(f"task must be a non-empty string, got {task!r}")
        if delay is not None and eta is not None:
            raise InvalidSchedule("give delay or eta, not both")
        due_at = ""
        delay_ms = 0
        if eta is not None:
            if not isinstance(eta, dt.datetime) or eta.tzinfo is None:
                raise InvalidSchedule(f"eta must be an aware datetime, got {eta!r}")
            due_at = str(_ms(eta.timestamp()))
        elif delay is not None:
            if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
                raise InvalidSchedule(f"delay must be a number of seconds >= 0, got {delay!r}")
            delay_ms = _ms(delay)
        item_id = _check_id(id) if id is not None else _new_id()
        try:
            body = json.dumps({"task": task, "payload": payload}, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidSchedule(f"payload is not JSON-serialisable: {exc}") from None
        keys = (*self._all_keys, self.keys.signal)
        scripts.DELAY_SCHEDULE(keys, (item_id, body, delay_ms, due_at), client=self.redis)
        return item_id

    def cancel(self, id: str) -> bool:
        """Remove the item wherever it is (due, in flight, dead). True if it existed.

        Safe to repeat: once any call has run, the item is gone. A repeat after a
        lost reply answers False, the first call having removed it. An item already
        handed to a handler is not stopped: make handlers check their business state.
        """
        return bool(scripts.DELAY_REMOVE(self._all_keys, (_check_id(id),), client=self.redis))

    # -- consuming ---------------------------------------------------------------

    def claim(
        self, limit: int | None = None, visibility_timeout: float | None = None
    ) -> list[Item]:
        """Atomically take up to ``limit`` due items in flight; one round trip.

        Items whose visibility ran out are first made due again (or dead after
        ``max_attempts`` deliveries). Claimed items stay invisible for
        ``visibility_timeout`` seconds (default: the queue's); ``ack`` them, or
        ``release`` those you will not handle. When the reply is lost, the items
        stay in flight unseen and are due again once their visibility ends.
        """
        limit = settings.DELAY_QUEUE_BATCH if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidSchedule(f"limit must be an int >= 1, got {limit!r}")
        visibility = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        argv = (limit, _ms(_positive(visibility, "visibility_timeout")), self.max_attempts)
        flat = scripts.DELAY_CLAIM(self._all_keys, argv, client=self.redis)
        if not flat:
            return []
        deadline, oldest_due = int(flat[-2]), float(flat[-1])
        metrics.delay_claimed(self.name, deadline - argv[1] - oldest_due)
        items = []
        for i in range(0, len(flat) - 2, 3):
            body = json.loads(flat[i + 1])
            item_id = flat[i].decode() if isinstance(flat[i], bytes) else flat[i]
            items.append(Item(item_id, body["task"], body["payload"], int(flat[i + 2]), deadline))
        return items

    def ack(self, *ids: str) -> int:
        """Forget handled items, in one round trip; how many were still in flight.

        Safe to repeat (a lost reply): an id no longer in flight is skipped.
        """
        if not ids:
            return 0
        return scripts.DELAY_ACK(self._ack_keys, ids, client=self.redis)

    def release(self, *items: Item) -> int:
        """Give claimed items you will not handle back to the queue, due now; one round trip.

        The delivery is not counted. Only items still in flight under the claim
        that returned them go back (not one another drainer claimed since its
        visibility ran out), so a repeat changes nothing. Returns how many went back.
        """
        if not items:
            return 0
        return scripts.DELAY_RELEASE(self._release_keys, _release_argv(items), client=self.redis)

    def fail(self, id: str, error: str, *, delay: float | None = None) -> str:
        """Record a failed delivery: ``"retry"`` (due again after ``delay`` seconds,
        default a backoff of 2**deliveries, at most 300), ``"dead"`` (out of
        deliveries), or ``"gone"`` (no longer in flight: nothing changed)."""
        return self._fail(id, error, delay, self.max_attempts)

    def bury(self, id: str, error: str) -> str:
        """Move an in-flight item to the dead-letter set now, with ``error``."""
        return self._fail(id, error, 0, 0)

    def _fail(
        self,
        id: str,
        error: str,
        delay: float | None,
        max_attempts: int,
        attempts: int | None = None,
    ) -> str:
        if delay is None:
            if attempts is None:
                attempts = int(self.redis.hget(self.keys.attempts, id) or 1)
            delay = min(2**attempts, MAX_RETRY_DELAY)
        k = self.keys
        keys = (k.due, k.attempts, k.errors, k.inflight, k.dead)
        argv = (id, str(error)[:2000], _ms(delay), max_attempts)
        return {0: "gone", 1: "retry", 2: "dead"}[scripts.DELAY_FAIL(keys, argv, client=self.redis)]

    # -- handlers and draining -------------------------------------------------------

    def handler(self, task: str) -> Callable[[Handler], Handler]:
        """Register ``func(payload)`` as the handler of ``task`` (see :func:`handler`)."""
        return handler(task)

    def drain(self, *, limit: int | None = None, max_batches: int = 50) -> DrainResult:
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
        share = self.visibility_timeout * GIVE_BACK_SHARE
        try:
            for _ in range(max_batches):
                started = time.monotonic()  # before the claim: its deadline is later
                items = self.claim(limit)
                if not items:
                    break
                result.batches += 1
                batch = _Batch(items, started + share, started + self.visibility_timeout)
                if keeper is None:
                    keeper = _Keeper(self, share / 4)
                keeper.batch = batch
                try:
                    self._work(batch, result)
                except BaseException:
                    keeper.batch = None
                    self._settle(batch, result, quiet=True)
                    raise
                keeper.batch = None
                self._settle(batch, result)
        finally:
            if keeper is not None:
                keeper.close()
        return result

    def _work(self, batch: _Batch, result: DrainResult) -> None:
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
            if self._handle(item, result):
                done.append(item.id)
            until = give_back_at

    def _settle(self, batch: _Batch, result: DrainResult, *, quiet: bool = False) -> None:
        """Ack and give back what is left of a batch; a failed connection is tried again
        (both scripts are safe to repeat). ``quiet``: log a failure instead of raising."""
        try:
            for attempt in range(1, SETTLE_ATTEMPTS + 1):
                try:
                    batch.settle(self)
                    break
                except SETTLE_RETRY_ERRORS as exc:
                    if attempt == SETTLE_ATTEMPTS:
                        raise
                    log.warning(
                        "delay queue %r: acknowledging a batch failed (%s), trying again",
                        self.name, exc,
                    )  # fmt: skip
        except REDIS_ERRORS as exc:
            if not quiet:
                raise
            log.warning("delay queue %r: could not acknowledge a batch: %s", self.name, exc)
        finally:
            result.released += batch.given_back - batch.counted
            batch.counted = batch.given_back

    def _handle(self, item: Item, result: DrainResult) -> bool:
        func = HANDLERS.get(item.task)
        celery_task = None if func is not None else _celery_task(item.task)
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
            outcome = self._fail(item.id, error, None, self.max_attempts, item.attempts)
            log.warning(
                "delay queue %r: item %r (%s) failed on delivery %d, %s: %s",
                self.name, item.id, item.task, item.attempts, outcome, error,
            )  # fmt: skip
            result.failed += outcome == "retry"
            result.dead += outcome == "dead"
            if outcome == "dead":
                metrics.dead_lettered(self.name)
            result.errors.append(error)
            return False

    # -- looking ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Due now, scheduled, in flight, dead, and the next due time (Redis clock)."""
        k = self.keys
        now, due_now, scheduled, in_flight, dead, next_due, next_visible = scripts.DELAY_STATS(
            (k.due, k.inflight, k.dead), (), client=self.redis
        )
        return {
            "name": self.name,
            "due_now": due_now,
            "scheduled": scheduled,
            "in_flight": in_flight,
            "dead": dead,
            "next_due": None if next_due < 0 else _epoch_ms_to_datetime(next_due),
            "next_due_in": None if next_due < 0 else max(0.0, (next_due - now) / 1000),
            "next_redelivery_in": None
            if next_visible < 0
            else max(0.0, (next_visible - now) / 1000),
        }

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The oldest ``limit`` dead letters: id, task, payload, deliveries, error, died_at."""
        k = self.keys
        entries = cast(
            "list[tuple[bytes | str, float]]",
            self.redis.zrange(k.dead, 0, limit - 1, withscores=True),
        )
        ids = [i.decode() if isinstance(i, bytes) else i for i, _ in entries]
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(k.items, ids)
        pipe.hmget(k.attempts, ids)
        pipe.hmget(k.errors, ids)
        bodies, attempts, errors = pipe.execute()
        letters = []
        for (item_id, score), body, count, error in zip(
            entries, bodies, attempts, errors, strict=True
        ):
            item = json.loads(body) if body else {"task": None, "payload": None}
            letters.append({
                "id": item_id.decode() if isinstance(item_id, bytes) else item_id,
                "task": item["task"],
                "payload": item["payload"],
                "attempts": int(count or 0),
                "error": error.decode() if isinstance(error, bytes) else error,
                "died_at": _epoch_ms_to_datetime(int(score)),
            })  # fmt: skip
        return letters

    def requeue(self, id: str) -> bool:
        """Give a dead letter fresh deliveries, due now. True if it was dead."""
        k = self.keys
        return bool(scripts.DELAY_REQUEUE((k.due, k.attempts, k.dead), (id,), client=self.redis))


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
        round trip. Safe to repeat; raises RedisError (then a later call retries)."""
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
                release = _release_argv(self.to_release)
                calls = [(scripts.DELAY_RELEASE, queue._release_keys, release)]
                if ids:
                    calls.insert(0, (scripts.DELAY_ACK, queue._ack_keys, ids))
                for reply in run_batch(queue.redis, calls):  # (on a cluster: its node's)
                    if isinstance(reply, Exception):
                        raise reply
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
            except REDIS_ERRORS as exc:
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


def handler(task: str) -> Callable[[Handler], Handler]:
    """Register ``func(payload)`` as the handler of ``task`` in this process, for
    every queue.

    Put handlers in a ``delay_handlers.py`` module of one of your installed apps
    (the name is ``STOCK_LOCKS["DELAY_QUEUE_HANDLERS_MODULE"]``): stock_locks
    imports it in every process when Django is ready (:func:`discover_handlers`),
    so Celery workers and ``run_delay_queue`` know the handler before they drain.
    """
    if not isinstance(task, str) or not task:
        raise InvalidSchedule(f"task must be a non-empty string, got {task!r}")

    def register(func: Handler) -> Handler:
        HANDLERS[task] = func
        return func

    return register


def discover_handlers(module_name: str | None = None) -> None:
    """Import ``<app>.<module_name>`` of every installed app that has one.

    ``module_name`` defaults to ``STOCK_LOCKS["DELAY_QUEUE_HANDLERS_MODULE"]``
    (``"delay_handlers"``; empty or None turns discovery off). Called by
    stock_locks' ``AppConfig.ready()``, as Celery finds ``tasks`` modules and
    the admin finds ``admin`` modules. A module that exists but fails to import
    raises: a drainer must not start without its handlers.
    """
    name = settings.DELAY_QUEUE_HANDLERS_MODULE if module_name is None else module_name
    if not name:
        return
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules(name)


def _release_argv(items: Sequence[Item]) -> list[Any]:
    return [v for item in items for v in (item.id, item.deadline_ms, item.attempts)]


def _celery_task(name: str) -> Any:
    try:
        from celery import current_app
    except ImportError:
        return None
    return current_app.tasks.get(name)


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidSchedule(f"{what} must be a positive number of seconds, got {value!r}")
    return value


def _check_id(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise InvalidSchedule(f"an item id is a non-empty string of at most {MAX_ID} characters")
    return value


def _new_id() -> str:
    import secrets

    return secrets.token_hex(12)
