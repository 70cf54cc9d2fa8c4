"""The Redis client stock_locks talks to: django-redis's, by alias."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from .conf import settings

if TYPE_CHECKING:
    from redis import Redis

DEFAULT_SOCKET_TIMEOUT = 5.0  # seconds, redis-py's own default


def get_redis(alias: str | None = None) -> Redis:
    """The raw redis-py client behind the django-redis cache ``alias``.

    ``alias`` defaults to ``STOCK_LOCKS["REDIS_ALIAS"]``. Raises
    ``NotImplementedError`` when that cache is not a django-redis backend and
    ``django.core.cache.InvalidCacheBackendError`` when it does not exist.
    """
    from django_redis import get_redis_connection

    return get_redis_connection(alias or settings.REDIS_ALIAS)


_caps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def blocking_cap(client: object) -> float | None:
    """The client's socket timeout in seconds (None when unbounded).

    A blocking command (BLPOP) must return before the socket times out, so
    waits are cut into slices shorter than this. The value is what the pool's
    connections really get (redis-py may default it without listing it in
    ``connection_kwargs``), read once per pool without connecting.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return DEFAULT_SOCKET_TIMEOUT
    try:
        return _caps[pool]
    except KeyError:
        pass
    try:
        value = pool.connection_class(**pool.connection_kwargs).socket_timeout
    except Exception:  # an exotic pool: assume the usual default
        value = DEFAULT_SOCKET_TIMEOUT
    _caps[pool] = float(value) if value else None
    return _caps[pool]
