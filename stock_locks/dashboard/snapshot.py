"""What the admin dashboard shows, read from Redis and the database (no HTTP here).

Held locks are read from the held-locks index the lock scripts keep (a sorted
set of names scored by lease end; ``stock_locks.backends.redis.held``), so listing them costs
what the held locks are, not what the keyspace is: all names are read in one
round trip, sorted, and only one page of them is read in detail, in one
pipelined round trip. Locks on a ZooKeeper backend alias are listed beside them,
one table per alias (:func:`backend_locks`). Semaphores and delay queues are
found in their registries (``stock_locks.backends.redis.registry``: the names
used within a day, most recent first), never by walking the keyspace; one page
of them is read in detail. Values are JSON-ready (times as ISO 8601 strings,
durations in seconds).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from ..backends import aliases, backend_config, get_backend
from ..backends.base import call
from ..backends.redis import registry
from ..backends.redis.backend import backend_for_client
from ..backends.redis.client import get_redis
from ..backends.redis.cluster import is_cluster
from ..backends.redis.errors import translated
from ..backends.redis.held import held_lock_names
from ..backends.redis.protocol import parse_record
from ..conf import settings
from ..core.lock import lock_backend
from ..core.semaphore import snapshot_of
from ..delayqueue import DelayQueue
from ..exceptions import BackendUnavailable
from ..holder import LockInfo
from ..keys import DELAY_QUEUES, SEMAPHORES, lock_keys, semaphore_keys
from ..stock.reconcile import stock_report
from .charts import dashboard_charts
from .timeline import recent

PAGE_SIZE = 100  # locks (and semaphores, and delay queues) read in detail per page
DEAD_LETTERS_SHOWN = 20
STOCK_ROWS_SHOWN = 200
TOKEN_SHOWN = 8  # characters of a holder's token the page shows


def _iso_ms(ms: Any) -> str | None:
    if ms in (None, b"", ""):
        return None
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.UTC).isoformat()


def lock_page(search: str = "", page: int = 1, client: Any = None) -> dict[str, Any]:
    """Held locks whose name contains ``search``: the total and one page, by name."""
    client = client or get_redis()
    names = held_lock_names(client)
    if search:
        names = [name for name in names if search in name]
    cluster = is_cluster(client)
    page = max(1, page)
    shown = names[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    pipe = client.pipeline(transaction=False)
    for name in shown:
        keys = lock_keys(name, cluster=cluster)
        pipe.get(keys.lock)
        pipe.pttl(keys.lock)
    replies = pipe.execute()
    rows = []
    for name, record, pttl in zip(shown, replies[::2], replies[1::2], strict=True):
        if record is None or pttl == -2:
            continue  # released between the index read and now
        info = parse_record(record)
        rows.append(
            {
                "name": name,
                "token": (info.get("token") or "")[:TOKEN_SHOWN],
                "fence": int(info["fence"]) if info.get("fence") else None,
                "count": int(info.get("count") or 1),
                "host": info.get("host"),
                "pid": info.get("pid"),
                "thread": info.get("thread"),
                "caller": info.get("caller"),
                "acquired_at": _iso_ms(info.get("acquired_at")),
                "lease_remaining": None if pttl < 0 else pttl / 1000,
                "watchdog": info.get("watchdog") == "1",
            }
        )
    return {"total": len(names), "page": page, "page_size": PAGE_SIZE, "rows": rows}


def lock_holder(name: str, client: Any = None) -> dict[str, Any] | None:
    """The full holder record of one lock (token included), or None when free."""
    client = client or get_redis()
    keys = lock_keys(name, cluster=is_cluster(client))
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.lock)
    pipe.pttl(keys.lock)
    record, pttl = pipe.execute()
    if record is None:
        return None
    info: dict[str, Any] = parse_record(record)
    info["lease_remaining"] = None if pttl < 0 else pttl / 1000
    info["acquired_at"] = _iso_ms(info.get("acquired_at"))
    return info


# Backends (besides the default Redis) whose held locks the page lists, one table each.
LISTED_BACKENDS = ("stock_locks.backends.zookeeper.ZooKeeperBackend",)


def backend_locks(search: str = "") -> list[dict[str, Any]]:
    """Held locks of every configured ZooKeeper backend, per alias: its holders with
    their metadata (first ``PAGE_SIZE`` names matching ``search``), or the error
    that kept it from answering (the rest of the page still renders)."""
    out = []
    for alias in aliases():
        if backend_config(alias)["BACKEND"] not in LISTED_BACKENDS:
            continue
        backend = get_backend(alias)
        ops = lock_backend(backend)
        entry: dict[str, Any] = {"alias": alias, "where": str(backend), "error": None}
        try:
            names = backend.execute(call(ops.held_lock_names))
            names = [name for name in names if search in name]
            shown = [(name, ops.lock_keys(name)) for name in names[:PAGE_SIZE]]
            infos = backend.execute(call(ops.inspect_many, shown)) if shown else []
        except BackendUnavailable as exc:
            out.append({**entry, "error": str(exc), "total": 0, "rows": []})
            continue
        rows = [_lock_row(info) for info in infos if info is not None]
        out.append({**entry, "total": len(names), "rows": rows})
    return out


def _lock_row(info: LockInfo) -> dict[str, Any]:
    """A :class:`LockInfo` as a row of a held-locks table (the token shortened)."""
    return {
        "name": info.name,
        "token": info.token[:TOKEN_SHOWN],
        "fence": info.fence,
        "count": info.count,
        "host": info.host,
        "pid": info.pid,
        "thread": info.thread,
        "caller": info.caller,
        "acquired_at": info.acquired_at.isoformat() if info.acquired_at else None,
        "lease_remaining": info.remaining,
        "watchdog": info.watchdog,
    }


def semaphores(client: Any = None) -> list[dict[str, Any]]:
    """The semaphores with live holders or waiters among the ``PAGE_SIZE`` most recently
    used (the registry), by name: name, limit, holders with remaining lease, waiting.
    Two round trips (one per master on a cluster for the second)."""
    client = client or get_redis()
    backend = backend_for_client(client)
    names = sorted(backend.run(registry.recent(SEMAPHORES, PAGE_SIZE)))
    if not names:
        return []
    states = backend.run(backend.semaphore_states([semaphore_keys(name) for name in names]))
    rows = []
    for name, state in zip(names, states, strict=True):
        found = snapshot_of(state)
        if not found["holders"] and not found["waiting"]:
            continue  # used lately, idle now
        holders = [
            {
                **holder,
                "pid": None if holder.get("pid") is None else str(holder["pid"]),
                "acquired_at": _iso_seconds(holder.get("acquired_at")),
            }
            for holder in found["holders"]
        ]
        rows.append(
            {"name": name, "limit": found["limit"], "holders": holders, "waiting": found["waiting"]}
        )
    return rows


def _iso_seconds(seconds: float | None) -> str | None:
    return None if seconds is None else _iso_ms(int(seconds * 1000))


def delay_queues(client: Any = None) -> list[dict[str, Any]]:
    """Stats and the oldest dead letters of each configured queue (``DELAY_QUEUES``) and
    of the ``PAGE_SIZE`` most recently used others (the registry) that hold items."""
    client = client or get_redis()
    configured = set(settings.DELAY_QUEUES)
    used = backend_for_client(client).run(registry.recent(DELAY_QUEUES, PAGE_SIZE))
    rows = []
    for name in sorted(configured.union(used)):
        queue = DelayQueue(name, redis=client)
        stats = queue.stats()
        held = stats["scheduled"] or stats["in_flight"] or stats["dead"]
        if not held and name not in configured:
            continue  # used lately, empty now
        stats["next_due"] = stats["next_due"].isoformat() if stats["next_due"] else None
        letters = queue.dead_letters(DEAD_LETTERS_SHOWN)
        for letter in letters:
            letter["died_at"] = letter["died_at"].isoformat()
        rows.append({**stats, "dead_letters": letters})
    return rows


def stock() -> dict[str, Any]:
    """Per SKU: database stock, Redis counter, open reservations and drift (drift first)."""
    if not settings.STOCK_MODEL:
        return {"configured": False, "total": 0, "drifting": 0, "rows": []}
    report = stock_report()
    report.sort(key=lambda row: (row.drift == 0, row.sku))
    return {
        "configured": True,
        "total": len(report),
        "drifting": sum(1 for row in report if row.drift),
        "rows": [row.as_dict() for row in report[:STOCK_ROWS_SHOWN]],
    }


CHART_SECONDS = 300  # the charts' window


def charts(client: Any = None) -> list[dict[str, Any]]:
    """The charts of the last CHART_SECONDS (one read of the timeline), as
    {"id", "title", "svg"} (the SVG markup is safe to insert as it is)."""
    drawn = dashboard_charts(recent(CHART_SECONDS, client))
    return [{"id": c.id, "title": c.title, "svg": c.svg} for c in drawn]


def snapshot(lock_search: str = "", lock_page_number: int = 1) -> dict[str, Any]:
    """The whole dashboard as one JSON-ready dict.

    Raises :class:`~stock_locks.exceptions.RedisUnavailable` when Redis did not
    answer (a ZooKeeper backend that does not answer is shown as such instead).
    """
    client = get_redis()
    with translated():
        return {
            "generated_at": timezone.now().isoformat(),
            "charts": charts(client),
            "locks": lock_page(lock_search, lock_page_number, client),
            "backend_locks": backend_locks(lock_search),
            "semaphores": semaphores(client),
            "delay_queues": delay_queues(client),
            "stock": stock(),
        }
