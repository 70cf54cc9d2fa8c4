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
from collections.abc import Callable, Mapping
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
from ..backends.redis.protocol import is_held, parse_record
from ..conf import settings
from ..core.lock import lock_backend
from ..core.semaphore import snapshot_of
from ..delayqueue import DelayQueue
from ..exceptions import BackendUnavailable
from ..holder import LockInfo
from ..keys import DELAY_QUEUES, SEMAPHORES, lock_keys, semaphore_keys
from ..metrics import CAPPED
from ..stock.caps import MODEL_CAP_PREFIX, configured_caps, top_buyers
from ..stock.progress import sold_since
from ..stock.reconcile import stock_report
from ..waitingroom.operator import room_rows
from .charts import dashboard_charts
from .summary import heartbeats, summary
from .timeline import Timeline, recent

PAGE_SIZE = 100  # locks (and semaphores, and delay queues) read in detail per page
DEAD_LETTERS_SHOWN = 20
STOCK_ROWS_SHOWN = 200
CHART_SECONDS = 300  # the charts' and the sold figures' window unless the page asks for another
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
        if not is_held(record) or pttl == -2:
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
    if not is_held(record):
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


# The stock table's orders: name -> (key of a row, descending). Drift first by default.
STOCK_ORDERS: dict[str, tuple[Callable[[dict[str, Any]], Any], bool]] = {
    "drift": (lambda row: (row["drift"] == 0, -row["taken"], row["sku"]), False),
    "sku": (lambda row: row["sku"], False),
    "sold": (lambda row: (row["sold"], row["reserved"]), True),
    "taken": (lambda row: row["taken"], True),
    "left": (lambda row: row["db"], False),
}


def stock(
    window: int = CHART_SECONDS, order: str = "drift", capped: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """Per SKU: the sale's progress over the last ``window`` seconds (``sold``: units
    of reservations paid in it; ``of``: sold + open reservations + left; ``taken``:
    the share sold or held, 0-1) beside database stock, Redis counter, open
    reservations, drift and the reserves refused by a purchase cap in the window
    (``capped``: SKU -> count, from the timeline); ordered by ``order`` (a key of
    ``STOCK_ORDERS``)."""
    if not settings.STOCK_MODEL:
        return {"configured": False, "total": 0, "drifting": 0, "paid": 0, "order": order,
                "rows": []}  # fmt: skip
    report = stock_report()
    sold = sold_since(timezone.now() - dt.timedelta(seconds=window))
    rows = []
    for line in report:
        row = line.as_dict()
        row["sold"] = sold.get(line.sku, 0)
        row["of"] = row["sold"] + line.reserved + line.db
        row["taken"] = round((row["sold"] + line.reserved) / row["of"], 4) if row["of"] else 0.0
        row["capped"] = int((capped or {}).get(line.sku, 0))
        rows.append(row)
    key, descending = STOCK_ORDERS.get(order, STOCK_ORDERS["drift"])
    rows.sort(key=key, reverse=descending)
    return {
        "configured": True,
        "total": len(rows),
        "drifting": sum(1 for row in rows if row["drift"]),
        "paid": sum(sold.values()),
        "order": order if order in STOCK_ORDERS else "drift",
        "rows": rows[:STOCK_ROWS_SHOWN],
    }


TOP_BUYERS = 5  # customers shown per cap
MODEL_CAPS_SHOWN = 20  # per-SKU caps of the stock model shown (their top buyers are a query each)


def purchase_caps() -> list[dict[str, Any]]:
    """Each configured cap: its SKUs, max per customer, window, and the customers
    holding the most units under it now (reservations holding stock)."""
    rows = []
    caps = list(configured_caps().values())
    per_sku = [cap for cap in caps if cap.name.startswith(MODEL_CAP_PREFIX)]
    if len(per_sku) > MODEL_CAPS_SHOWN:  # (a query each: the first ones, by name)
        hidden = {cap.name for cap in per_sku[MODEL_CAPS_SHOWN:]}
        caps = [cap for cap in caps if cap.name not in hidden]
    for cap in caps:
        window = "for ever"
        if cap.since and cap.period:
            window = f"{cap.period} s rolling, from {cap.since.isoformat()}"
        elif cap.period:
            window = f"{cap.period} s rolling"
        elif cap.since:
            window = f"from {cap.since.isoformat()}"
        buyers = [{"customer": c, "units": n} for c, n in top_buyers(cap, TOP_BUYERS)]
        rows.append({"name": cap.name, "skus": sorted(cap.skus), "max": cap.max,
                     "window": window, "top_buyers": buyers})  # fmt: skip
    return rows


def charts(timeline: Timeline) -> list[dict[str, Any]]:
    """The charts of ``timeline`` as {"id", "title", "svg"} (the SVG markup is safe to
    insert as it is)."""
    return [{"id": c.id, "title": c.title, "svg": c.svg} for c in dashboard_charts(timeline)]


def _capped(timeline: Timeline) -> dict[str, float]:
    """Reserves a purchase cap refused in the timeline's window, per SKU."""
    return {name[len(CAPPED) :]: n for name, n in timeline.totals.items()
            if name.startswith(CAPPED)}  # fmt: skip


def deployment_figures(window: int = 60) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary strip's figures and the processes' heartbeats, without what only
    the page shows (charts, lock details, ZooKeeper's locks, caps): what the Prometheus
    scrape serves. Raises :class:`~stock_locks.exceptions.RedisUnavailable`."""
    client = get_redis()
    with translated():
        timeline = recent(window, client)
        sems, queues = semaphores(client), delay_queues(client)
        processes = heartbeats(client, timeline.now_ms)
        figures = summary(
            timeline, held_locks=len(held_lock_names(client)), semaphores=sems, queues=queues,
            stock=stock(window, capped=_capped(timeline)), processes=processes,
        )  # fmt: skip
    return figures, processes


def snapshot(
    lock_search: str = "",
    lock_page_number: int = 1,
    window: int = CHART_SECONDS,
    stock_order: str = "drift",
) -> dict[str, Any]:
    """The whole dashboard as one JSON-ready dict: the summary strip, the charts
    and the sold figures over the last ``window`` seconds (at most an hour), the
    stock table in ``stock_order``, one page of the held locks matching
    ``lock_search``, and the other sections.

    Raises :class:`~stock_locks.exceptions.RedisUnavailable` when Redis did not
    answer (a ZooKeeper backend that does not answer is shown as such instead).
    """
    client = get_redis()
    with translated():
        timeline = recent(window, client)
        locks = lock_page(lock_search, lock_page_number, client)
        sems, queues = semaphores(client), delay_queues(client)
        stock_table = stock(window, stock_order, _capped(timeline))
        processes = heartbeats(client, timeline.now_ms)
        return {
            "generated_at": timezone.now().isoformat(),
            "summary": summary(
                timeline, held_locks=locks["total"], semaphores=sems, queues=queues,
                stock=stock_table, processes=processes,
            ),
            "processes": processes,
            "charts": charts(timeline),
            "locks": locks,
            "backend_locks": backend_locks(lock_search),
            "semaphores": sems,
            "delay_queues": queues,
            "stock": stock_table,
            "caps": purchase_caps(),
            "waiting_rooms": room_rows(),
        }  # fmt: skip
