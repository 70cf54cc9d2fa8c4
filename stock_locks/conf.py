"""All stock_locks settings, with their defaults, in one place.

Projects set a ``STOCK_LOCKS`` dict in their Django settings; anything left out
takes the default below. Read values through ``stock_locks.conf.settings``::

    from stock_locks.conf import settings
    settings.LOCK_TTL

Unknown names raise ``AttributeError``; values are reloaded when Django's
``setting_changed`` signal fires (so ``override_settings`` works in tests).
Defaults are never written back into Django's settings.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

SETTINGS_NAME = "STOCK_LOCKS"

DEFAULTS: dict[str, Any] = {
    # The django-redis cache alias whose client stock_locks uses.
    "REDIS_ALIAS": "default",
    # First part of every Redis key stock_locks writes. Must not contain braces
    # (the hash tag that keeps a script's keys in one cluster slot follows it).
    "KEY_PREFIX": "sl",
    # Default lock lease, seconds.
    "LOCK_TTL": 30,
    # How long a decorated function waits for its lock by default, seconds.
    "DECORATOR_TIMEOUT": 10,
    # HTTP status a decorated view answers when its lock is not granted in time.
    "LOCK_TIMEOUT_STATUS": 423,
    # HTTP status a decorated view answers when Redis cannot be reached.
    "REDIS_UNAVAILABLE_STATUS": 503,
    # After a fresh grant, WAIT for this many replicas to confirm it (0 = off);
    # when fewer confirm within REPLICA_TIMEOUT seconds the grant is undone.
    "REPLICAS": 0,
    "REPLICA_TIMEOUT": 0.1,
    # How long a release's wake-up signal waits for a waiter to pick it up, seconds.
    "WAKE_SIGNAL_TTL": 2,
    # The project's model that holds stock ("app_label.ModelName"), its SKU
    # field (unique) and its quantity field (units left to sell).
    "STOCK_MODEL": None,
    "STOCK_SKU_FIELD": "sku",
    "STOCK_QUANTITY_FIELD": "stock",
    # Strategy used when get_strategy() is given no name, and the registry of
    # strategies by name (dotted paths, loaded with import_string).
    "STRATEGY": "lua",
    "STRATEGIES": {
        "lua": "stock_locks.stock.lua.LuaStrategy",
        "watch": "stock_locks.stock.watch.WatchStrategy",
        "lock": "stock_locks.stock.lock.LockStrategy",
        "db_row_lock": "stock_locks.stock.db.RowLockStrategy",
        "db_conditional": "stock_locks.stock.db.ConditionalUpdateStrategy",
    },
    # Largest cart: lines per reservation, and units per line.
    "MAX_CART_LINES": 50,
    "MAX_LINE_QUANTITY": 1000,
    # Hash tag shared by every stock key: one cart's counters must sit in one
    # cluster slot for the reserve script to touch them atomically.
    "STOCK_HASH_TAG": "stock",
    # The watch strategy: optimistic attempts before ContentionError, and the
    # base of its jittered exponential backoff between them, seconds.
    "WATCH_ATTEMPTS": 50,
    "WATCH_BACKOFF": 0.001,
    # The lock strategy: lease and wait of each per-SKU lock, seconds.
    "STOCK_LOCK_TTL": 10,
    "STOCK_LOCK_TIMEOUT": 10,
    # Semaphores: default lease of a permit, seconds; how long a decorated
    # view or task waits for a permit; the status a view answers without one.
    "SEMAPHORE_TTL": 30,
    "SEMAPHORE_TIMEOUT": 10,
    "SEMAPHORE_TIMEOUT_STATUS": 429,
    # Delay queues drained by the Celery task (names), how often beat runs it
    # (seconds), how many items one claim takes, how long a claimed item stays
    # invisible to other drainers (seconds) and how many deliveries it gets
    # before it goes to the dead-letter set.
    "DELAY_QUEUES": ["default"],
    "DELAY_QUEUE_INTERVAL": 1,
    "DELAY_QUEUE_BATCH": 500,
    "DELAY_QUEUE_VISIBILITY": 30,
    "DELAY_QUEUE_MAX_ATTEMPTS": 5,
}


class StockLocksSettings:
    """Attribute access to the ``STOCK_LOCKS`` dict, falling back to ``DEFAULTS``."""

    def __init__(self, defaults: dict[str, Any] | None = None) -> None:
        self.defaults = defaults or DEFAULTS
        self._cached: set[str] = set()

    @property
    def user_settings(self) -> dict[str, Any]:
        return getattr(django_settings, SETTINGS_NAME, None) or {}

    def __getattr__(self, attr: str) -> Any:
        if attr not in self.defaults:
            raise AttributeError(f"Invalid stock_locks setting: {attr!r}")
        value = self.user_settings.get(attr, self.defaults[attr])
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def unknown_names(self) -> list[str]:
        """Names in the user's ``STOCK_LOCKS`` dict that stock_locks does not know."""
        return sorted(set(self.user_settings) - set(self.defaults))

    def reload(self) -> None:
        for attr in self._cached:
            delattr(self, attr)
        self._cached.clear()


settings = StockLocksSettings(DEFAULTS)


def _reload_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTINGS_NAME:
        settings.reload()


setting_changed.connect(_reload_settings)
