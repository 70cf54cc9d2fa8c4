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
    """SCAN pattern matching every lock key (not its side keys)."""
    return f"{settings.KEY_PREFIX}:lock:{{*}}"


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


class SemaphoreKeys(NamedTuple):
    holders: str  # zset: holder id -> lease expiry (ms, Redis clock)
    meta: str  # hash: "limit", "waiting" (until when a refused caller sleeps, ms), id -> JSON
    signal: str  # wake-up list of the plain semaphore
    queue: str  # fair: zset waiter id -> ticket (arrival order)
    alive: str  # fair: zset waiter id -> when its place in the queue lapses (ms)
    ticket: str  # fair: ticket counter
    wake_prefix: str  # fair: + waiter id = that waiter's own wake-up list


def semaphore_keys(name: str) -> SemaphoreKeys:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a semaphore name must be a non-empty string, got {name!r}")
    base = f"{settings.KEY_PREFIX}:sem:{{{name}}}"
    return SemaphoreKeys(
        base, f"{base}:meta", f"{base}:signal", f"{base}:queue", f"{base}:alive",
        f"{base}:ticket", f"{base}:wake:",
    )  # fmt: skip


def semaphore_scan_pattern() -> str:
    return f"{settings.KEY_PREFIX}:sem:{{*}}"


class DelayQueueKeys(NamedTuple):
    due: str  # zset: item id -> due time (ms, Redis clock)
    items: str  # hash: item id -> JSON {"task", "payload"}
    attempts: str  # hash: item id -> deliveries so far
    errors: str  # hash: item id -> last error
    inflight: str  # zset: item id -> visibility deadline (ms)
    dead: str  # zset: item id -> when it was given up (ms)
    signal: str  # list a schedule pushes when it moves the next due time earlier


def delay_queue_keys(name: str) -> DelayQueueKeys:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a delay queue name must be a non-empty string, got {name!r}")
    base = f"{settings.KEY_PREFIX}:dq:{{{name}}}"
    return DelayQueueKeys(
        f"{base}:due", f"{base}:items", f"{base}:attempts", f"{base}:errors",
        f"{base}:inflight", f"{base}:dead", f"{base}:signal",
    )  # fmt: skip
