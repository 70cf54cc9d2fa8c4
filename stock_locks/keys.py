"""Every Redis key shape stock_locks uses, built in one place.

A key is ``<prefix>:<kind>:{<name>}[:<part>]``. The braces are a Redis Cluster
hash tag: every key one script touches shares the same ``{<name>}``, so they all
land in one slot and the scripts run unchanged on a cluster.
"""

from __future__ import annotations

from typing import NamedTuple

from .conf import settings


class LockKeys(NamedTuple):
    lock: str  # the token (string, with the lease as its expiry)
    fence: str  # the fencing counter (never expires)
    holder: str  # holder metadata hash (same lease as the lock)
    signal: str  # wake-up list a release pushes to; waiters BLPOP it


def prefix() -> str:
    return settings.KEY_PREFIX


def lock_base(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a lock name must be a non-empty string, got {name!r}")
    return f"{settings.KEY_PREFIX}:lock:{{{name}}}"


def lock_keys(name: str) -> LockKeys:
    base = lock_base(name)
    return LockKeys(base, f"{base}:fence", f"{base}:holder", f"{base}:signal")


def lock_scan_pattern() -> str:
    """SCAN pattern matching every lock key (and its side keys)."""
    return f"{settings.KEY_PREFIX}:lock:{{*"


def lock_name_from_key(key: str) -> str | None:
    """The lock name inside a lock key, or None for a side key (fence, holder...)."""
    head = f"{settings.KEY_PREFIX}:lock:{{"
    if not key.startswith(head) or not key.endswith("}"):
        return None
    return key[len(head) : -1]


class StockKeys:
    """Stock keys, all under one hash tag (``STOCK_HASH_TAG``) so a cart is one slot.

    ``counter(sku)``: units of ``sku`` left to sell (string integer, no expiry).
    ``record(ref)``: the reservation of order ``ref`` as a hash sku -> qty.
    ``index``: sorted set of open reservation records, scored by creation ms.
    """

    def __init__(self) -> None:
        self.base = f"{settings.KEY_PREFIX}:stock:{{{settings.STOCK_HASH_TAG}}}"
        self.index = f"{self.base}:reservations"
        self._counter = f"{self.base}:avail:"
        self._record = f"{self.base}:res:"

    def counter(self, sku: str) -> str:
        return self._counter + sku

    def record(self, order_ref: str) -> str:
        return self._record + order_ref

    def counter_pattern(self) -> str:
        return self._counter + "*"

    def sku_from_counter(self, key: str) -> str:
        return key[len(self._counter) :]
