"""Sold-out SKUs answered in this process, without a round trip to Redis.

Most attempts of a flash sale come after the stock is gone, and each is the
same refusal. The ``lua`` strategy remembers a refusal it got from Redis
(SKU, units that were left, the SKU's move version) and answers a later cart
asking more than that itself, until units come back.

Units only come back through scripts that announce it: a release, a positive
correction (restock, a put-back from a database strategy, reconcile) and a
counter (re)loaded from the database each ``PUBLISH "<version> <sku>"`` on the
channel named after the versions hash (:class:`~stock_locks.keys.StockKeys`).
One listener thread per process subscribes to it and drops the SKU's entry
when an announcement is newer than the refusal it remembers. A remembered
level is an upper bound of what Redis holds for as long as nothing was
announced (a sale only lowers it), so a local refusal never refuses what
Redis would grant by that bound, and a local answer never grants anything:
this cache cannot oversell.

How long a unit that came back can stay unsellable here:

* normally, the time the announcement takes to reach this process (about one
  round trip); units given back by this process are forgotten at once;
* at most ``SOLD_OUT_TTL`` seconds after the refusal, whatever happens: a
  lost announcement (the listener's connection cut and re-established, Redis
  flushed) is covered by that bound. While the listener is not subscribed
  nothing is remembered, and every (re)subscription starts empty; a refusal
  whose request was sent before it is not remembered.

A remembered refusal still asks Redis one thing: whether the order ref holds a
record (``EXISTS``, instead of the script). An earlier attempt of the same ref
(a retry after a lost reply, a duplicate request in flight in another process)
may hold units; then the script runs and answers with them, as without this
cache (tests/faults/test_stock_duplicates.py). Disabled on a
Redis Cluster client.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..backends.redis.cluster import is_cluster
from ..conf import settings
from .cart import Cart

log = logging.getLogger("stock_locks.stock")

HEARTBEAT = 1.0  # seconds of silence before the listener PINGs (2x: the connection is dead)
RECONNECT_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)  # seconds between attempts to subscribe again
MAX_TRACKED_SKUS = 100_000  # beyond that, forget everything (safe, only slower)


class SoldOutCache:
    """What this process remembers of Redis's refusals, and the listener that voids it.

    Thread-safe; used by the ``lua`` strategy's sync and async paths alike.
    """

    def __init__(self, client: Any, channel: str, ttl: float) -> None:
        self.client = client
        self.pool = client.connection_pool
        self.channel = channel
        self.ttl = ttl
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[int, int, float]] = {}  # sku -> (avail, version, until)
        self._latest: dict[str, int] = {}  # sku -> version of its last announcement
        self._epoch = 0  # bumped by each subscription
        self._listening = threading.Event()  # set while subscribed
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._listen, name="stock_locks-soldout", daemon=True
        )
        self._thread.start()

    # -- the strategy's side ------------------------------------------------

    def ticket(self) -> int | None:
        """Taken before a reserve is sent: None while no subscription is live."""
        return self._epoch if self._listening.is_set() else None

    def refused(self, ticket: int | None, sku: str, avail: int, version: int) -> None:
        """Redis refused ``sku`` with ``avail`` left at move ``version``: remember it,
        unless the subscription changed since ``ticket`` or a newer version was
        announced meanwhile."""
        if ticket is None:
            return
        with self._lock:
            if ticket != self._epoch or not self._listening.is_set():
                return
            if self._latest.get(sku, -1) > version:
                return
            self._entries[sku] = (avail, version, time.monotonic() + self.ttl)

    def short_line(self, lines: Cart) -> tuple[str, int, int] | None:
        """(sku, qty, avail) of the first line known to ask more than is left, or None."""
        entries = self._entries
        if not entries:
            return None
        now = time.monotonic()
        for sku, qty in lines.items():
            entry = entries.get(sku)
            if entry is not None and qty > entry[0] and now < entry[2]:
                return sku, qty, entry[0]
        return None

    def wait_listening(self, timeout: float) -> bool:
        """Block until the listener is subscribed (refusals are remembered from then
        on), at most ``timeout`` seconds; whether it is."""
        return self._listening.wait(timeout)

    def forget(self, skus: Iterable[str]) -> None:
        """Units of ``skus`` came back through this process: stop answering for them."""
        with self._lock:
            for sku in skus:
                self._entries.pop(sku, None)

    def close(self) -> None:
        """Stop the listener (it exits within one heartbeat) and forget everything."""
        self._closed.set()
        self._reset(subscribed=False)

    # -- the listener -------------------------------------------------------

    def _reset(self, *, subscribed: bool) -> None:
        with self._lock:
            self._entries.clear()
            self._latest.clear()
            self._epoch += 1
            if subscribed:
                self._listening.set()
            else:
                self._listening.clear()

    def _announced(self, data: bytes) -> None:
        version_text, _, sku_bytes = data.partition(b" ")
        sku, version = sku_bytes.decode(), int(version_text)
        with self._lock:
            if len(self._latest) >= MAX_TRACKED_SKUS:
                self._entries.clear()
                self._latest.clear()
            self._latest[sku] = version
            entry = self._entries.get(sku)
            if entry is not None and version > entry[1]:
                del self._entries[sku]

    def _listen(self) -> None:
        failures = 0
        while not self._closed.is_set():
            pubsub = self.client.pubsub()
            try:
                pubsub.subscribe(self.channel)
                heard = time.monotonic()
                while not self._closed.is_set():
                    message = pubsub.get_message(timeout=HEARTBEAT)
                    now = time.monotonic()
                    if message is None:
                        if now - heard > 2 * HEARTBEAT:
                            raise TimeoutError(f"no reply to PING for {now - heard:.1f} s")
                        pubsub.ping()  # its reply comes back as a "pong" message
                        continue
                    heard = now
                    if message["type"] == "subscribe":
                        self._reset(subscribed=True)
                        failures = 0
                    elif message["type"] == "message":
                        self._announced(message["data"])
            except Exception as exc:  # noqa: BLE001 (any failure: forget, then subscribe again)
                if not self._closed.is_set():
                    log.info(
                        "sold-out listener on %s lost (%s); subscribing again", self.channel, exc
                    )
            finally:
                self._reset(subscribed=False)
                with contextlib.suppress(Exception):  # (the connection is dropped anyway)
                    pubsub.close()
            delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
            failures += 1
            self._closed.wait(delay)


_current: SoldOutCache | None = None
_current_lock = threading.Lock()


def cache_for(client: Any, channel: str) -> SoldOutCache | None:
    """This process's cache for the Redis behind ``client`` and ``channel``; None when
    disabled (``SOLD_OUT_TTL`` 0, or a cluster client). Starts its listener on first
    use (and again in a forked child). Clients sharing a connection pool share the
    cache (Django's caches, hence django-redis clients, are per thread; their pool is
    per process)."""
    global _current
    ttl = settings.SOLD_OUT_TTL
    if _serves(_current, client, channel, ttl):
        return _current
    if not ttl or not math.isfinite(ttl) or is_cluster(client):
        return None
    with _current_lock:
        current = _current
        if _serves(current, client, channel, ttl):
            return current  # another thread made it meanwhile
        if current is not None and current.pid == os.getpid():
            current.close()
        _current = SoldOutCache(client, channel, ttl)
        return _current


def _serves(cache: SoldOutCache | None, client: Any, channel: str, ttl: float) -> bool:
    return (
        cache is not None
        and cache.pool is getattr(client, "connection_pool", None)
        and cache.channel == channel
        and cache.ttl == ttl
        and cache.pid == os.getpid()
    )


def units_back(skus: Iterable[str]) -> None:
    """This process just gave units of ``skus`` back in Redis: answer them from Redis
    again at once (other processes hear the script's announcement)."""
    current = _current
    if current is not None and current.pid == os.getpid():
        current.forget(skus)


def reset() -> None:
    """Forget every remembered refusal and stop the listener (tests; after FLUSHALL,
    which announces nothing)."""
    global _current
    with _current_lock:
        if _current is not None and _current.pid == os.getpid():
            _current.close()
        _current = None
