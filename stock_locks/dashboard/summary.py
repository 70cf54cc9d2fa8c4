"""The dashboard's first lines: the sale and the machinery at a glance.

:func:`summary` gathers what the other sections already read (the timeline, the
held locks, the semaphores, the delay queues, the stock) into the figures an
operator looks at first: units reserved per second and in the window (and
paid, from the database), refusals,
errors by type, held locks, semaphore use, the delay queues' due items and
the age of the oldest, the drifting SKUs, and a heartbeat per process
(:func:`heartbeats`). The JSON endpoint serves it as ``summary``, the
Prometheus endpoint as gauges (:func:`prometheus_gauges`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..conf import settings
from ..keys import heartbeats_key
from ..metrics import ERROR_TYPES, ROLES
from . import timeline as tl

SILENT_AFTER = 10.0  # seconds without a heartbeat before a web, worker or beat process is silent
FORGET_AFTER = 3600  # seconds after which a silent process's heartbeat is removed


def heartbeats(client: Any, now_ms: int) -> list[dict[str, Any]]:
    """Every process seen in the last ``FORGET_AFTER`` seconds, by role then host and
    pid: role, host, pid, last seen (ISO), seconds since, and ``alive``: seen within
    ``SILENT_AFTER`` (a drainer: within three delay-queue intervals, as beat sends
    the drain task once per interval). Older entries are removed."""
    key = heartbeats_key()
    rows: list[dict[str, Any]] = []
    forgotten: list[str] = []
    for field, value in client.hgetall(key).items():
        field = field.decode() if isinstance(field, bytes) else field
        role, _, rest = field.partition("|")
        host, _, pid = rest.rpartition("|")
        age = max(0.0, (now_ms - int(value)) / 1000)
        if age > FORGET_AFTER:
            forgotten.append(field)
            continue
        silent_after = (
            max(SILENT_AFTER, 3 * settings.DELAY_QUEUE_INTERVAL)
            if role == "drainer"
            else SILENT_AFTER
        )
        seen = dt.datetime.fromtimestamp(int(value) / 1000, tz=dt.UTC)
        rows.append(
            {
                "role": role,
                "host": host,
                "pid": pid,
                "last_seen": seen.isoformat(),
                "age": round(age, 1),
                "alive": age <= silent_after,
            }
        )
    if forgotten:
        client.hdel(key, *forgotten)
    order = {role: i for i, role in enumerate(ROLES)}
    rows.sort(key=lambda row: (order.get(row["role"], len(order)), row["host"], row["pid"]))
    return rows


def summary(
    timeline: tl.Timeline,
    *,
    held_locks: int,
    semaphores: list[dict[str, Any]],
    queues: list[dict[str, Any]],
    stock: dict[str, Any],
    processes: list[dict[str, Any]],
) -> dict[str, Any]:
    """The summary strip's figures, JSON-ready (see the module's docstring).

    Rates are per second over the last complete ten seconds; totals are over the
    timeline's window (``window`` seconds).
    """
    sold = timeline.names(tl.RESERVATIONS)
    refused = timeline.names(tl.REFUSALS)
    due_ages = [q["oldest_due_age"] for q in queues if q.get("oldest_due_age") is not None]
    by_role: dict[str, dict[str, int]] = {}
    for process in processes:
        counts = by_role.setdefault(process["role"], {"alive": 0, "silent": 0})
        counts["alive" if process["alive"] else "silent"] += 1
    return {
        "window": timeline.length * timeline.step,
        "units_per_second": round(timeline.rate_now(tl.UNITS), 1),
        "units": int(timeline.totals.get(tl.UNITS, 0)),
        "reservations": int(sum(timeline.totals.get(name, 0) for name in sold)),
        "paid": stock.get("paid", 0),
        "refused_per_second": round(sum(timeline.rate_now(name) for name in refused), 1),
        "refused": int(sum(timeline.totals.get(name, 0) for name in refused)),
        "errors": {kind: int(timeline.totals.get(tl.ERRORS + kind, 0)) for kind in ERROR_TYPES},
        "held_locks": held_locks,
        "semaphores": {
            "held": sum(len(sem["holders"]) for sem in semaphores),
            "limit": sum(sem["limit"] or 0 for sem in semaphores),
            "waiting": sum(sem["waiting"] or 0 for sem in semaphores),
        },
        "delay": {
            "due": sum(q["due_now"] for q in queues),
            "oldest_due_age": max(due_ages) if due_ages else None,
            "dead": sum(q["dead"] for q in queues),
        },
        "drifting": stock["drifting"],
        "processes": by_role,
    }


def prometheus_gauges(figures: dict[str, Any], processes: list[dict[str, Any]]) -> str:
    """The summary's deployment-wide figures as Prometheus gauges (text format).

    Every process's scrape answers the same values (they are read from Redis and
    the database, not counted here): aggregate them with ``max``, not ``sum``.
    The per-process counters (``stock_locks_reservations_total`` and the others)
    are the rates' source.
    """
    delay, sems = figures["delay"], figures["semaphores"]
    gauges = [
        ("held_locks", "Locks held now (the held-locks index).", figures["held_locks"]),
        ("semaphore_permits_held", "Semaphore permits held now.", sems["held"]),
        ("semaphore_waiting", "Callers waiting for a semaphore permit.", sems["waiting"]),
        ("delay_due", "Delay-queue items due and not yet claimed.", delay["due"]),
        ("delay_oldest_due_seconds", "How long the oldest due delay-queue item has waited.",
         delay["oldest_due_age"] or 0),
        ("delay_dead", "Delay-queue items in the dead-letter sets.", delay["dead"]),
        ("stock_drifting_skus", "SKUs whose Redis counter differs from the database.",
         figures["drifting"]),
    ]  # fmt: skip
    lines = []
    for name, text, value in gauges:
        lines += [f"# HELP stock_locks_{name} {text}", f"# TYPE stock_locks_{name} gauge",
                  f"stock_locks_{name} {value:g}"]  # fmt: skip
    lines += [
        "# HELP stock_locks_heartbeat_age_seconds Seconds since a process was last seen.",
        "# TYPE stock_locks_heartbeat_age_seconds gauge",
    ]
    for process in processes:
        labels = ",".join(
            f'{name}="{_escaped(str(process[name]))}"' for name in ("role", "host", "pid")
        )
        lines.append(f"stock_locks_heartbeat_age_seconds{{{labels}}} {process['age']:g}")
    return "\n".join(lines) + "\n"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
