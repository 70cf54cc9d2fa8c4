"""Backends by alias, configured like Django's ``CACHES``::

    STOCK_LOCKS = {
        "BACKENDS": {
            "default": {  # optional: without it, the Redis of REDIS_ALIAS
                "BACKEND": "stock_locks.backends.redis.RedisBackend",
                "OPTIONS": {"CACHE_ALIAS": "stock_locks"},
            },
            "redlock": {
                "BACKEND": "stock_locks.backends.redlock.RedLockBackend",
                "LOCATION": ["redis://a:6379/0", "redis://b:6379/0", "redis://c:6379/0"],
            },
        },
    }

``get_backend(alias)`` returns one backend object per alias and process,
made on first use and dropped when the settings change. ``"default"`` is
always there: unless configured, it is a
:class:`~stock_locks.backends.redis.RedisBackend` on the django-redis client of
``STOCK_LOCKS["REDIS_ALIAS"]``.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from ..conf import settings
from .base import Backend

DEFAULT_ALIAS = "default"
DEFAULT_BACKEND = "stock_locks.backends.redis.RedisBackend"

_backends: dict[str, Backend] = {}
_lock = threading.Lock()


def backend_config(alias: str) -> dict[str, Any]:
    """The ``BACKENDS`` entry of ``alias`` (the implicit default's when not configured).

    Raises ImproperlyConfigured for an unknown alias or a malformed entry.
    """
    configured = settings.BACKENDS or {}
    if not isinstance(configured, dict):
        raise ImproperlyConfigured('STOCK_LOCKS["BACKENDS"] must be a dict of aliases')
    if alias not in configured:
        if alias == DEFAULT_ALIAS:
            return {"BACKEND": DEFAULT_BACKEND}
        raise ImproperlyConfigured(
            f"stock_locks backend {alias!r} is not in STOCK_LOCKS['BACKENDS'] "
            f"(configured: {sorted(configured) or 'none'})"
        )
    entry = configured[alias]
    if not isinstance(entry, dict) or "BACKEND" not in entry:
        raise ImproperlyConfigured(
            f"STOCK_LOCKS['BACKENDS'][{alias!r}] must be a dict with a 'BACKEND' dotted path"
        )
    return entry


def aliases() -> list[str]:
    """Every configured alias, ``"default"`` first."""
    return [DEFAULT_ALIAS, *sorted(set(settings.BACKENDS or {}) - {DEFAULT_ALIAS})]


def get_backend(alias: str | None = None) -> Backend:
    """The backend of ``alias`` (default ``"default"``), made once per process."""
    alias = alias or DEFAULT_ALIAS
    backend = _backends.get(alias)
    if backend is not None:
        return backend
    with _lock:
        backend = _backends.get(alias)
        if backend is None:
            entry = backend_config(alias)
            cls = import_string(entry["BACKEND"])
            backend = cls(alias, location=entry.get("LOCATION"), options=entry.get("OPTIONS"))
            _backends[alias] = backend
    return backend


def resolve(backend: Backend | str | None) -> Backend:
    """A backend argument (an alias, a backend, or None for the default) as a backend."""
    if isinstance(backend, Backend):
        return backend
    if backend is not None and not isinstance(backend, str):
        raise ImproperlyConfigured(f"backend must be an alias or a Backend, got {backend!r}")
    return get_backend(backend)


def reset() -> None:
    """Forget every backend (closing the clients they opened themselves)."""
    with _lock:
        backends = list(_backends.values())
        _backends.clear()
    for backend in backends:
        backend.close()


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("STOCK_LOCKS", "CACHES"):
        reset()


setting_changed.connect(_on_setting_changed)
