"""Stock strategies: reserve a cart all-or-nothing, release it, tell what is available.

    from stock_locks.stock import get_strategy
    strategy = get_strategy("lua")          # or "watch", "lock", "db_row_lock", "db_conditional"
    reservation = strategy.reserve("order-42", {"TEA": 2, "CUP": 1})   # OutOfStock, InvalidQuantity
    strategy.commit("order-42")             # paid: the units stay sold
    strategy.release("order-42")            # or: put them back (idempotent)
    restock("TEA", 10)                      # units added outside the strategies, sellable at once

Strategies are registered by name in ``STOCK_LOCKS["STRATEGIES"]`` (dotted paths).
"""

from __future__ import annotations

from .base import StockStrategy
from .cart import normalize_cart
from .registry import get_strategy, strategy_names
from .sync import restock, stock_changed

__all__ = [
    "StockStrategy",
    "get_strategy",
    "normalize_cart",
    "restock",
    "stock_changed",
    "strategy_names",
]
