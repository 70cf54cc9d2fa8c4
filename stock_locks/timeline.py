"""What the dashboard charts read: per-second figures of the whole deployment.

Every process adds what it recorded (stock_locks.metrics) to buckets in Redis,
one per second of the Redis server's clock, so the figures of all web
processes and workers add up and one clock orders them. ``recent()`` reads the
last minutes back as a :class:`Timeline`.

Series names (``SERIES_*``): ``reservations:<strategy>`` and
``refusals:<strategy>`` (count per second), ``lock_wait_p99_ms`` and
``delay_lag_p99_ms`` (99th percentile over the second, milliseconds, from
merged histograms) and ``dead_letters`` (count per second).
"""

from __future__ import annotations

from dataclasses import dataclass, field

RESERVATIONS = "reservations:"  # + strategy name
REFUSALS = "refusals:"  # + strategy name
LOCK_WAIT_P99_MS = "lock_wait_p99_ms"
DELAY_LAG_P99_MS = "delay_lag_p99_ms"
DEAD_LETTERS = "dead_letters"


@dataclass(frozen=True)
class Timeline:
    """Figures per bucket of ``step`` seconds from ``start`` (Unix seconds, Redis clock).

    ``series`` maps a series name to one value per bucket, oldest first, all of
    the same length; a bucket with nothing recorded is 0 for counts and None for
    percentiles.
    """

    start: int
    step: int
    series: dict[str, list[float | None]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return max((len(values) for values in self.series.values()), default=0)

    def names(self, prefix: str) -> list[str]:
        """Series names starting with ``prefix``, sorted (e.g. every strategy's reservations)."""
        return sorted(name for name in self.series if name.startswith(prefix))
