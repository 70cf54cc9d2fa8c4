"""Django system checks. Every message and id stock_locks reports is here."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .conf import DEFAULTS, settings

TAG = "stock_locks"

E001 = "stock_locks.E001"  # REDIS_ALIAS is not a configured cache
E002 = "stock_locks.E002"  # that cache is not a django-redis backend
E003 = "stock_locks.E003"  # a setting has an invalid value
E004 = "stock_locks.E004"  # an unknown name in STOCK_LOCKS
W001 = "stock_locks.W001"  # Redis did not answer PING


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
    prefix = settings.KEY_PREFIX
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        errors.append(
            checks.Error(
                f"STOCK_LOCKS['KEY_PREFIX'] must be a non-empty string without braces, "
                f"got {prefix!r}.",
                hint="Braces would move the cluster hash tag; use e.g. 'sl' or 'shop:sl'.",
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
    replicas = settings.REPLICAS
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        errors.append(
            checks.Error(f"STOCK_LOCKS['REPLICAS'] must be an int >= 0, got {replicas!r}.", id=E003)
        )
    return errors


def check_redis(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.conf import settings as django_settings
    from redis.exceptions import RedisError

    from .connection import get_redis

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
    try:
        client.ping()
    except RedisError as exc:
        return [
            checks.Warning(
                f"Redis for CACHES[{alias!r}] did not answer PING: {exc}.",
                hint="Locks and stock reservations fail (HTTP 503) until it answers.",
                id=W001,
            )
        ]
    return []


def register() -> None:
    checks.register(check_settings, TAG)
    checks.register(check_redis, TAG)
