"""What the admin dashboard shows, read from Redis and the database (no HTTP here).

Everything is found with SCAN (a page of ``SCAN_COUNT`` keys per call, never
KEYS), so the page stays quick with many thousands of locks held: all lock
names are listed, sorted, and only one page of them is read in detail, in one
pipelined round trip. Values are JSON-ready (times as ISO 8601 strings,
durations in seconds).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from .conf import settings
from .connection import get_redis
from .delayqueue import DelayQueue
from .keys import lock_keys, lock_scan_pattern, semaphore_scan_pattern
from .semaphores import semaphore_state

SCAN_COUNT = 1000  # keys Redis looks at per SCAN call
PAGE_SIZE = 100  # locks (and semaphores) read in detail per page
DEAD_LETTERS_SHOWN = 20
STOCK_ROWS_SHOWN = 200
TOKEN_SHOWN = 8  # characters of a holder's token the page shows


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _iso_ms(ms: Any) -> str | None:
    if ms in (None, b"", ""):
        return None
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.UTC).isoformat()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _scan_names(client: Any, pattern: str, head: str) -> list[str]:
    names = set()
    for key in client.scan_iter(match=pattern, count=SCAN_COUNT):
        key = _text(key)
        if key.startswith(head) and key.endswith("}"):
            names.add(key[len(head) : -1])
    return sorted(names)


def lock_page(search: str = "", page: int = 1, client: Any = None) -> dict[str, Any]:
    """Held locks whose name contains ``search``: the total and one page, by name."""
    client = client or get_redis()
    pattern = lock_scan_pattern()
    if search:
        pattern = pattern[:-2] + f"*{_glob_escape(search)}*" + "}"
    names = _scan_names(client, pattern, lock_scan_pattern()[:-2])
    page = max(1, page)
    shown = names[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    pipe = client.pipeline(transaction=False)
    for name in shown:
        keys = lock_keys(name)
        pipe.hgetall(keys.holder)
        pipe.pttl(keys.lock)
    replies = pipe.execute()
    rows = []
    for name, holder, pttl in zip(shown, replies[::2], replies[1::2], strict=True):
        if pttl == -2:
            continue  # released between SCAN and now
        info = {_text(k): _text(v) for k, v in holder.items()}
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
    keys = lock_keys(name)
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.lock)
    pipe.hgetall(keys.holder)
    pipe.pttl(keys.lock)
    token, holder, pttl = pipe.execute()
    if token is None:
        return None
    info = {_text(k): _text(v) for k, v in holder.items()}
    info["token"] = _text(token)
    info["lease_remaining"] = None if pttl < 0 else pttl / 1000
    info["acquired_at"] = _iso_ms(info.get("acquired_at"))
    return info


def semaphores(client: Any = None) -> list[dict[str, Any]]:
    """Every semaphore with live holders: name, limit, holders with remaining lease."""
    client = client or get_redis()
    head = semaphore_scan_pattern()[:-2]
    rows = []
    for name in _scan_names(client, semaphore_scan_pattern(), head)[:PAGE_SIZE]:
        state = semaphore_state(name, redis=client)
        holders = [
            {
                **holder,
                "pid": None if holder.get("pid") is None else str(holder["pid"]),
                "acquired_at": _iso_seconds(holder.get("acquired_at")),
            }
            for holder in state["holders"]
        ]
        rows.append(
            {"name": name, "limit": state["limit"], "holders": holders, "waiting": state["waiting"]}
        )
    return rows


def _iso_seconds(seconds: float | None) -> str | None:
    return None if seconds is None else _iso_ms(int(seconds * 1000))


def delay_queues(client: Any = None) -> list[dict[str, Any]]:
    """Stats and the oldest dead letters of each configured or discovered queue."""
    client = client or get_redis()
    names = set(settings.DELAY_QUEUES)
    head = f"{settings.KEY_PREFIX}:dq:{{"
    for key in client.scan_iter(match=f"{head}*}}:items", count=SCAN_COUNT):
        key = _text(key)
        names.add(key[len(head) : -len("}:items")])
    rows = []
    for name in sorted(names):
        queue = DelayQueue(name, redis=client)
        stats = queue.stats()
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
    from .stock.reconcile import stock_report

    report = stock_report()
    report.sort(key=lambda row: (row.drift == 0, row.sku))
    return {
        "configured": True,
        "total": len(report),
        "drifting": sum(1 for row in report if row.drift),
        "rows": [row.as_dict() for row in report[:STOCK_ROWS_SHOWN]],
    }


def snapshot(lock_search: str = "", lock_page_number: int = 1) -> dict[str, Any]:
    """The whole dashboard as one JSON-ready dict."""
    client = get_redis()
    return {
        "generated_at": timezone.now().isoformat(),
        "locks": lock_page(lock_search, lock_page_number, client),
        "semaphores": semaphores(client),
        "delay_queues": delay_queues(client),
        "stock": stock(),
    }
