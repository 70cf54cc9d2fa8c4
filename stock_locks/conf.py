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
DEDICATED_ALIAS = "stock_locks"  # the cache alias REDIS_ALIAS picks by default

DEFAULTS: dict[str, Any] = {
    # The django-redis cache alias whose client stock_locks uses. None (the
    # default): the alias "stock_locks" when CACHES has it, else "default". Give
    # stock_locks an alias of its own on its own Redis database (check W003).
    "REDIS_ALIAS": None,
    # Coordinators by alias, like CACHES: {"alias": {"BACKEND": dotted path,
    # "LOCATION": ..., "OPTIONS": {...}}}. "default" need not be listed: it is
    # then the Redis of REDIS_ALIAS. Locks, decorators and tools take backend=
    # an alias (stock_locks.backends).
    "BACKENDS": {},
    # The BACKENDS alias stock_locks.RedLock uses by default.
    "REDLOCK_BACKEND": "redlock",
    # First part of every Redis key stock_locks writes. Must not contain braces
    # (the hash tag that keeps a script's keys in one cluster slot follows it).
    "KEY_PREFIX": "sl",
    # Default lock lease, seconds.
    "LOCK_TTL": 30,
    # Default max_hold of watchdog locks: the longest the watchdog keeps one
    # renewed from its grant, seconds (None: no cap). Locks without a watchdog
    # are not affected; Lock(..., max_hold=math.inf) opts one out.
    "LOCK_MAX_HOLD": None,
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
    # stock_locks.aio: the most pooled connections to one Redis server per event loop
    # (waiting coroutines hold none: one listener connection wakes them all), and how
    # long a call waits for a free one before it fails as Redis unavailable, seconds.
    "ASYNC_MAX_CONNECTIONS": 32,
    "ASYNC_POOL_TIMEOUT": 10,
    # Record metrics (stock_locks.metrics): counters and histograms per process,
    # prometheus-client when installed, and the per-second timeline in Redis the
    # dashboard charts. METRICS_TOKEN: the bearer token the scrape endpoint
    # (stock_locks.urls, "metrics") asks for; None (default) disables the endpoint.
    "METRICS": True,
    "METRICS_TOKEN": None,
    # How long a lock name's fencing counter is kept once the Redis server's
    # clock has passed its last fence, seconds (and never less than the lease).
    # Every fence is at least that clock in microseconds, so from then on the
    # clock alone makes the next fence higher: the counter only covers the clock
    # stepping back. Safe at any value above the largest backwards step of the
    # Redis server's clock; a minute is far above an NTP correction or a leap
    # second. (It was a day after the last grant: ~150 MB of Redis per million
    # order locks a day, for nothing; benchmarks/dashboard.py measures it.)
    "FENCE_RETENTION": 60,
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
    # Purchase caps per customer: {name: {"skus": [...], "max": N, "period": seconds
    # (a rolling window; optional), "since": ISO 8601 (optional)}}
    # (stock_locks.stock.caps).
    "CAPS": {},
    # Per-SKU caps on the stock model: the name of its integer field holding "at most
    # N per customer" (NULL: none; "": off), counted over STOCK_CAP_WINDOW ({"period":
    # s, "since": ISO 8601}, both optional: empty is for ever), read from the database
    # again every STOCK_CAP_REFRESH seconds per process.
    "STOCK_CAP_FIELD": "",
    "STOCK_CAP_WINDOW": {},
    "STOCK_CAP_REFRESH": 5.0,
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
    # The lua strategy answers a cart asking more of a SKU than Redis last said was
    # left, without a round trip, until units of it come back (announced on pub/sub)
    # and for at most this many seconds after that refusal; 0 turns it off
    # (stock_locks.stock.soldout).
    "SOLD_OUT_TTL": 1.0,
    # The lua and watch strategies on PostgreSQL: reservations Redis took at the same
    # moment are written to the database by one transaction (one commit and one wait
    # on each hot row for all of them) instead of one each (group commit,
    # stock_locks.stock.groupcommit). A caller waits at most GROUP_COMMIT_WAIT seconds
    # for the transaction that carries its reservation, then writes its own; one
    # transaction carries at most GROUP_COMMIT_BATCH reservations.
    "GROUP_COMMIT": True,
    "GROUP_COMMIT_WAIT": 1.0,
    "GROUP_COMMIT_BATCH": 100,
    # Reservations made with a ttl: the delay queue their expiry items go to (it
    # must be one of DELAY_QUEUES). The sweeper (Celery beat, every SWEEP_INTERVAL
    # seconds) expires reservations overdue by more than SWEEP_GRACE seconds that
    # the queue lost, at most SWEEP_BATCH per run, and gives back the units of a
    # Redis reservation record that has no database row after ORPHAN_GRACE seconds.
    "RESERVATION_QUEUE": "default",
    "SWEEP_INTERVAL": 30,
    "SWEEP_GRACE": 30,
    "SWEEP_BATCH": 500,
    "ORPHAN_GRACE": 60,
    # The lock strategy: the backend alias of its per-SKU locks (None: "default";
    # it must be fenced), and the lease and wait of each lock, seconds.
    "STOCK_LOCK_BACKEND": None,
    "STOCK_LOCK_TTL": 10,
    "STOCK_LOCK_TIMEOUT": 10,
    # Semaphores: default lease of a permit, seconds; how long a decorated
    # view or task waits for a permit; the status a view answers without one.
    "SEMAPHORE_TTL": 30,
    "SEMAPHORE_TIMEOUT": 10,
    "SEMAPHORE_TIMEOUT_STATUS": 429,
    # A fair semaphore's waiter keeps its place this long past its planned next
    # try (and a wake-up sent to it lasts this long), seconds. A waiter that dies
    # holds up those behind it for at most this long after its planned try; a
    # live one that comes back later than this queues again at the end. Every
    # process using a fair semaphore must use the same value.
    "FAIR_QUEUE_GRACE": 2,
    # Delay queues drained by the Celery task (names), how often beat runs it
    # (seconds), how many items one claim takes, how long a claimed item stays
    # invisible to other drainers (seconds) and how many deliveries it gets
    # before it goes to the dead-letter set.
    "DELAY_QUEUES": ["default"],
    "DELAY_QUEUE_INTERVAL": 1,
    "DELAY_QUEUE_BATCH": 500,
    "DELAY_QUEUE_VISIBILITY": 30,
    "DELAY_QUEUE_MAX_ATTEMPTS": 5,
    # The module of each installed app that holds its delay-queue handlers
    # (@stock_locks.delayqueue.handler); imported when Django is ready. "" = off.
    "DELAY_QUEUE_HANDLERS_MODULE": "delay_handlers",
    # Waiting rooms (stock_locks.waitingroom): how long a process reuses an Event row
    # and the units left of its SKUs before reading them again, seconds (0: every
    # request reads them). An admission pass is taken without a round trip for
    # WAITING_ROOM_PASS_REFRESH seconds after it was issued (capped at a third of the
    # event's session_ttl), then renewed in Redis; a room whose Redis state was lost
    # admits nobody for that long (passes issued before the loss lapse first). One step
    # takes at most WAITING_ROOM_MAX_POPS entries off the lanes (abandoned ones
    # included), which bounds the time a step holds Redis.
    "WAITING_ROOM_EVENT_CACHE": 5.0,
    "WAITING_ROOM_STOCK_INTERVAL": 0.25,
    "WAITING_ROOM_PASS_REFRESH": 30.0,
    "WAITING_ROOM_MAX_POPS": 1000,
    # Where a waiting room's admission pass travels: a cookie per event named
    # "<prefix><slug>" and, for API clients, a request header.
    "WAITING_ROOM_COOKIE_PREFIX": "sl_wr_",
    "WAITING_ROOM_PASS_HEADER": "X-Waiting-Room-Pass",
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
        if attr == "REDIS_ALIAS" and value is None:
            caches = getattr(django_settings, "CACHES", {}) or {}
            value = DEDICATED_ALIAS if DEDICATED_ALIAS in caches else "default"
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
        self._key_prefix = None

    _key_prefix: str | None = None

    def key_prefix(self) -> str:
        """The first part of every Redis key: ``KEY_PREFIX``, behind the django-redis
        cache's own ``KEY_PREFIX`` when the alias has one (``"<cache prefix>:sl"``), so
        environments that share a Redis database by cache prefix share no stock_locks
        key either. The cache's ``VERSION`` is not used: versions invalidate cached
        values, and held locks and reservations must never be orphaned by a bump."""
        if self._key_prefix is None:
            caches = getattr(django_settings, "CACHES", {}) or {}
            outer = (caches.get(self.REDIS_ALIAS) or {}).get("KEY_PREFIX") or ""
            self._key_prefix = f"{outer}:{self.KEY_PREFIX}" if outer else self.KEY_PREFIX
        return self._key_prefix


settings = StockLocksSettings(DEFAULTS)


def _reload_settings(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTINGS_NAME, "CACHES"):
        settings.reload()


setting_changed.connect(_reload_settings)
