"""The database baselines a Django team would write without Redis.

``db_row_lock``: ``SELECT ... FOR UPDATE`` of the cart's rows in SKU order, then
the guarded decrements. ``db_conditional``: per line ``UPDATE ... SET stock =
stock - q WHERE sku = s AND stock >= q``, the transaction rolled back at the
first line that matches no row. Both are correct; every attempt, refusals
included, costs a database transaction and waits on the hot row's lock.
"""

from __future__ import annotations

from ..models import Reservation
from .base import StockStrategy
from .caps import NOBODY, Buyer
from .cart import Cart


class RowLockStrategy(StockStrategy):
    uses_redis = False

    def do_reserve(
        self, order_ref: str, lines: Cart, ttl_ms: int | None, buyer: Buyer = NOBODY
    ) -> Reservation:
        return self.reserve_once(
            order_ref, lines, ttl_ms, lambda: self._lock_then_take(lines), buyer=buyer
        )

    def _lock_then_take(self, lines: Cart) -> None:
        stock = self.stock
        rows = stock.objects.select_for_update().filter(**{f"{stock.sku}__in": list(lines)})
        # Locked in SKU order, the order every other writer takes them in (a release,
        # db_conditional, the lock strategy): in another, two carts could deadlock.
        list(stock.in_sku_order(rows).values_list("pk", flat=True))
        stock.take_conditionally(lines)

    def available(self, sku: str) -> int:
        return self.stock.level(sku)


class ConditionalUpdateStrategy(StockStrategy):
    uses_redis = False

    def do_reserve(
        self, order_ref: str, lines: Cart, ttl_ms: int | None, buyer: Buyer = NOBODY
    ) -> Reservation:
        return self.reserve_once(
            order_ref, lines, ttl_ms, lambda: self.stock.take_conditionally(lines), buyer=buyer
        )

    def available(self, sku: str) -> int:
        return self.stock.level(sku)
