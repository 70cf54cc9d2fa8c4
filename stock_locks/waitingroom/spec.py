"""What a waiting room needs to know of its sale event, frozen.

An :class:`~stock_locks.models.Event` row gives one (:func:`spec_of`); tests,
benchmarks and projects without the model build it directly. Durations are
seconds, instants aware datetimes; the scripts get milliseconds.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")
DEFAULT_LANES = ("members", "guests")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def epoch_ms(moment: dt.datetime | None) -> int:
    """``moment`` in ms since the epoch (None: the epoch itself, i.e. long past)."""
    if moment is None:
        return 0
    if moment.tzinfo is None:
        raise ValueError(f"waiting room times must be aware datetimes, got {moment!r}")
    return int((moment - EPOCH).total_seconds() * 1000)


@dataclass(frozen=True)
class RoomSpec:
    """One sale event's waiting room.

    ``slug``: the event's name in keys, cookies and URLs (letters, digits, ``-``, ``_``).
    ``start``: when admission begins; visitors arriving before it (from
    ``prequeue_opens``, None: any time) are shuffled once at the start.
    ``max_active``: most visitors admitted at once. ``admit_per_minute``: most
    admissions per minute (a token bucket holding one second's worth, at least one).
    ``stock_factor``: never more admitted at once than the units left times this.
    ``lanes``: lane names, highest priority first. ``skus``: the SKUs on sale (none:
    the room never closes for stock). ``queue_ttl``: seconds a waiting visitor keeps
    its place without polling; ``session_ttl``: seconds an admitted one keeps its slot
    without a request. ``enabled``: False lets every request through.
    """

    slug: str
    start: dt.datetime
    max_active: int
    admit_per_minute: int
    prequeue_opens: dt.datetime | None = None
    stock_factor: float = 1.0
    lanes: tuple[str, ...] = DEFAULT_LANES
    skus: tuple[str, ...] = ()
    queue_ttl: float = 60.0
    session_ttl: float = 600.0
    enabled: bool = True
    start_ms: int = field(init=False, repr=False, compare=False)
    opens_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.slug, str) or not SLUG.match(self.slug):
            raise ValueError(f"an event slug is letters, digits, '-' and '_', got {self.slug!r}")
        for name in ("max_active", "admit_per_minute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        lanes_ok = all(isinstance(lane, str) and lane for lane in self.lanes)
        if not self.lanes or not lanes_ok or len(set(self.lanes)) != len(self.lanes):
            raise ValueError(f"lanes must be distinct names, at least one: {self.lanes!r}")
        if not all(isinstance(sku, str) and sku for sku in self.skus):
            raise ValueError(f"skus must be SKU strings: {self.skus!r}")
        if not self.stock_factor > 0:
            raise ValueError(f"stock_factor must be above 0, got {self.stock_factor!r}")
        if not (self.queue_ttl > 0 and self.session_ttl > 0):
            raise ValueError("queue_ttl and session_ttl must be above 0 seconds")
        object.__setattr__(self, "lanes", tuple(self.lanes))
        object.__setattr__(self, "skus", tuple(self.skus))
        object.__setattr__(self, "start_ms", epoch_ms(self.start))
        opens = epoch_ms(self.prequeue_opens)
        object.__setattr__(self, "opens_ms", min(opens, self.start_ms))

    def lane_number(self, lane: str | None) -> int:
        """The 1-based number of ``lane`` (None: the last, the lowest priority).
        Raises ValueError for a name the event does not have."""
        if lane is None:
            return len(self.lanes)
        try:
            return self.lanes.index(lane) + 1
        except ValueError:
            raise ValueError(f"event {self.slug!r} has no lane {lane!r}: {self.lanes}") from None


def spec_of(event: Any) -> RoomSpec:
    """The :class:`RoomSpec` of an :class:`~stock_locks.models.Event` row."""
    return RoomSpec(
        slug=event.slug,
        start=event.start,
        prequeue_opens=event.prequeue_opens,
        max_active=event.max_active,
        admit_per_minute=event.admit_per_minute,
        stock_factor=event.stock_factor,
        lanes=tuple(event.lanes or DEFAULT_LANES),
        skus=tuple(event.skus or ()),
        queue_ttl=float(event.queue_ttl),
        session_ttl=float(event.session_ttl),
        enabled=event.enabled,
    )
