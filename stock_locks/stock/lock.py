"""The ``lock`` strategy: a distributed lock on every SKU of the cart, then fenced writes.

Locks are taken in SKU order, so two carts sharing SKUs cannot deadlock.
Under the locks each line is one guarded, fenced statement:

    UPDATE stock SET qty = qty - q, fence = f WHERE sku = s AND qty >= q AND fence <= f

Relative and guarded, it cannot oversell even beside writers that take no
lock (other strategies, releases, an admin restock); fenced, a holder paused
past its lease is refused (``StaleFencingToken``) once the newer holder has
written. One that writes first overwrites nothing (its write is relative): its
sale stands and the newer holder sells only what is left (``OutOfStock`` for
the last unit). Releases put units back with a relative write and need no
lock. The stock model needs a ``fence`` column
(:class:`stock_locks.fencing.FencedModel`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.exceptions import ImproperlyConfigured

from ..backends.redis.errors import REDIS_ERRORS
from ..conf import settings
from ..exceptions import BackendUnavailable, LockNotOwned, LockTimeout, RedisUnavailable
from ..locks import Lock
from ..models import Reservation
from .base import StockStrategy
from .caps import NOBODY, Buyer
from .cart import Cart
from .ledger import repeat_of

log = logging.getLogger("stock_locks.stock")

RELEASE_ERRORS: tuple[type[Exception], ...] = (LockNotOwned, BackendUnavailable, *REDIS_ERRORS)


class LockStrategy(StockStrategy):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        if "fence" not in {f.name for f in self.stock.model._meta.get_fields()}:
            raise ImproperlyConfigured(
                f"the lock strategy writes fenced rows: {self.stock.model.__name__} needs a "
                "`fence` column (subclass stock_locks.fencing.FencedModel)"
            )

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
                    backend=settings.STOCK_LOCK_BACKEND,
                    caller=f"stock_locks.stock.{self.name}",
                )
                try:
                    granted = lock.acquire()
                except BackendUnavailable as exc:
                    raise RedisUnavailable(
                        f"lock backend unreachable, nothing reserved: {exc}", backend=exc.backend
                    ) from exc
                if not granted:
                    raise LockTimeout(
                        f"stock lock {lock.name!r} busy for {lock.timeout}s",
                        name=lock.name,
                        timeout=lock.timeout,
                    )
                held.append(lock)
            yield {sku: lock.fence for sku, lock in zip(sorted(skus), held, strict=True)}  # type: ignore[misc]
        finally:
            for lock in reversed(held):
                try:
                    lock.release()
                except RELEASE_ERRORS as exc:
                    # The writes were fenced: had a newer holder written, ours were refused.
                    log.warning("stock lock %r not released cleanly: %s", lock.name, exc)

    def do_reserve(
        self, order_ref: str, lines: Cart, ttl_ms: int | None, buyer: Buyer = NOBODY
    ) -> Reservation:
        repeat = repeat_of(order_ref, lines)  # before the locks: they are held as briefly as can be
        if repeat is not None:
            return repeat
        with self.locked(list(lines)) as fences:

            def take() -> None:
                self.stock.take_conditionally(lines, fences)

            return self.reserve_once(order_ref, lines, ttl_ms, take, checked=True, buyer=buyer)

    def available(self, sku: str) -> int:
        return self.stock.level(sku)
