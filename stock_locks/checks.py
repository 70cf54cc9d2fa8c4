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
E005 = "stock_locks.E005"  # STOCK_MODEL or its fields do not exist
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
    return errors


def _check_stock_model() -> list[checks.CheckMessage]:
    from django.apps import apps
    from django.core.exceptions import FieldDoesNotExist

    label = settings.STOCK_MODEL
    if not label:
        return []  # stock strategies unused; get_strategy() says what to set
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError) as exc:
        return [checks.Error(f"STOCK_LOCKS['STOCK_MODEL'] = {label!r}: {exc}", id=E005)]
    errors = []
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
