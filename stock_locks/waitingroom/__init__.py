"""A flash-sale waiting room that knows the stock (docs/waitingroom.md).

    from stock_locks.waitingroom import waiting_room

    @waiting_room("kettle-sale")          # an Event row (the admin) with that slug
    def order(request): ...

Visitors queue in FIFO order per priority lane (one Redis list each), are
admitted by one Lua script per step within ``max_active``, ``admit_per_minute``
and the units left times a factor, carry a signed pass checked without Redis,
and are told "sold out" the moment the sale's SKUs are.
"""

from __future__ import annotations

from .events import room_for
from .gate import release_admission, status_view, waiting_room
from .passes import AdmissionPass, check_pass, issue_pass
from .queue import RoomStats, Status, WaitingRoom
from .spec import RoomSpec

__all__ = [
    "AdmissionPass",
    "RoomSpec",
    "RoomStats",
    "Status",
    "WaitingRoom",
    "check_pass",
    "issue_pass",
    "release_admission",
    "room_for",
    "status_view",
    "waiting_room",
]
