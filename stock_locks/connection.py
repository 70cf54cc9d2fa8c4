"""The Redis client stock_locks talks to: django-redis's, by alias."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .conf import settings

if TYPE_CHECKING:
    from redis import Redis


def get_redis(alias: str | None = None) -> Redis:
    """The raw redis-py client behind the django-redis cache ``alias``.

    ``alias`` defaults to ``STOCK_LOCKS["REDIS_ALIAS"]``. Raises
    ``NotImplementedError`` when that cache is not a django-redis backend and
    ``django.core.cache.InvalidCacheBackendError`` when it does not exist.
    """
    from django_redis import get_redis_connection

    return get_redis_connection(alias or settings.REDIS_ALIAS)


def blocking_cap(client: object) -> float | None:
    """The client's socket timeout in seconds (None when unbounded).

    A blocking command (BLPOP) must return before the socket times out, so
    waits are cut into slices shorter than this.
    """
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    value = kwargs.get("socket_timeout")
    return float(value) if value else None
