"""What the dashboard charts read: per-second figures of the whole deployment.

Every process adds what it recorded to buckets in Redis, one per second of the
Redis server's clock (:func:`stock_locks.metrics.flush`), so the figures of all
web processes and workers add up and one clock orders them. :func:`recent`
reads the last minutes back as a :class:`Timeline`.

Series names (``SERIES_*``): ``reservations:<strategy>`` and
``refusals:<strategy>`` (count per second), ``lock_wait_p99_ms`` and
``delay_lag_p99_ms`` (99th percentile over the second, milliseconds, from
merged histograms) and ``dead_letters`` (count per second).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..backends.redis.client import get_redis
from ..keys import timeline_key
from ..metrics import DEAD_LETTERS, REFUSALS, RESERVATIONS

__all__ = ["DEAD_LETTERS", "REFUSALS", "RESERVATIONS", "Timeline", "percentile", "recent"]

LOCK_WAIT_P99_MS = "lock_wait_p99_ms"
DELAY_LAG_P99_MS = "delay_lag_p99_ms"
# Histogram fields in a bucket: "<name>|<upper bound in ms or inf>" -> count.
_PERCENTILES = {"lock_wait_ms": LOCK_WAIT_P99_MS, "delay_lag_ms": DELAY_LAG_P99_MS}


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


def recent(seconds: int = 300, client: Any = None) -> Timeline:
    """The last ``seconds`` seconds (Redis clock, this one included), one bucket each,
    summed over every process. Two round trips (TIME, then one pipeline)."""
    client = client or get_redis()
    now = int(client.time()[0])
    start = now - seconds + 1
    base = timeline_key()
    with client.pipeline(transaction=False) as pipe:
        for second in range(start, now + 1):
            pipe.hgetall(f"{base}:{second}")
        buckets = pipe.execute()
    series: dict[str, list[float | None]] = {DEAD_LETTERS: [0.0] * seconds}
    for name in _PERCENTILES.values():
        series[name] = [None] * seconds
    for i, raw in enumerate(buckets):
        histograms: dict[str, list[tuple[float, float]]] = {}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            amount = float(value)
            head, sep, bound = name.partition("|")
            if sep and head in _PERCENTILES:
                upper = float("inf") if bound == "inf" else float(bound)
                histograms.setdefault(head, []).append((upper, amount))
                continue
            if name not in series:
                series[name] = [0.0] * seconds
            series[name][i] = amount
        for head, counts in histograms.items():
            series[_PERCENTILES[head]][i] = percentile(counts, 0.99)
    return Timeline(start=start, step=1, series=series)


def percentile(counts: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile ``q`` of
    ``counts`` ((upper bound, count) pairs); None when empty. The last finite bound
    stands for +Inf (a chart needs a number)."""
    counts = sorted(counts)
    total = sum(count for _, count in counts)
    if not total:
        return None
    finite = [bound for bound, _ in counts if bound != float("inf")]
    running = 0.0
    for bound, count in counts:
        running += count
        if running >= q * total:
            return bound if bound != float("inf") else (max(finite) if finite else None)
    return None
