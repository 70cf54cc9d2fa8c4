"""Stock strategies by name: ``STOCK_LOCKS["STRATEGIES"]`` maps a name to a dotted path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.module_loading import import_string

from ..conf import settings

if TYPE_CHECKING:
    from .base import StockStrategy


def strategy_names() -> list[str]:
    return list(settings.STRATEGIES)


def get_strategy(name: str | None = None) -> StockStrategy:
    """A new strategy object by name (default ``STOCK_LOCKS["STRATEGY"]``).

    Raises ``ValueError`` for a name that is not registered.
    """
    name = name or settings.STRATEGY
    try:
        path = settings.STRATEGIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown stock strategy {name!r}; choose one of {', '.join(settings.STRATEGIES)}"
        ) from None
    strategy: StockStrategy = import_string(path)(name=name)
    return strategy


def counter_strategies() -> set[str]:
    """Names of the registered strategies that keep Redis counters."""
    names = set()
    for name, path in settings.STRATEGIES.items():
        try:
            cls = import_string(path)
        except ImportError:
            continue
        if getattr(cls, "has_counters", False):
            names.add(name)
    return names
