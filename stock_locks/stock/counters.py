"""What the Redis strategies share: hot counters loaded from the database, the
Redis half of reserve/commit/release, and the compensation when the database
half fails.

The database stays the system of record. A counter is created only from the
database's quantity (``SET NX``, so a loader never overwrites a counter that
is already selling), never invented; the reservation record written beside
the counters makes the Redis half of release happen once.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Iterable

from django.db import IntegrityError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import scripts
from ..connection import get_redis
from ..exceptions import RedisUnavailable
from ..keys import StockKeys
from ..models import Reservation
from .base import (
    Cart,
    StockStrategy,
    commit_in_db,
    existing_reservation,
    release_in_db,
    unknown_sku,
)

log = logging.getLogger("stock_locks.stock")

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)
ALREADY = -1  # reserve_in_redis: this order ref already holds a reservation


class RedisStockStrategy(StockStrategy):
    """A strategy whose counters in Redis answer first, then the database confirms."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.redis = get_redis()
        self.keys = StockKeys()

    @abstractmethod
    def reserve_in_redis(self, order_ref: str, lines: Cart) -> int:
        """Take the lines from the counters: retries made, or ALREADY.

        Raises OutOfStock (nothing taken) or redis-py errors.
        """

    def do_reserve(self, order_ref: str, lines: Cart) -> Reservation:
        try:
            retries = self.reserve_in_redis(order_ref, lines)
        except REDIS_DOWN as exc:
            # The connection may have broken after the script ran: give back, if anything.
            self.undo_in_redis(order_ref, lines, after_outage=True)
            raise RedisUnavailable(f"Redis unreachable, nothing reserved: {exc}") from exc
        if retries == ALREADY:
            return existing_reservation(order_ref, lines)
        try:
            reservation = self.stock.take_and_record(order_ref, lines, self.name, retries)
        except IntegrityError:
            self.undo_in_redis(order_ref, lines)
            return existing_reservation(order_ref, lines)
        except BaseException:
            self.undo_in_redis(order_ref, lines)
            raise
        return reservation

    def undo_in_redis(self, order_ref: str, lines: Cart, after_outage: bool = False) -> None:
        """Best effort: give back what the Redis half took for ``order_ref``."""
        try:
            self.release_in_redis(order_ref, lines)
        except RedisError as exc:
            if after_outage:  # most likely the reserve never reached Redis either
                log.warning(
                    "Redis unreachable while reserving %r (%s); if the reserve ran before the "
                    "connection broke, `manage.py reconcile_stock --fix` gives its units back",
                    order_ref,
                    exc,
                )
                return
            log.error(
                "could not give back %s for %r in Redis (%s); "
                "Redis is now below the database until `manage.py reconcile_stock --fix`",
                lines,
                order_ref,
                exc,
            )

    def release_in_redis(self, order_ref: str, lines: Iterable[str]) -> bool:
        skus = list(lines)
        keys = [self.keys.record(order_ref), self.keys.index, *map(self.keys.counter, skus)]
        return scripts.STOCK_RELEASE(keys, [order_ref, *skus], client=self.redis) == 1

    def release(self, order_ref: str) -> bool:
        """Database first (the units go back to the system of record), then Redis.

        When Redis cannot be reached after the database part, raises
        :class:`RedisUnavailable`; calling release again finishes the Redis
        part (it is idempotent).
        """
        reservation, released_now = release_in_db(self.stock, order_ref)
        try:
            self.release_in_redis(order_ref, reservation.lines)
        except REDIS_DOWN as exc:
            raise RedisUnavailable(
                f"{order_ref!r} released in the database; Redis unreachable, call release "
                f"again to give the units back there: {exc}"
            ) from exc
        return released_now

    def commit(self, order_ref: str) -> bool:
        committed_now = commit_in_db(order_ref)
        keys = [self.keys.record(order_ref), self.keys.index]
        try:
            scripts.STOCK_COMMIT(keys, [order_ref], client=self.redis)
        except RedisError as exc:
            # Harmless: the record is closed by reconcile; a release is refused by the database.
            log.warning("committed %r; its Redis record stays until reconcile: %s", order_ref, exc)
        return committed_now

    def available(self, sku: str) -> int:
        try:
            value = self.redis.get(self.keys.counter(sku))
            if value is None:
                return self.load_counters([sku])[sku]
        except REDIS_DOWN as exc:
            raise RedisUnavailable(f"Redis unreachable: {exc}") from exc
        return int(value)

    def load_counters(self, skus: list[str]) -> dict[str, int]:
        """Create missing counters from the database (SET NX); their values now.

        Raises :class:`InvalidQuantity` for a SKU the database does not have.
        """
        levels = self.stock.levels(skus)
        for sku in skus:
            if sku not in levels:
                raise unknown_sku(sku)
        pipe = self.redis.pipeline(transaction=False)
        for sku in skus:
            pipe.set(self.keys.counter(sku), levels[sku], nx=True)
        for sku in skus:
            pipe.get(self.keys.counter(sku))
        values = {sku: int(v) for sku, v in zip(skus, pipe.execute()[len(skus) :], strict=True)}
        log.info("loaded stock counters from the database: %s", values)
        return values
