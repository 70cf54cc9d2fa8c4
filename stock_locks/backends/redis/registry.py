"""Registries: which semaphores and delay queues are in use, read without walking the keyspace.

One sorted set per kind (``stock_locks.keys.registry_key``): name -> when it was
last used (ms, Redis clock). A semaphore is registered when it grants a permit or
a holder refreshes one, a delay queue when an item is scheduled or a claim runs:
by a script of its own (``registry_touch.lua``), after the operation, not inside
the hot scripts, and at most once per :data:`REGISTRY_PERIOD` per process, name
and backend (each process remembers when it registered what). The same script
drops the names unused for :data:`REGISTRY_RETENTION`, and the registry expires
that long after its last registration.

The admin page reads the most recently used names (``registry_read.lua``, one
round trip): what that costs grows with the names in use, not with the keyspace.
It is one key per kind, so it works unchanged on a Redis Cluster.

A registration that fails is logged (DEBUG, ``stock_locks.registry``) and
dropped: the grant or schedule before it has happened, and the next use after
the period registers the name again. When Redis loses its data, the names come
back as they are used (each process within a period); :func:`forget` makes this
process register everything again at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from weakref import WeakKeyDictionary

from ... import scripts
from ...keys import registry_key
from .protocol import decoded
from .requests import Requests, script

REGISTRY_PERIOD = 60.0  # seconds between two registrations of one name by one process
REGISTRY_RETENTION = 86400  # seconds a name stays listed after its last registration

log = logging.getLogger("stock_locks.registry")

# backend -> {(kind, name): when this process last registered it, time.monotonic()}
_registered: WeakKeyDictionary[Any, dict[tuple[str, str], float]] = WeakKeyDictionary()


def register(backend: Any, kind: str, name: str) -> Requests[None]:
    """Register ``name`` in the ``kind`` registry of ``backend``'s Redis, unless this
    process did within :data:`REGISTRY_PERIOD`. Never raises an ``Exception``: a
    registration that fails is logged at DEBUG and left to the next use."""
    now = time.monotonic()
    seen = _registered.get(backend)
    if seen is None:
        seen = _registered.setdefault(backend, {})
    last = seen.get((kind, name))
    if last is not None and now - last < REGISTRY_PERIOD:
        return
    seen[(kind, name)] = now
    argv = (name, int(REGISTRY_RETENTION * 1000))
    try:
        yield from script(scripts.REGISTRY_TOUCH, (registry_key(kind),), argv)
    except Exception as exc:  # the operation before it happened: only the listing misses it
        log.debug("%s %r: not registered (the next use after %gs will): %s: %s",
                  kind, name, REGISTRY_PERIOD, type(exc).__name__, exc)  # fmt: skip


def recent(kind: str, limit: int) -> Requests[list[str]]:
    """The names of the ``kind`` registry used within :data:`REGISTRY_RETENTION`, most
    recently used first, at most ``limit``; one round trip."""
    argv = (int(REGISTRY_RETENTION * 1000), limit)
    reply = yield from script(scripts.REGISTRY_READ, (registry_key(kind),), argv)
    return [str(decoded(name)) for name in reply]


def forget() -> None:
    """Forget what this process registered, so that every name is registered again at its
    next use (after Redis lost its data, e.g. a test's FLUSHALL)."""
    _registered.clear()
