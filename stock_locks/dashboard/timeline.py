"""What the dashboard charts read: per-second figures of the whole deployment.

Every process adds what it recorded to buckets in Redis, one per second of the
Redis server's clock and one per ten seconds (:func:`stock_locks.metrics.flush`),
so the figures of all web processes and workers add up and one clock orders
them. :func:`recent` reads the last minutes back as a :class:`Timeline`: up to
five minutes a bucket per second, up to an hour one per ten seconds.

Series names: ``reservations:<strategy>``, ``units`` (reserved, every strategy),
``refusals:<strategy>``,
``errors:<type>`` and ``dead_letters`` (per second, averaged over the bucket),
``lock_wait_p99_ms`` and ``delay_lag_p99_ms`` (99th percentile over the bucket,
milliseconds, from merged histograms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..backends.redis.client import get_redis
from ..keys import timeline_key
from ..metrics import COARSE_KEEP, DEAD_LETTERS, ERRORS, REFUSALS, RESERVATIONS, UNITS

__all__ = [
    "DEAD_LETTERS", "ERRORS", "REFUSALS", "RESERVATIONS", "UNITS", "Timeline", "percentile",
    "recent",
]  # fmt: skip

FINE_SECONDS = 300  # windows up to this long are read a second per bucket, longer ten
LONGEST = COARSE_KEEP - 60  # the longest window the ten-second buckets still cover

LOCK_WAIT_P99_MS = "lock_wait_p99_ms"
DELAY_LAG_P99_MS = "delay_lag_p99_ms"
# Histogram fields in a bucket: "<name>|<upper bound in ms or inf>" -> count.
_PERCENTILES = {"lock_wait_ms": LOCK_WAIT_P99_MS, "delay_lag_ms": DELAY_LAG_P99_MS}


@dataclass(frozen=True)
class Timeline:
    """Figures per bucket of ``step`` seconds from ``start`` (Unix seconds, Redis clock).

    ``series`` maps a series name to one value per bucket, oldest first, all of
    the same length; counts are per second, a bucket with nothing recorded is 0
    for counts and None for percentiles.
    """

    start: int
    step: int
    series: dict[str, list[float | None]] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)  # count series: sum over the window
    now_ms: int = 0  # the Redis clock when read

    def rate_now(self, name: str) -> float:
        """Per second over the last complete ten seconds (0 when not recorded)."""
        values = self.series.get(name) or []
        recent = values[-11:-1] if self.step == 1 else values[-2:-1]
        return sum(v or 0.0 for v in recent) / max(1, len(recent))

    @property
    def length(self) -> int:
        return max((len(values) for values in self.series.values()), default=0)

    def names(self, prefix: str) -> list[str]:
        """Series names starting with ``prefix``, sorted (e.g. every strategy's reservations)."""
        return sorted(name for name in self.series if name.startswith(prefix))


def recent(seconds: int = 300, client: Any = None) -> Timeline:
    """The last ``seconds`` seconds (Redis clock, this one included; at most
    ``LONGEST``), summed over every process: one bucket per second up to
    ``FINE_SECONDS``, else per ten seconds (the last one's rate over its seconds
    so far). Two round trips (TIME, then one pipeline)."""
    client = client or get_redis()
    seconds = max(1, min(seconds, LONGEST))
    seconds_now, micros = client.time()
    now = int(seconds_now)
    base = timeline_key()
    if seconds <= FINE_SECONDS:
        step, first, last, head = 1, now - seconds + 1, now, f"{base}:"
    else:
        step, last, head = 10, now // 10, f"{base}:10s:"
        first = last - -(-seconds // 10) + 1
    count = last - first + 1
    with client.pipeline(transaction=False) as pipe:
        for bucket in range(first, last + 1):
            pipe.hgetall(f"{head}{bucket}")
        buckets = pipe.execute()
    series: dict[str, list[float | None]] = {DEAD_LETTERS: [0.0] * count}
    totals: dict[str, float] = {}
    for name in _PERCENTILES.values():
        series[name] = [None] * count
    for i, raw in enumerate(buckets):
        # The last ten-second bucket has seen only part of its seconds so far.
        per = now % 10 + 1 if step == 10 and i == count - 1 else step
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
                series[name] = [0.0] * count
            series[name][i] = amount / per
            totals[name] = totals.get(name, 0.0) + amount
        for head, counts in histograms.items():
            series[_PERCENTILES[head]][i] = percentile(counts, 0.99)
    return Timeline(
        start=first * step, step=step, series=series, totals=totals,
        now_ms=now * 1000 + int(micros) // 1000,
    )  # fmt: skip


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
