"""Which semaphores and delay queues are in use, so the dashboard lists them without
SCAN (whose cost grows with the keyspace: at 400k keys one refresh took 737 ms).

Each kind has a registry in Redis (:func:`stock_locks.keys.registry_key`): a sorted
set of names scored by when they were last noted in use, on the Redis clock. A
process notes a name when it uses it (a semaphore acquire, a delay-queue
schedule), outside the hot scripts and at most once per ``PERIOD`` per name, so the
cost is one small script per name per minute per process. Names unused for
``RETENTION`` drop out when the next one is noted.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ... import scripts
from ...keys import registry_key
from .errors import REDIS_OR_OS_ERRORS

log = logging.getLogger("stock_locks.registry")

PERIOD = 60.0  # seconds between two notes of one name by one process
RETENTION = 86400  # seconds an unused name stays listed

SEMAPHORES, DELAY_QUEUES = "semaphores", "delay_queues"

_noted: dict[tuple[str, str], float] = {}  # (kind, name) -> monotonic time of its last note
_lock = threading.Lock()


def _due(kind: str, name: str) -> bool:
    now = time.monotonic()
    with _lock:
        last = _noted.get((kind, name))
        if last is not None and now - last < PERIOD:
            return False
        _noted[(kind, name)] = now
        return True


def note_use(client: Any, kind: str, name: str) -> None:
    """Note that ``name`` of ``kind`` is in use now, unless this process did in the last
    ``PERIOD`` seconds. Never raises: what it follows has happened; a note that could
    not be written is logged and tried again at the next use."""
    if not _due(kind, name):
        return
    try:
        # EVAL, not EVALSHA: as rare as the metrics flush, and out of the hot path's figures.
        client.eval(scripts.REGISTRY_TOUCH.script, 1, registry_key(kind), name, RETENTION * 1000)
    except REDIS_OR_OS_ERRORS as exc:
        with _lock:
            _noted.pop((kind, name), None)
        log.debug("%s %r not noted in the registry (%s); next use tries again", kind, name, exc)


def names_in_use(client: Any, kind: str, limit: int) -> list[str]:
    """The names of ``kind`` noted in use within ``RETENTION``, the most recent first, at
    most ``limit``. Two round trips (TIME, then the read); their cost follows the
    names, not the keyspace."""
    seconds, micros = client.time()
    oldest = int(seconds) * 1000 + int(micros) // 1000 - RETENTION * 1000
    raw = client.zrevrangebyscore(registry_key(kind), "+inf", oldest, start=0, num=limit)
    return [name.decode() if isinstance(name, bytes) else name for name in raw]


def forget_notes() -> None:
    """Forget what this process noted (tests: the next use notes again)."""
    with _lock:
        _noted.clear()
