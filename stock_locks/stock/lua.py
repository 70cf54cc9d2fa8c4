"""The ``lua`` strategy: one script checks every line and decrements all or none.

Refusals (the bulk of a flash sale) are answered by Redis alone, in one round
trip, without touching the database. A yes is confirmed in the database in
the same request (reservation row plus ``stock >= qty`` decrements, one
transaction); if the database refuses, the Redis half is given back before
the error surfaces.
"""

from __future__ import annotations

from typing import Any

from .. import scripts
from ..exceptions import OutOfStock, StockLocksError
from .cart import Cart
from .counters import RedisStockStrategy

# stock_reserve.lua's reply codes
SHORT, RESERVED, ALREADY_RESERVED, NOT_LOADED, DATA_LOST = 0, 1, 2, 3, 4
MAX_LOADS = 3


class LuaStrategy(RedisStockStrategy):
    def reserve_in_redis(self, order_ref: str, lines: Cart) -> tuple[bool, int, int]:
        skus = list(lines)
        k = self.keys
        keys = [k.record(order_ref), k.index, k.loaded, k.versions, *map(k.counter, skus)]
        argv: list[Any] = [order_ref, *lines.values(), *skus]
        for _ in range(MAX_LOADS):
            reply = scripts.STOCK_RESERVE(keys, argv, client=self.redis)
            code = reply[0]
            if code in (RESERVED, ALREADY_RESERVED):
                return code == RESERVED, int(reply[1]), 0
            if code == SHORT:
                sku = skus[reply[1] - 1]
                raise OutOfStock(sku, lines[sku], int(reply[2]))
            if code == DATA_LOST:
                self.restore_after_data_loss()
            else:
                self.load_counters([skus[i - 1] for i in reply[1:]])
        raise StockLocksError(f"stock counters for {skus} keep disappearing (evicted?)")
