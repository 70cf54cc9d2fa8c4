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
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from . import scripts
from .conf import settings
from .connection import blocking_cap, get_redis
from .exceptions import StockLocksError
from .keys import delay_queue_keys

log = logging.getLogger("stock_locks.delayqueue")

Handler = Callable[[Any], Any]
# Task name -> handler, for every queue of this process.
HANDLERS: dict[str, Handler] = {}
MAX_RETRY_DELAY = 300  # seconds between deliveries of a failing item, at most
MAX_ID = 200  # characters


class InvalidSchedule(StockLocksError, ValueError):
    """A schedule call was malformed; nothing was scheduled."""


@dataclass(frozen=True, slots=True)
class Item:
    """A claimed item: handle it, then ``ack`` (or ``fail``) it by id."""

    id: str
    task: str
    payload: Any
    attempts: int  # deliveries so far, this one included


@dataclass
class DrainResult:
    handled: int = 0
    dispatched: int = 0  # sent to Celery
    failed: int = 0  # will be retried
    dead: int = 0  # went to the dead-letter set
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
            drainers (default ``DELAY_QUEUE_VISIBILITY``, 30). Handling a
            claimed batch must take less than this, or items are delivered again.
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
        it is in flight or dead. One round trip. Raises :class:`InvalidSchedule`
        for a bad argument, before any round trip.
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
        """Remove the item wherever it is (due, in flight, dead). True if it existed."""
        return bool(scripts.DELAY_REMOVE(self._all_keys, (_check_id(id),), client=self.redis))

    # -- consuming ---------------------------------------------------------------

    def claim(
        self, limit: int | None = None, visibility_timeout: float | None = None
    ) -> list[Item]:
        """Atomically take up to ``limit`` due items in flight; one round trip.

        Items whose visibility ran out are first made due again (or dead after
        ``max_attempts`` deliveries). Claimed items stay invisible for
        ``visibility_timeout`` seconds (default: the queue's); ``ack`` them.
        """
        limit = settings.DELAY_QUEUE_BATCH if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidSchedule(f"limit must be an int >= 1, got {limit!r}")
        visibility = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        argv = (limit, _ms(_positive(visibility, "visibility_timeout")), self.max_attempts)
        flat = scripts.DELAY_CLAIM(self._all_keys, argv, client=self.redis)
        items = []
        for i in range(0, len(flat), 3):
            body = json.loads(flat[i + 1])
            item_id = flat[i].decode() if isinstance(flat[i], bytes) else flat[i]
            items.append(Item(item_id, body["task"], body["payload"], int(flat[i + 2])))
        return items

    def ack(self, *ids: str) -> int:
        """Forget handled items, in one round trip; how many were still in flight."""
        if not ids:
            return 0
        k = self.keys
        keys = (k.inflight, k.items, k.attempts, k.errors)
        return scripts.DELAY_ACK(keys, ids, client=self.redis)

    def fail(self, id: str, error: str, *, delay: float | None = None) -> str:
        """Record a failed delivery: ``"retry"`` (due again after ``delay`` seconds,
        default a backoff of 2**deliveries, at most 300), ``"dead"`` (out of
        deliveries), or ``"gone"`` (no longer in flight: nothing changed)."""
        return self._fail(id, error, delay, self.max_attempts)

    def bury(self, id: str, error: str) -> str:
        """Move an in-flight item to the dead-letter set now, with ``error``."""
        return self._fail(id, error, 0, 0)

    def _fail(self, id: str, error: str, delay: float | None, max_attempts: int) -> str:
        if delay is None:
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
        """Claim due items in batches and handle each; ack the batch in one round trip.

        An item is handled by the handler registered for its task, else sent to
        the Celery task of that name; with neither, it goes to the dead-letter
        set with a clear error. A handler that raises makes the item fail (it is
        retried later, then buried). Stops when nothing is due, or after
        ``max_batches`` batches.
        """
        result = DrainResult()
        for _ in range(max_batches):
            batch = self.claim(limit)
            if not batch:
                break
            result.batches += 1
            done = []
            for item in batch:
                outcome = self._handle(item, result)
                if outcome:
                    done.append(item.id)
            self.ack(*done)
        return result

    def _handle(self, item: Item, result: DrainResult) -> bool:
        func = HANDLERS.get(item.task)
        celery_task = None if func is not None else _celery_task(item.task)
        if func is None and celery_task is None:
            error = f"no handler or Celery task is registered for task {item.task!r}"
            log.error("delay queue %r: item %r buried: %s", self.name, item.id, error)
            self.bury(item.id, error)
            result.dead += 1
            result.errors.append(error)
            return False
        try:
            if func is not None:
                func(item.payload)
                result.handled += 1
            else:
                celery_task.apply_async(args=(item.payload,))
                result.dispatched += 1
            return True
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            outcome = self.fail(item.id, error)
            log.warning(
                "delay queue %r: item %r (%s) failed on delivery %d, %s: %s",
                self.name, item.id, item.task, item.attempts, outcome, error,
            )  # fmt: skip
            result.failed += outcome == "retry"
            result.dead += outcome == "dead"
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
        entries = self.redis.zrange(k.dead, 0, limit - 1, withscores=True)
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
            except RedisError as exc:
                log.warning("delay queue %r: signal listener: %s", self.queue.name, exc)
                self.event.set()  # let the runner look, and meet the error itself
                threading.Event().wait(self._slice)


def handler(task: str) -> Callable[[Handler], Handler]:
    """Register ``func(payload)`` as the handler of ``task`` in this process, for
    every queue. Register at import time of a module every drainer imports
    (e.g. from an ``AppConfig.ready``), so Celery workers know it too."""
    if not isinstance(task, str) or not task:
        raise InvalidSchedule(f"task must be a non-empty string, got {task!r}")

    def register(func: Handler) -> Handler:
        HANDLERS[task] = func
        return func

    return register


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
