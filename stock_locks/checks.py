"""Django system checks. Every message and id stock_locks reports is here."""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import urlsplit

from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import connections, router
from redis.exceptions import RedisError
from redis.sentinel import SentinelConnectionPool

from .backends import aliases, get_backend
from .backends.base import FENCED
from .backends.redis import RedisBackend
from .backends.redis.client import get_redis, names_its_redis
from .backends.redis.transport import on_own_connection
from .conf import DEFAULTS, settings
from .stock.caps import parse_cap_window, parse_caps

TAG = "stock_locks"

E001 = "stock_locks.E001"  # REDIS_ALIAS is not a configured cache
E002 = "stock_locks.E002"  # that cache is not a django-redis backend
E003 = "stock_locks.E003"  # a setting has an invalid value
E004 = "stock_locks.E004"  # an unknown name in STOCK_LOCKS
E005 = "stock_locks.E005"  # STOCK_MODEL or its fields do not exist
E006 = "stock_locks.E006"  # the SKU field does not hold text
E007 = "stock_locks.E007"  # the default strategy is "lock" and the stock model has no fence
E008 = "stock_locks.E008"  # the Redis client has no socket (or connect) timeout
E009 = "stock_locks.E009"  # a BACKENDS entry cannot be built
E010 = "stock_locks.E010"  # something needs a capability its backend lacks
W001 = "stock_locks.W001"  # Redis did not answer PING
W002 = "stock_locks.W002"  # the "lock" strategy is registered, the stock model has no fence
W003 = "stock_locks.W003"  # REDIS_ALIAS shares its Redis database with another cache alias
W005 = "stock_locks.W005"  # SQLite without transaction_mode IMMEDIATE
W006 = "stock_locks.W006"  # Sentinel-managed Redis with REPLICAS 0 (no WAIT on a grant)
W007 = "stock_locks.W007"  # Sentinel-managed primary with min-replicas-to-write 0
W008 = "stock_locks.W008"  # a silent sentinel holds a call longer than the socket timeout
W009 = "stock_locks.W009"  # REPLICA_TIMEOUT is not below the client's socket timeout
W010 = "stock_locks.W010"  # PostgreSQL at REPEATABLE READ or SERIALIZABLE

PING_TIMEOUT = 2  # seconds: the check never hangs on a Redis that does not answer
TEXT_FIELDS = ("CharField", "TextField", "SlugField")


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name in settings.unknown_names():
        errors.append(
            checks.Error(
                f"STOCK_LOCKS[{name!r}] is not a stock_locks setting.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id=E004,
            )
        )
    hints = {
        "KEY_PREFIX": "Braces would move the cluster hash tag; use e.g. 'sl' or 'shop:sl'.",
        "STOCK_HASH_TAG": "It is the Redis Cluster hash tag that keeps every stock key (a "
        "cart, its record) in one slot; without it every reservation on a cluster fails "
        "as a cross-slot call. Use e.g. 'stock'.",
    }
    for name, hint in hints.items():
        value = getattr(settings, name)
        if not isinstance(value, str) or not value or "{" in value or "}" in value:
            errors.append(
                checks.Error(
                    f"STOCK_LOCKS[{name!r}] must be a non-empty string without braces, "
                    f"got {value!r}.",
                    hint=hint,
                    id=E003,
                )
            )
    max_hold = settings.LOCK_MAX_HOLD
    if max_hold is not None and (
        isinstance(max_hold, bool) or not isinstance(max_hold, int | float) or not max_hold > 0
    ):
        errors.append(
            checks.Error(
                "STOCK_LOCKS['LOCK_MAX_HOLD'] must be None or a positive number of seconds, "
                f"got {max_hold!r}.",
                id=E003,
            )
        )
    for name in ("LOCK_TTL", "DECORATOR_TIMEOUT", "REPLICA_TIMEOUT", "WAKE_SIGNAL_TTL"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            errors.append(
                checks.Error(
                    f"STOCK_LOCKS[{name!r}] must be a positive number of seconds, got {value!r}.",
                    id=E003,
                )
            )
    if settings.STRATEGY not in (settings.STRATEGIES or {}):
        errors.append(
            checks.Error(
                f"STOCK_LOCKS['STRATEGY'] is {settings.STRATEGY!r}, not a name in STRATEGIES.",
                id=E003,
            )
        )
    errors.extend(_check_stock_model())
    replicas = settings.REPLICAS
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        errors.append(
            checks.Error(f"STOCK_LOCKS['REPLICAS'] must be an int >= 0, got {replicas!r}.", id=E003)
        )
    try:
        parse_caps(settings.CAPS)
    except ValueError as exc:
        errors.append(checks.Error(f"STOCK_LOCKS['CAPS']: {exc}.", id=E003))
    errors.extend(_check_cap_field())
    return errors


def _check_cap_field() -> list[checks.CheckMessage]:
    """STOCK_CAP_FIELD names an integer field of the stock model; the window parses."""
    field = settings.STOCK_CAP_FIELD
    if not field:
        return []
    errors: list[checks.CheckMessage] = []
    try:
        parse_cap_window(settings.STOCK_CAP_WINDOW)
    except ValueError as exc:
        errors.append(checks.Error(f"STOCK_LOCKS['STOCK_CAP_WINDOW']: {exc}.", id=E003))
    try:
        model = apps.get_model(settings.STOCK_MODEL)
        kind = model._meta.get_field(field).get_internal_type()
    except (LookupError, ValueError, TypeError, FieldDoesNotExist) as exc:
        return [*errors, checks.Error(f"STOCK_LOCKS['STOCK_CAP_FIELD'] = {field!r}: {exc}.",
                                      id=E003)]  # fmt: skip
    if "Integer" not in kind:
        errors.append(checks.Error(
            f"STOCK_LOCKS['STOCK_CAP_FIELD'] = {field!r} is a {kind}: an integer field "
            "(NULL for no cap) is needed.", id=E003,
        ))  # fmt: skip
    return errors


def _check_stock_model() -> list[checks.CheckMessage]:
    label = settings.STOCK_MODEL
    if not label:
        return []  # stock strategies unused; get_strategy() says what to set
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError) as exc:
        return [checks.Error(f"STOCK_LOCKS['STOCK_MODEL'] = {label!r}: {exc}", id=E005)]
    errors: list[checks.CheckMessage] = []
    for setting in ("STOCK_SKU_FIELD", "STOCK_QUANTITY_FIELD"):
        try:
            model._meta.get_field(getattr(settings, setting))
        except FieldDoesNotExist:
            errors.append(
                checks.Error(
                    f"STOCK_LOCKS[{setting!r}] = {getattr(settings, setting)!r} is not a field "
                    f"of {label}.",
                    id=E005,
                )
            )
    if errors:
        return errors
    sku_field = model._meta.get_field(settings.STOCK_SKU_FIELD)
    if sku_field.get_internal_type() not in TEXT_FIELDS:
        errors.append(
            checks.Error(
                f"STOCK_LOCKS['STOCK_SKU_FIELD'] = {settings.STOCK_SKU_FIELD!r} is a "
                f"{sku_field.get_internal_type()}; SKUs are text (carts, Redis keys, order "
                "lines), so every sale would fail as an unknown SKU.",
                hint="Use a unique CharField for the SKU (e.g. a `code` column beside an "
                "integer id).",
                id=E006,
            )
        )
    if "lock" in (settings.STRATEGIES or {}) and "fence" not in {
        f.name for f in model._meta.get_fields()
    }:
        message = (
            f"The 'lock' stock strategy writes fenced rows, and {label} has no `fence` "
            "column: every reservation through it would fail."
        )
        hint = "Subclass stock_locks.fencing.FencedModel (and migrate), or remove 'lock' "
        if settings.STRATEGY == "lock":
            errors.append(checks.Error(message, hint=hint + "as STRATEGY.", id=E007))
        else:
            errors.append(checks.Warning(message, hint=hint + "from STRATEGIES.", id=W002))
    errors.extend(_check_sqlite(model))
    errors.extend(_check_isolation(model))
    return errors


def _check_sqlite(model: Any) -> list[checks.CheckMessage]:
    alias = router.db_for_write(model)
    connection = connections[alias]
    if connection.vendor != "sqlite":
        return []
    if (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode") == "IMMEDIATE":
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] is SQLite with deferred transactions: concurrent "
            "reservations fail with 'database is locked' (SQLite has no row locks, and a "
            "deferred transaction cannot wait for the write lock it upgrades to).",
            hint='Set DATABASES[...]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", '
            '"timeout": 30} (Django >= 5.1), or use PostgreSQL for production.',
            id=W005,
        )
    ]


def _check_isolation(model: Any) -> list[checks.CheckMessage]:
    alias = router.db_for_write(model)
    connection = connections[alias]
    level = (connection.settings_dict.get("OPTIONS") or {}).get("isolation_level")
    if connection.vendor != "postgresql" or level is None:
        return []
    # The levels of whichever psycopg the backend runs on (it loaded this module of Django's;
    # psycopg is not a dependency of stock_locks).
    drivers = sys.modules.get("django.db.backends.postgresql.psycopg_any")
    try:
        name = drivers.IsolationLevel(level).name if drivers else ""
    except ValueError:
        return []  # (psycopg refuses it when it connects)
    if name not in ("REPEATABLE_READ", "SERIALIZABLE"):
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] runs its transactions at {name.replace('_', ' ')}: of two "
            "buyers of one SKU at once, the second fails ('could not serialize access due to "
            "concurrent update') instead of waiting for the first and taking what is left.",
            hint="stock_locks' stock writes are relative and guarded (stock = stock - n WHERE "
            "stock >= n) and read what was committed before each statement: they need READ "
            "COMMITTED, PostgreSQL's default. Remove OPTIONS['isolation_level'], or route the "
            "stock model and stock_locks' models to an alias at READ COMMITTED.",
            id=W010,
        )
    ]


def check_backends(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every BACKENDS alias can be built (no connection is made), and the lock
    strategy's backend is fenced."""
    errors: list[checks.CheckMessage] = []
    if not isinstance(settings.BACKENDS or {}, dict):
        return [checks.Error("STOCK_LOCKS['BACKENDS'] must be a dict of aliases.", id=E009)]
    built = {}
    for alias in aliases():
        try:
            built[alias] = get_backend(alias)
        except Exception as exc:  # a bad dotted path, LOCATION or option, whatever it raised
            errors.append(
                checks.Error(
                    f"STOCK_LOCKS['BACKENDS'][{alias!r}] cannot be built: "
                    f"{type(exc).__name__}: {exc}",
                    hint="Check its BACKEND dotted path, LOCATION and OPTIONS "
                    "(docs/backends.md: Growing past one Redis).",
                    id=E009,
                )
            )
    stock_alias = settings.STOCK_LOCK_BACKEND or "default"
    if "lock" in (settings.STRATEGIES or {}) and settings.STOCK_MODEL:
        backend = built.get(stock_alias)
        if stock_alias not in built and stock_alias not in aliases():
            errors.append(
                checks.Error(
                    f"STOCK_LOCKS['STOCK_LOCK_BACKEND'] is {stock_alias!r}, not an alias of "
                    "STOCK_LOCKS['BACKENDS'].",
                    id=E010,
                )
            )
        elif backend is not None and not backend.has(FENCED):
            errors.append(
                checks.Error(
                    f"The 'lock' stock strategy needs fenced locks, and backend "
                    f"{stock_alias!r} ({type(backend).__name__}) is not fenced.",
                    hint="Point STOCK_LOCKS['STOCK_LOCK_BACKEND'] at a fenced backend, or "
                    "remove 'lock' from STRATEGIES.",
                    id=E010,
                )
            )
    return errors


def _default_backend_has_location() -> bool:
    entry = (settings.BACKENDS or {}).get("default")
    return isinstance(entry, dict) and names_its_redis(entry)


def check_redis(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if _default_backend_has_location():
        return []  # the default backend names its Redis itself: CACHES is not involved
    alias = settings.REDIS_ALIAS
    if alias not in getattr(django_settings, "CACHES", {}):
        return [
            checks.Error(
                f"STOCK_LOCKS['REDIS_ALIAS'] is {alias!r}, but CACHES has no such alias.",
                hint="Add a django-redis cache under that alias, or point REDIS_ALIAS at one.",
                id=E001,
            )
        ]
    try:
        client = get_redis(alias)
    except NotImplementedError:
        return [
            checks.Error(
                f"CACHES[{alias!r}] is not a django-redis cache.",
                hint="Use BACKEND 'django_redis.cache.RedisCache'.",
                id=E002,
            )
        ]
    shared = _sharing_aliases(alias, django_settings.CACHES)
    if shared:
        where = (
            "is Django's default cache"
            if alias == "default"
            else f"shares its Redis database with cache alias(es) {', '.join(map(repr, shared))}"
        )
        return [
            checks.Warning(
                f"STOCK_LOCKS['REDIS_ALIAS'] {alias!r} {where}: cache.clear() (common in "
                "tests and deploy scripts) deletes held locks, reservations and the delay queue.",
                hint="Give stock_locks a cache alias of its own on another Redis database "
                "(e.g. LOCATION 'redis://host:6379/1'), and set REDIS_ALIAS to it.",
                id=W003,
            )
        ]
    connect_timeout, socket_timeout = _timeouts(client)
    if not socket_timeout or not connect_timeout:
        return [
            checks.Error(
                f"CACHES[{alias!r}] has no socket timeout or no connect timeout: a Redis "
                "that accepts connections and never answers would hang every request "
                "(and manage.py commands) instead of failing with HTTP 503.",
                hint=f'Set CACHES[{alias!r}]["OPTIONS"] "SOCKET_CONNECT_TIMEOUT": 2 and '
                '"SOCKET_TIMEOUT": 5 (seconds).',
                id=E008,
            )
        ]
    try:
        _ping(client)
    except RedisError as exc:
        return [
            checks.Warning(
                f"Redis for CACHES[{alias!r}] did not answer PING: {exc}.",
                hint="Locks and stock reservations fail (HTTP 503) until it answers.",
                id=W001,
            )
        ]
    return []


def _sharing_aliases(alias: str, caches: dict[str, Any]) -> list[str]:
    """Other django-redis aliases whose LOCATION is the same server and database."""

    def places(config: dict[str, Any]) -> set[str]:
        if "django_redis" not in str(config.get("BACKEND", "")):
            return set()
        location = config.get("LOCATION") or []
        urls = location.split(",") if isinstance(location, str) else list(location)
        return {_normalized(url) for url in urls}

    if alias == "default":
        return ["default"]
    ours = places(caches[alias])
    return [other for other in caches if other != alias and places(caches[other]) & ours]


def _normalized(url: str) -> str:
    parts = urlsplit(url.strip())
    db = parts.path.strip("/") or "0"
    return f"{parts.hostname}:{parts.port or 6379}/{db}"


def _timeouts(client: Any) -> tuple[float | None, float | None]:
    """(connect, socket) timeouts the client's connections get, read without connecting."""
    pool = client.connection_pool
    connection = pool.connection_class(**pool.connection_kwargs)
    return connection.socket_connect_timeout, connection.socket_timeout


def _ping(client: Any) -> None:
    """PING on a connection of its own whose every step waits at most PING_TIMEOUT
    (made like the pool's: through Sentinel, TLS, a unix socket as configured)."""
    on_own_connection(client, ("PING",), PING_TIMEOUT)


def check_replication(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every Redis backend reached through Sentinel: WAIT on grants (W006), the
    primary's min-replicas-to-write (W007, asked with CONFIG GET, skipped when the
    primary does not answer it), how long a silent sentinel holds a call (W008); and
    for every Redis backend with REPLICAS, REPLICA_TIMEOUT below the socket timeout
    (W009). A backend that cannot be built is check_backends' to report."""
    messages: list[checks.CheckMessage] = []
    seen: set[int] = set()
    for alias in aliases():
        try:
            backend = get_backend(alias)
            client = backend.client if isinstance(backend, RedisBackend) else None
        except Exception:  # reported by check_backends / check_redis
            continue
        pool = getattr(client, "connection_pool", None)
        if not isinstance(backend, RedisBackend) or pool is None or id(client) in seen:
            continue
        seen.add(id(client))
        replicas = backend.options.replicas
        replicas = settings.REPLICAS if replicas is None else replicas
        _, socket_timeout = _timeouts(client)
        where = f"STOCK_LOCKS['BACKENDS'][{alias!r}]"
        if replicas and socket_timeout and socket_timeout <= settings.REPLICA_TIMEOUT:
            messages.append(
                checks.Warning(
                    f"STOCK_LOCKS['REPLICA_TIMEOUT'] ({settings.REPLICA_TIMEOUT}s) is not below "
                    f"the socket timeout of {where} ({socket_timeout}s): a grant that no "
                    "replica confirms in time is reported as Redis unavailable (HTTP 503) "
                    "instead of LockNotReplicated.",
                    hint="Keep REPLICA_TIMEOUT a fraction of the socket timeout (default 0.1s).",
                    id=W009,
                )
            )
        if isinstance(pool, SentinelConnectionPool):
            messages.extend(_sentinel_messages(where, client, pool, replicas, socket_timeout))
    return messages


def _sentinel_messages(
    where: str, client: Any, pool: Any, replicas: int, socket_timeout: float | None
) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    if not replicas:
        messages.append(
            checks.Warning(
                f"{where} is reached through Sentinel with STOCK_LOCKS['REPLICAS'] = 0: a lock "
                "granted by the primary and not yet copied to a replica is lost when that "
                "replica is promoted, and a second holder is granted (fenced writes still "
                "refuse the first one).",
                hint="Set REPLICAS to 1 (its OPTIONS or STOCK_LOCKS): a grant then waits for "
                "a replica's copy (WAIT) or raises LockNotReplicated.",
                id=W006,
            )
        )
    try:
        reply = on_own_connection(client, ("CONFIG", "GET", "min-replicas-to-write"), PING_TIMEOUT)
    except RedisError:
        reply = None  # unreachable (W001) or CONFIG disabled, as on managed services
    values = [v.decode() if isinstance(v, bytes) else str(v) for v in reply or []]
    if len(values) == 2 and values[1] == "0":
        messages.append(
            checks.Warning(
                f"The primary of {where} has min-replicas-to-write 0: cut off from the "
                "sentinels, it keeps taking reservations and grants that are lost when another "
                "is promoted (the database still refuses every oversell; reconcile brings "
                "the counts back).",
                hint="In the primary's and replicas' redis.conf: min-replicas-to-write 1 and "
                "min-replicas-max-lag 10 (a cut-off primary then refuses writes: HTTP 503).",
                id=W007,
            )
        )
    limit = socket_timeout or 0
    for sentinel in pool.sentinel_manager.sentinels:
        probe = sentinel.connection_pool
        connection = probe.connection_class(**probe.connection_kwargs)
        timeout = connection.socket_timeout
        retries = getattr(getattr(connection, "retry", None), "_retries", 0)
        if timeout is None or timeout * (1 + retries) > limit:
            held = "for ever" if timeout is None else f"{timeout * (1 + retries):g}s"
            messages.append(
                checks.Warning(
                    f"A sentinel of {where} that stops answering holds a call that must find "
                    f"the primary {held} (socket timeout {timeout}, {retries} retries), past "
                    f"the socket timeout of {limit}s.",
                    hint="Give the sentinels' clients the same timeouts and no retries: "
                    'SENTINEL_KWARGS {"socket_timeout": ..., "socket_connect_timeout": ..., '
                    "\"retry\": Retry(NoBackoff(), 0)} in the cache's or backend's OPTIONS "
                    "(docs/backends.md: Redis with Sentinel).",
                    id=W008,
                )
            )
            break
    return messages


def register() -> None:
    checks.register(check_settings, TAG)
    checks.register(check_backends, TAG)
    checks.register(check_redis, TAG)
    checks.register(check_replication, TAG)
