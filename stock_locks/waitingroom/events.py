"""Waiting rooms by event slug, from the :class:`~stock_locks.models.Event` rows.

A process keeps each event's room for ``WAITING_ROOM_EVENT_CACHE`` seconds, so a
waiting visitor's poll costs no database query; an edit in the admin reaches every
process within that time.
"""

from __future__ import annotations

import threading
import time

from ..conf import settings
from ..exceptions import UnknownEvent
from ..models import Event
from .queue import WaitingRoom
from .spec import spec_of

_rooms: dict[str, tuple[WaitingRoom, float]] = {}  # slug -> (room, read at)
_lock = threading.Lock()


def room_for(slug: str) -> WaitingRoom:
    """The waiting room of the event ``slug`` (an enabled one or not: see
    ``room.spec.enabled``). Blocking: one database query when this process's copy is
    older than ``WAITING_ROOM_EVENT_CACHE``. Raises
    :class:`~stock_locks.exceptions.UnknownEvent` when no event has that slug."""
    now = time.monotonic()
    held = _rooms.get(slug)
    if held is not None and now - held[1] < settings.WAITING_ROOM_EVENT_CACHE:
        return held[0]
    event = Event.objects.filter(slug=slug).first()
    if event is None:
        raise UnknownEvent(f"no waiting-room event has the slug {slug!r}", event=slug)
    room = WaitingRoom(spec_of(event))
    with _lock:
        _rooms[slug] = (room, now)
    return room


def forget() -> None:
    """Read every event again on its next use (tests; after editing events in code)."""
    with _lock:
        _rooms.clear()
