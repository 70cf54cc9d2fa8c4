"""The ``lock`` strategy: a distributed lock on every SKU of the cart, then fenced writes.

Locks are taken in SKU order, so two carts sharing SKUs cannot deadlock.
Under the locks the quantities are read, checked and written back as absolute
values, each write fenced with its SKU lock's fencing token: a holder paused
past its lease is refused by the database (``StaleFencingToken``) instead of
overwriting a newer holder's stock. Release takes the same locks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from redis.exceptions import RedisError

from ..conf import settings
from ..connection import get_redis
from ..exceptions import LockNotOwned, LockTimeout, OutOfStock, RedisUnavailable
from ..fencing import fenced_update_row
from ..locks import Lock
from ..models import Reservation
from .base import (
    Cart,
    StockStrategy,
    check_order_ref,
    locked_reservation,
    mark,
    repeat_of,
    unknown_sku,
)
from .counters import REDIS_DOWN

log = logging.getLogger("stock_locks.stock")


class LockStrategy(StockStrategy):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        if "fence" not in {f.name for f in self.stock.model._meta.get_fields()}:
            raise ImproperlyConfigured(
                f"the lock strategy writes fenced rows: {self.stock.model.__name__} needs a "
                "`fence` column (subclass stock_locks.fencing.FencedModel)"
            )
        self.redis = get_redis()

    @contextmanager
    def locked(self, skus: list[str]) -> Iterator[dict[str, int]]:
        """Hold the lock of every SKU (in SKU order); yields each lock's fence."""
        held: list[Lock] = []
        try:
            for sku in sorted(skus):
                lock = Lock(
                    f"stock:{sku}",
                    settings.STOCK_LOCK_TTL,
                    timeout=settings.STOCK_LOCK_TIMEOUT,
                    redis=self.redis,
                    caller=f"stock_locks.stock.{self.name}",
                )
                try:
                    granted = lock.acquire()
                except REDIS_DOWN as exc:
                    raise RedisUnavailable(f"Redis unreachable, nothing reserved: {exc}") from exc
                if not granted:
                    raise LockTimeout(
                        f"stock lock {lock.name!r} busy for {lock.timeout}s",
                        name=lock.name,
                        timeout=lock.timeout,
                    )
                held.append(lock)
            yield {lock.name[len("stock:") :]: lock.fence for lock in held}
        finally:
            for lock in reversed(held):
                try:
                    lock.release()
                except (LockNotOwned, RedisError) as exc:
                    # The writes were fenced: had a newer holder written, ours were refused.
                    log.warning("stock lock %r not released cleanly: %s", lock.name, exc)

    def apply(self, lines: Cart, sign: int, fences: dict[str, int]) -> None:
        """Under the SKU locks: read each quantity, check it, write it back fenced."""
        rows = {
            sku: (pk, qty)
            for pk, sku, qty in self.stock.objects.filter(
                **{f"{self.stock.sku}__in": list(lines)}
            ).values_list("pk", self.stock.sku, self.stock.qty)
        }
        for sku, qty in lines.items():
            if sku not in rows:
                raise unknown_sku(sku)
            if sign < 0 and rows[sku][1] < qty:
                raise OutOfStock(sku, qty, rows[sku][1])
        for sku, qty in lines.items():
            pk, level = rows[sku]
            changes = {self.stock.qty: level + sign * qty}
            fenced_update_row(self.stock.model, pk, fences[sku], **changes)

    def do_reserve(self, order_ref: str, lines: Cart) -> Reservation:
        repeat = repeat_of(order_ref, lines)  # before the locks: they are held as briefly as can be
        if repeat is not None:
            return repeat
        with self.locked(list(lines)) as fences:

            def take() -> None:
                self.apply(lines, -1, fences)

            return self.reserve_once(order_ref, lines, take, checked=True)

    def release(self, order_ref: str) -> bool:
        check_order_ref(order_ref)
        lines = Reservation.objects.filter(order_ref=order_ref).values_list("lines", flat=True)
        skus = list(lines.first() or {})
        with self.locked(skus) as fences, transaction.atomic():
            reservation = locked_reservation(order_ref)
            if reservation.status == Reservation.Status.RELEASED:
                return False
            self.apply(reservation.lines, +1, fences)
            mark(reservation, Reservation.Status.RELEASED)
        return True

    def available(self, sku: str) -> int:
        return self.stock.level(sku)
