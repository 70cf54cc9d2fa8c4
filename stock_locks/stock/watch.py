"""The ``watch`` strategy: optimistic WATCH/MULTI/EXEC on the cart's counters.

Read the counters, then the order's record (a duplicate request's, in flight at
once: nothing moves, the database decides), under WATCH; check every line, then
MULTI the decrements and the reservation record; EXEC fails when any watched
key changed meanwhile, and the attempt is retried after a jittered exponential
backoff, at most ``WATCH_ATTEMPTS`` times, then :class:`ContentionError`. Under
a hot SKU most attempts conflict: the retries are counted on the reservation,
not hidden.

A connection lost during EXEC (its reply lost) surfaces from redis-py as a
WatchError too: the retry then finds this order's record and goes on.

On a Redis Cluster the transaction runs on the connection of the master that
serves the stock hash tag (every stock key shares it, so a cart is one node's
transaction; redis-py 5's cluster pipelines have no MULTI). A redirect from
that node (a failover moved the slot; nothing ran) reads the slot map again
and the attempt starts over on the new master.
"""

from __future__ import annotations

import random
import time
from typing import Any

from redis.exceptions import WatchError

from ..backends.redis.cluster import on_node
from ..backends.redis.errors import TRANSLATED_ERRORS, translated_error
from ..conf import settings
from ..exceptions import ContentionError, OutOfStock, StockLocksError
from .caps import NOBODY, Buyer, cap_entries, exceeded
from .cart import Cart
from .counters import RedisStockStrategy
from .groupcommit import Confirmation

MAX_BACKOFF_DOUBLINGS = 6
MAX_LOADS = 3


class WatchStrategy(RedisStockStrategy):
    def reserve_in_redis(
        self, order_ref: str, lines: Cart, job: Confirmation | None = None, buyer: Buyer = NOBODY
    ) -> tuple[bool, int, int, Any]:
        """(``job``: the group commit is joined after, by a script of its own. The
        buyer's cap usage is watched with the counters and written in the same MULTI.)"""

        def attempt(node: Any) -> tuple[bool, int, int]:
            return self._reserve(node, order_ref, lines, buyer)

        try:
            return (*on_node(self.redis, self.keys.loaded, attempt), None)
        except TRANSLATED_ERRORS as exc:
            # The EXEC may have run: a retry with this order ref finds its record.
            # (CROSSSLOT: the node refused a WATCH of keys in several slots.)
            raise translated_error(exc, self.backend.alias) from exc

    def _reserve(
        self, client: Any, order_ref: str, lines: Cart, buyer: Buyer
    ) -> tuple[bool, int, int]:
        k = self.keys
        record = k.record(order_ref)
        counters = [k.counter(sku) for sku in lines]
        usage = [k.cap_usage(cap.name, buyer.customer) for cap in buyer.caps]
        attempts = settings.WATCH_ATTEMPTS
        conflicts = loads = 0
        seconds, micros = client.time()  # the record's time (Redis clock), read once
        now_ms = seconds * 1000 + micros // 1000
        with client.pipeline(transaction=True) as pipe:
            while conflicts < attempts:
                try:
                    pipe.watch(k.loaded, record, *counters, *usage)
                    lost = not pipe.exists(k.loaded)
                    values: list[Any] = pipe.mget(counters)
                    # The record after the counters: a duplicate request's EXEC that
                    # made them short shows here (read first, it could land in between,
                    # and this request answered "out of stock" while its twin's stood).
                    if pipe.exists(record):
                        return False, now_ms, conflicts
                    missing = [sku for sku, v in zip(lines, values, strict=True) if v is None]
                    if lost or missing:
                        pipe.unwatch()
                        if loads == MAX_LOADS:
                            break
                        loads += 1
                        if lost:
                            self.restore_after_data_loss()
                        else:
                            self.load_counters(missing)
                        continue
                    for (sku, qty), value in zip(lines.items(), values, strict=True):
                        if int(value) < qty:
                            raise OutOfStock(sku, qty, int(value))
                    entries = [
                        cap_entries(pipe.hgetall(key), cap, now_ms)
                        for key, cap in zip(usage, buyer.caps, strict=True)
                    ]
                    for cap, (used, _) in zip(buyer.caps, entries, strict=True):
                        if used + cap.units(lines) > cap.max:
                            raise exceeded(cap, lines, used)
                    pipe.multi()
                    for counter, qty in zip(counters, lines.values(), strict=True):
                        pipe.decrby(counter, qty)
                    pipe.hset(record, mapping=lines)
                    pipe.zadd(k.index, {order_ref: now_ms})
                    for sku in lines:
                        pipe.hincrby(k.versions, sku, 1)
                    for key, cap, (_, gone) in zip(usage, buyer.caps, entries, strict=True):
                        if gone:
                            pipe.hdel(key, *gone)
                        pipe.hset(key, order_ref, f"{cap.units(lines)}:{now_ms}")
                        pipe.hset(f"{record}:caps", key, cap.units(lines))
                    pipe.execute()
                    return True, now_ms, conflicts
                except WatchError:
                    conflicts += 1
                    base = settings.WATCH_BACKOFF * 2 ** min(conflicts, MAX_BACKOFF_DOUBLINGS)
                    time.sleep(random.uniform(0, base))
            else:
                raise ContentionError(
                    f"{order_ref!r}: the counters of {list(lines)} changed during each of "
                    f"{attempts} optimistic attempts",
                    attempts=attempts,
                )
        raise StockLocksError(f"stock counters for {list(lines)} keep disappearing (evicted?)")
