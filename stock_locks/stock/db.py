"""The database baselines a Django team would write without Redis.

``db_row_lock``: ``SELECT ... FOR UPDATE`` of the cart's rows in pk order,
check, update. ``db_conditional``: per line ``UPDATE ... SET stock = stock - q
WHERE sku = s AND stock >= q``, the transaction rolled back at the first line
that matches no row. Both are correct; every attempt, refusals included, costs
a database transaction and waits on the hot row's lock.
"""

from __future__ import annotations

from ..exceptions import OutOfStock
from ..models import Reservation
from .base import Cart, StockStrategy, unknown_sku


class RowLockStrategy(StockStrategy):
    uses_redis = False

    def do_reserve(self, order_ref: str, lines: Cart) -> Reservation:
        return self.reserve_once(order_ref, lines, lambda: self._lock_check_update(lines))

    def _lock_check_update(self, lines: Cart) -> None:
        stock = self.stock
        rows = dict(
            stock.objects.select_for_update()
            .filter(**{f"{stock.sku}__in": list(lines)})
            .order_by("pk")
            .values_list(stock.sku, stock.qty)
        )
        for sku, qty in lines.items():
            if sku not in rows:
                raise unknown_sku(sku)
            if rows[sku] < qty:
                raise OutOfStock(sku, qty, rows[sku])
        for sku, qty in lines.items():
            stock.objects.filter(**{stock.sku: sku}).update(**{stock.qty: rows[sku] - qty})

    def available(self, sku: str) -> int:
        return self.stock.level(sku)


class ConditionalUpdateStrategy(StockStrategy):
    uses_redis = False

    def do_reserve(self, order_ref: str, lines: Cart) -> Reservation:
        return self.reserve_once(order_ref, lines, lambda: self.stock.take_conditionally(lines))

    def available(self, sku: str) -> int:
        return self.stock.level(sku)
