"""The ``lua`` strategy: one script checks every line and decrements all or none.

Refusals (the bulk of a flash sale) are answered by Redis alone, in one round
trip, without touching the database. A yes is confirmed in the database in
the same request (reservation row plus ``stock >= qty`` decrements, one
transaction); if that fails, the Redis half is given back before the error
surfaces.
"""

from __future__ import annotations

from .. import scripts
from ..exceptions import OutOfStock, StockLocksError
from .base import Cart
from .counters import ALREADY, RedisStockStrategy

RESERVED, ALREADY_RESERVED, SHORT, NOT_LOADED = 1, 2, 0, 3


class LuaStrategy(RedisStockStrategy):
    def reserve_in_redis(self, order_ref: str, lines: Cart) -> int:
        skus = list(lines)
        keys = [self.keys.record(order_ref), self.keys.index, *map(self.keys.counter, skus)]
        argv = [order_ref, *lines.values(), *skus]
        for _ in range(3):
            reply = scripts.STOCK_RESERVE(keys, argv, client=self.redis)
            code = reply[0]
            if code == RESERVED:
                return 0
            if code == ALREADY_RESERVED:
                return ALREADY
            if code == SHORT:
                sku = skus[reply[1] - 1]
                raise OutOfStock(sku, lines[sku], int(reply[2]))
            self.load_counters([skus[i - 1] for i in reply[1:]])
        raise StockLocksError(f"stock counters for {skus} keep disappearing (evicted?)")
