"""The queue's storage: items due at a time in Redis, claimed in atomic batches.

Layout (one hash tag per queue, so every script runs on Redis Cluster): a
sorted set of due items scored by due time (the Redis clock), a hash of their
payloads, an in-flight sorted set scored by visibility deadline, a dead-letter
sorted set, and the delivery counts and last errors. Every call is one round
trip, and raises :class:`~stock_locks.exceptions.RedisUnavailable` (the cause
chained) when Redis did not answer. A schedule or a claim also lists the queue
in the registry the admin page reads (``stock_locks.backends.redis.registry``):
one more round trip, at most once a minute per process and queue.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from .. import metrics, scripts
from ..backends.redis import registry
from ..backends.redis.backend import backend_for_client
from ..backends.redis.client import get_redis
from ..backends.redis.protocol import decoded, score_pairs
from ..backends.redis.requests import Command, Pipeline, Requests, script, scripts_batch
from ..conf import settings
from ..exceptions import InvalidSchedule
from ..keys import DELAY_QUEUES, delay_queue_keys
from .handlers import Handler, handler
from .runner import DrainResult, drain

T = TypeVar("T")

MAX_RETRY_DELAY = 300  # seconds between deliveries of a failing item, at most
MAX_ID = 200  # characters


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
        self.backend = backend_for_client(self.redis)
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
        (:class:`~stock_locks.exceptions.RedisUnavailable`) is safe to repeat;
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
        self._run(_script(scripts.DELAY_SCHEDULE, keys, (item_id, body, delay_ms, due_at)))
        self._register()
        return item_id

    def cancel(self, id: str) -> bool:
        """Remove the item wherever it is (due, in flight, dead). True if it existed.

        Safe to repeat: once any call has run, the item is gone. A repeat after a
        lost reply answers False, the first call having removed it. An item already
        handed to a handler is not stopped: make handlers check their business state.
        """
        return bool(self._run(_script(scripts.DELAY_REMOVE, self._all_keys, (_check_id(id),))))

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
        Raises :class:`RedisUnavailable` when Redis did not answer.
        """
        limit = settings.DELAY_QUEUE_BATCH if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidSchedule(f"limit must be an int >= 1, got {limit!r}")
        visibility = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        argv = (limit, _ms(_positive(visibility, "visibility_timeout")), self.max_attempts)
        flat = self._run(_script(scripts.DELAY_CLAIM, self._all_keys, argv))
        self._register()
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
        acked: int = self._run(_script(scripts.DELAY_ACK, self._ack_keys, ids))
        return acked

    def release(self, *items: Item) -> int:
        """Give claimed items you will not handle back to the queue, due now; one round trip.

        The delivery is not counted. Only items still in flight under the claim
        that returned them go back (not one another drainer claimed since its
        visibility ran out), so a repeat changes nothing. Returns how many went back.
        """
        if not items:
            return 0
        released: int = self._run(
            _script(scripts.DELAY_RELEASE, self._release_keys, _release_argv(items))
        )
        return released

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
                found = self._run(_command("HGET", self.keys.attempts, id))
                attempts = int(found or 1)
            delay = min(2**attempts, MAX_RETRY_DELAY)
        k = self.keys
        keys = (k.due, k.attempts, k.errors, k.inflight, k.dead)
        argv = (id, str(error)[:2000], _ms(delay), max_attempts)
        return {0: "gone", 1: "retry", 2: "dead"}[
            self._run(_script(scripts.DELAY_FAIL, keys, argv))
        ]

    # -- handlers and draining -------------------------------------------------------

    def handler(self, task: str) -> Callable[[Handler], Handler]:
        """Register ``func(payload)`` as the handler of ``task`` (see
        :func:`~stock_locks.delayqueue.handlers.handler`)."""
        return handler(task)

    def drain(self, *, limit: int | None = None, max_batches: int = 50) -> DrainResult:
        """Claim due items in batches and handle each (:func:`~.runner.drain`)."""
        return drain(self, limit=limit, max_batches=max_batches)

    # -- looking ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Due now, scheduled, in flight, dead, the next due time, and how long the
        oldest due item has waited (``oldest_due_age``, seconds; None when none is
        due). Redis clock."""
        k = self.keys
        now, due_now, scheduled, in_flight, dead, next_due, next_visible = self._run(
            _script(scripts.DELAY_STATS, (k.due, k.inflight, k.dead), ())
        )
        return {
            "name": self.name,
            "due_now": due_now,
            "scheduled": scheduled,
            "in_flight": in_flight,
            "dead": dead,
            "next_due": None if next_due < 0 else _epoch_ms_to_datetime(next_due),
            "next_due_in": None if next_due < 0 else max(0.0, (next_due - now) / 1000),
            "oldest_due_age": None if not 0 <= next_due <= now else (now - next_due) / 1000,
            "next_redelivery_in": None
            if next_visible < 0
            else max(0.0, (next_visible - now) / 1000),
        }

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The oldest ``limit`` dead letters: id, task, payload, deliveries, error, died_at."""
        k = self.keys
        entries = score_pairs(self._run(_command("ZRANGE", k.dead, 0, limit - 1, "WITHSCORES")))
        ids = [decoded(i) for i, _ in entries]
        if not ids:
            return []
        reads = [("HMGET", key, *ids) for key in (k.items, k.attempts, k.errors)]
        bodies, attempts, errors = self._run(_pipeline(reads, k.dead))
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
                "died_at": _epoch_ms_to_datetime(int(float(score))),
            })  # fmt: skip
        return letters

    def requeue(self, id: str) -> bool:
        """Give a dead letter fresh deliveries, due now. True if it was dead."""
        k = self.keys
        return bool(self._run(_script(scripts.DELAY_REQUEUE, (k.due, k.attempts, k.dead), (id,))))

    def ack_and_release(self, ids: Sequence[str], items: Sequence[Item]) -> None:
        """:meth:`ack` ``ids`` and :meth:`release` ``items`` in one round trip (on a
        cluster, on the queue's node). Safe to repeat."""
        calls: list[tuple[Any, Sequence[str], Sequence[Any]]] = [
            (scripts.DELAY_RELEASE, self._release_keys, _release_argv(items))
        ]
        if ids:
            calls.insert(0, (scripts.DELAY_ACK, self._ack_keys, ids))
        for reply in self._run(scripts_batch(calls)):
            if isinstance(reply, Exception):
                raise reply

    def _register(self) -> None:
        """List the queue for the admin page, at most once a period per process (a
        failure is logged and dropped: the call before it happened)."""
        self._run(registry.register(self.backend, DELAY_QUEUES, self.name))

    def _run(self, requests: Requests[T]) -> T:
        """Run ``requests`` on the queue's client; :class:`RedisUnavailable` when Redis
        did not answer."""
        return self.backend.run(requests)


def _script(source: Any, keys: Sequence[str], argv: Sequence[Any]) -> Requests[Any]:
    """A queue script, sent as redis-py sends any command (its client's retry policy
    only): a claim, or a schedule without an id, sent twice is not the same as once."""
    return (yield from script(source, keys, argv, repeatable=False))


def _command(*args: Any) -> Requests[Any]:
    return (yield Command(args, args[1]))


def _pipeline(commands: Sequence[tuple[Any, ...]], key: str) -> Requests[list[Any]]:
    replies: list[Any] = yield Pipeline(commands, key)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _release_argv(items: Sequence[Item]) -> list[Any]:
    return [v for item in items for v in (item.id, item.deadline_ms, item.attempts)]


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidSchedule(f"{what} must be a positive number of seconds, got {value!r}")
    return value


def _check_id(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise InvalidSchedule(f"an item id is a non-empty string of at most {MAX_ID} characters")
    return value


def _new_id() -> str:
    return secrets.token_hex(12)
