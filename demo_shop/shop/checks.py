"""System checks of the shop's settings (registered in ShopConfig.ready)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error

from stock_locks.stock import strategy_names

E001 = "shop.E001"


def check_strategies(app_configs=None, **kwargs) -> list[Error]:
    """SHOP_STRATEGY and every SHOP_SKU_STRATEGIES value name a registered strategy."""
    known = strategy_names()
    named = {"SHOP_STRATEGY": getattr(settings, "SHOP_STRATEGY", None)}
    per_sku = getattr(settings, "SHOP_SKU_STRATEGIES", None) or {}
    if not isinstance(per_sku, dict):
        return [Error("SHOP_SKU_STRATEGIES must map SKU to strategy name", id=E001)]
    named.update({f"SHOP_SKU_STRATEGIES[{sku!r}]": name for sku, name in per_sku.items()})
    return [
        Error(
            f"{setting} = {name!r} is not a stock strategy",
            hint=f"choose one of {', '.join(known)}",
            id=E001,
        )
        for setting, name in named.items()
        if name is not None and name not in known
    ]
