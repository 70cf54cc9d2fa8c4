"""The ``watch`` strategy: optimistic WATCH/MULTI/EXEC on the cart's counters.

Read the counters under WATCH, check every line, then MULTI the decrements and
the reservation record; EXEC fails when any watched key changed meanwhile, and
the attempt is retried after a jittered exponential backoff, at most
``WATCH_ATTEMPTS`` times, then :class:`ContentionError`. Under a hot SKU most
attempts conflict: the retries are counted on the reservation, not hidden.
"""

from __future__ import annotations

import random
import time

from redis.exceptions import WatchError

from ..conf import settings
from ..exceptions import ContentionError, OutOfStock
from .base import Cart
from .counters import ALREADY, RedisStockStrategy

MAX_BACKOFF_DOUBLINGS = 6


class WatchStrategy(RedisStockStrategy):
    def reserve_in_redis(self, order_ref: str, lines: Cart) -> int:
        record = self.keys.record(order_ref)
        counters = [self.keys.counter(sku) for sku in lines]
        attempts = settings.WATCH_ATTEMPTS
        conflicts = loads = 0
        seconds, micros = self.redis.time()  # the record's time (Redis clock), read once
        with self.redis.pipeline(transaction=True) as pipe:
            while conflicts < attempts:
                try:
                    pipe.watch(record, *counters)
                    if pipe.exists(record):
                        return ALREADY
                    values = pipe.mget(counters)
                    missing = [sku for sku, v in zip(lines, values, strict=True) if v is None]
                    if missing and loads < 3:
                        pipe.unwatch()
                        self.load_counters(missing)
                        loads += 1
                        continue
                    for (sku, qty), value in zip(lines.items(), values, strict=True):
                        if value is None or int(value) < qty:
                            raise OutOfStock(sku, qty, int(value or 0))
                    pipe.multi()
                    for counter, qty in zip(counters, lines.values(), strict=True):
                        pipe.decrby(counter, qty)
                    pipe.hset(record, mapping=lines)
                    pipe.zadd(self.keys.index, {order_ref: seconds * 1000 + micros // 1000})
                    pipe.execute()
                    return conflicts
                except WatchError:
                    conflicts += 1
                    base = settings.WATCH_BACKOFF * 2 ** min(conflicts, MAX_BACKOFF_DOUBLINGS)
                    time.sleep(random.uniform(0, base))
        raise ContentionError(
            f"{order_ref!r}: the counters of {list(lines)} changed during each of "
            f"{attempts} optimistic attempts",
            attempts=attempts,
        )
