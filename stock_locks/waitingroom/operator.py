"""The operator's view of the waiting rooms: one row of figures per event, for the
admin dashboard and the Prometheus scrape."""

from __future__ import annotations

import time
from typing import Any

from ..models import Event
from .queue import WaitingRoom
from .spec import spec_of

ROOMS_SHOWN = 20  # events listed, the latest start first


def room_rows(limit: int = ROOMS_SHOWN) -> list[dict[str, Any]]:
    """Each event's room now: its state ("off", "not started", "open", "sold out"),
    visitors waiting (an upper bound) and pre-queued, admitted now (of ``max_active``),
    admitted per second, admitted in all, abandoned (waiting and admitted) and left.

    Blocking: one database query, one round trip per event. Raises
    :class:`~stock_locks.exceptions.RedisUnavailable`.
    """
    return [_row(event) for event in Event.objects.order_by("-start")[:limit]]


def room_row(slug: str) -> dict[str, Any] | None:
    """The :func:`room_rows` row of the event ``slug``, or None when there is none.
    Blocking as :func:`room_rows` for one event."""
    event = Event.objects.filter(slug=slug).first()
    return None if event is None else _row(event)


def clear_room(slug: str) -> dict[str, Any] | None:
    """Forget the Redis state of the event ``slug``'s room (every place, admission
    slot and figure: :meth:`WaitingRoom.clear`), after the sale; its row as it was just
    before, or None when no event has that slug (nothing cleared). A pass handed out
    before goes through until its next renewal (at most ``WAITING_ROOM_PASS_REFRESH``
    seconds), which Redis then refuses; a web process that saw the room holds
    admission for one pass refresh, as after a lost state.

    Blocking: one database query, two round trips. Raises
    :class:`~stock_locks.exceptions.RedisUnavailable`.
    """
    event = Event.objects.filter(slug=slug).first()
    if event is None:
        return None
    row = _row(event)
    WaitingRoom(spec_of(event)).clear()
    return row


def _row(event: Event) -> dict[str, Any]:
    spec = spec_of(event)
    stats = WaitingRoom(spec).stats()
    if not spec.enabled:
        state = "off"
    elif time.time() * 1000 < spec.start_ms:
        state = "not started"
    else:
        state = "sold out" if stats.sold_out else "open"
    return {
        "slug": spec.slug, "name": event.name, "state": state,
        "start": event.start.isoformat(), "waiting": stats.waiting,
        "prequeued": stats.prequeued, "admitted": stats.admitted,
        "max_active": spec.max_active, "admitted_per_second": stats.admitted_per_second,
        "admitted_total": stats.admitted_total,
        "abandoned": stats.abandoned_waiting + stats.abandoned_admitted,
        "left": stats.left,
    }  # fmt: skip


GAUGES = (
    ("waiting", "Visitors waiting in a waiting room (an upper bound)."),
    ("prequeued", "Visitors queued before the sale's start."),
    ("admitted", "Visitors admitted and holding a slot now."),
    ("admitted_per_second", "Admissions per second over the last 10 to 20 seconds."),
    ("admitted_total", "Visitors admitted since the room's state was made."),
    ("abandoned", "Visitors who lost their place or slot by going silent."),
)


def prometheus_gauges(rows: list[dict[str, Any]]) -> str:
    """``rows`` (:func:`room_rows`) as Prometheus gauges labelled by event, and
    ``stock_locks_waiting_room_sold_out`` (1 while the room is closed by sold out)."""
    lines = []
    for name, text in (*GAUGES, ("sold_out", "1 while the sale's SKUs are sold out.")):
        metric = f"stock_locks_waiting_room_{name}"
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge"]
        for row in rows:
            value = int(row["state"] == "sold out") if name == "sold_out" else row[name]
            lines.append(f'{metric}{{event="{row["slug"]}"}} {value:g}')
    return "\n".join(lines) + "\n"
