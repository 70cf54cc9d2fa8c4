"""Units left of a sale's SKUs, as the stock strategies count them, read at most every
``WAITING_ROOM_STOCK_INTERVAL`` seconds per process.

The waiting room's keys carry the event's hash tag and the stock counters the
stock's (``STOCK_HASH_TAG``), so on a Redis Cluster no script can read both: the
admission script is given the figure read here. With a strategy that keeps
counters in Redis (``lua``, ``watch``) it is one ``MGET`` of them; a counter not
loaded yet, or a database strategy, asks the strategy (``available``: the
database). Between two reads a process may use a figure up to the interval old:
the room may admit a few visitors more than the units left times the factor for
that long, or reopen that much later; it never sells anything (the strategies do).
Near the end (fewer units left than the room may let in within one interval:
:meth:`~.queue.WaitingRoom.fresh_below`) it is read on every call, so that
visitors are not admitted to units already gone.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..backends.redis.requests import Command, Requests
from ..conf import settings
from ..stock import get_strategy

_cache: dict[tuple[str, ...], tuple[int, float]] = {}  # skus -> (units left, read at)
_lock = threading.Lock()


def units_left(skus: tuple[str, ...], fresh_below: int = 0) -> int:
    """The units left of ``skus`` together (-1 when there are none: no stock limit).

    Blocking: one round trip to Redis (or the strategy's query) when the figure
    this process holds is older than the interval, or is below ``fresh_below`` (the
    end of a sale, when a stale figure would admit visitors to nothing: it is read
    each time then). Raises :class:`~stock_locks.exceptions.RedisUnavailable` when
    Redis did not answer.
    """
    if not skus:
        return -1
    interval = settings.WAITING_ROOM_STOCK_INTERVAL
    now = time.monotonic()
    held = _cache.get(skus)
    if held is not None and now - held[1] < interval and held[0] >= fresh_below:
        return held[0]
    left = _read(skus)
    with _lock:
        _cache[skus] = (left, now)
    return left


def forget() -> None:
    """Read the units left again on the next call (tests; after a restock)."""
    with _lock:
        _cache.clear()


def _read(skus: tuple[str, ...]) -> int:
    strategy: Any = get_strategy()
    if not strategy.has_counters:
        return sum(max(0, strategy.available(sku)) for sku in skus)
    counters = [strategy.keys.counter(sku) for sku in skus]
    values = strategy.backend.run(_mget(counters))
    total = 0
    for sku, value in zip(skus, values, strict=True):
        total += max(0, int(value) if value is not None else strategy.available(sku))
    return total


def _mget(keys: list[str]) -> Requests[list[Any]]:
    return (yield Command(("MGET", *keys), keys[0]))
