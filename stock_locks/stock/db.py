"""The database baselines a Django team would write without Redis.

``db_row_lock``: ``SELECT ... FOR UPDATE`` of the cart's rows in pk order,
check, update. ``db_conditional``: per line ``UPDATE ... SET stock = stock - q
WHERE sku = s AND stock >= q``, the transaction rolled back at the first line
that matches no row. Both are correct; every attempt, refusals included, costs
a database transaction and waits on the hot row's lock.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from ..exceptions import OutOfStock
from ..models import Reservation
from .base import Cart, StockStrategy, existing_reservation, new_reservation, repeat_of, unknown_sku


class RowLockStrategy(StockStrategy):
    uses_redis = False

    def do_reserve(self, order_ref: str, lines: Cart) -> Reservation:
        repeat = repeat_of(order_ref, lines)
        if repeat is not None:
            return repeat
        stock = self.stock
        try:
            with transaction.atomic():
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
                return new_reservation(order_ref, lines, self.name)
        except IntegrityError:
            return existing_reservation(order_ref, lines)

    def available(self, sku: str) -> int:
        return self.stock.level(sku)


class ConditionalUpdateStrategy(StockStrategy):
    uses_redis = False

    def do_reserve(self, order_ref: str, lines: Cart) -> Reservation:
        repeat = repeat_of(order_ref, lines)
        if repeat is not None:
            return repeat
        try:
            with transaction.atomic():
                self.stock.take_conditionally(lines)
                return new_reservation(order_ref, lines, self.name)
        except IntegrityError:
            return existing_reservation(order_ref, lines)

    def available(self, sku: str) -> int:
        return self.stock.level(sku)
