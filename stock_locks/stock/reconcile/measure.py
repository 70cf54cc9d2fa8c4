"""Measuring Redis counters against the database: per SKU, the database's quantity,
the counter, the units open and in flight, and the drift that remains.

The database is the system of record; a Redis counter should equal the
database's quantity once every request in flight has finished. While requests
are in flight the two legitimately differ, by what the measurement counts:

- a Redis record whose database row does not exist yet: Redis took its units,
  the database has not (``in_flight``, the counter is that much lower);
- a record whose row is RELEASED: the database put the units back, Redis not
  yet (the counter is that much lower);
- an open (RESERVED) row of a counter strategy with no record: the database
  took its units, Redis did not (Redis lost the record: the counter is that
  much higher).

Drift is what remains: ``counter - (db - in_flight)``. A SKU's counter and its
version (bumped by every script that moves it) are read before and after one
consistent database snapshot; a SKU whose counter moved in between is
reported as not settled rather than guessed at, so drift means drift.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import connections, router, transaction

from ...backends.redis.client import get_redis
from ...backends.redis.cluster import on_node
from ...backends.redis.protocol import decoded
from ...keys import StockKeys
from ...models import Reservation
from ..registry import counter_strategies
from ..table import StockTable

BATCH = 500  # keys per MGET / pipeline
MEASURE_ATTEMPTS = 3


@dataclass
class SkuStock:
    sku: str
    db: int
    redis: int | None  # None: no counter loaded
    reserved: int  # units in open (RESERVED) reservations, from the database
    in_flight: int  # units Redis moved whose database step is pending (or the reverse)
    drift: int  # redis - (db - in_flight); 0 when no counter, or not settled
    settled: bool = True  # False: the counter moved during the measure
    version: int = field(default=0, repr=False)  # the counter's version when measured

    def as_dict(self) -> dict:
        data = asdict(self)
        del data["version"]
        return data


@dataclass
class _RedisSide:
    now_ms: int
    loaded: bool
    counters: dict[str, int | None]
    versions: dict[str, int]
    records: dict[str, dict[str, int]]  # order ref -> lines
    created: dict[str, int]  # order ref -> ms


def read_redis(client: Any, keys: StockKeys, skus: list[str]) -> _RedisSide:
    """The Redis side of a measure: pipelined on the one server (on a cluster, the
    master serving the stock tag: every stock key is there, and a cluster pipeline
    takes neither TIME nor MGET)."""
    return on_node(client, keys.loaded, lambda node: _read_node(node, keys, skus))


def _read_node(client: Any, keys: StockKeys, skus: list[str]) -> _RedisSide:
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.exists(keys.loaded)
    pipe.zrange(keys.index, 0, -1, withscores=True)
    for start in range(0, len(skus), BATCH):
        chunk = skus[start : start + BATCH]
        pipe.mget([keys.counter(s) for s in chunk])
        pipe.hmget(keys.versions, chunk)
    replies = pipe.execute()
    (seconds, micros), loaded, index = replies[:3]
    counters: dict[str, int | None] = {}
    versions: dict[str, int] = {}
    for n, start in enumerate(range(0, len(skus), BATCH)):
        chunk = skus[start : start + BATCH]
        values, seen = replies[3 + 2 * n], replies[4 + 2 * n]
        for sku, value, version in zip(chunk, values, seen, strict=True):
            counters[sku] = None if value is None else int(value)
            versions[sku] = int(version or 0)
    created = {decoded(ref): int(score) for ref, score in index}
    records: dict[str, dict[str, int]] = {}
    refs = list(created)
    for start in range(0, len(refs), BATCH):
        chunk = refs[start : start + BATCH]
        pipe = client.pipeline(transaction=False)
        for ref in chunk:
            pipe.hgetall(keys.record(ref))
        for ref, fields in zip(chunk, pipe.execute(), strict=True):
            if fields:
                records[ref] = {decoded(k): int(v) for k, v in fields.items()}
    return _RedisSide(
        seconds * 1000 + micros // 1000, bool(loaded), counters, versions, records, created
    )


def _read_database(stock: StockTable, skus: list[str] | None, refs: list[str]):
    """Levels, the states of ``refs`` and the open reservations, in one snapshot."""
    db = router.db_for_read(Reservation)
    outermost = not connections[db].in_atomic_block
    with transaction.atomic(using=db):
        if outermost and connections[db].vendor == "postgresql":
            with connections[db].cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        levels = stock.levels(skus)
        states: dict[str, tuple[str, dict[str, int]]] = {}
        for start in range(0, len(refs), BATCH):
            rows = Reservation.objects.filter(order_ref__in=refs[start : start + BATCH])
            for ref, status, lines in rows.values_list("order_ref", "status", "lines"):
                states[ref] = (status, lines)
        open_rows = list(
            Reservation.objects.filter(status=Reservation.Status.RESERVED).values_list(
                "order_ref", "lines", "strategy"
            )
        )
    return levels, states, open_rows


def measure(skus: list[str] | None = None, client: Any = None) -> list[SkuStock]:
    """Per SKU: database quantity, counter, open and in-flight units, drift.

    A SKU whose counter moved while it was measured is measured again, up to
    ``MEASURE_ATTEMPTS`` times; if it keeps moving it is reported with
    ``settled=False`` and drift 0 (unknown, not zero).
    """
    client = client or get_redis()
    stock, keys = StockTable(), StockKeys()
    names = sorted(stock.levels(skus or None))
    rows: dict[str, SkuStock] = {}
    pending = names
    for _ in range(MEASURE_ATTEMPTS):
        before = read_redis(client, keys, pending)
        levels, states, open_rows = _read_database(stock, pending, list(before.records))
        after = read_redis(client, keys, pending)
        moving = []
        for row in _compare(pending, before, levels, states, open_rows):
            sku = row.sku
            if (before.counters[sku], before.versions[sku]) != (
                after.counters[sku],
                after.versions[sku],
            ):
                row.settled, row.drift = False, 0
                moving.append(sku)
            rows[sku] = row
        if not moving:
            break
        pending = moving
    return [rows[sku] for sku in names]


def _compare(skus, side: _RedisSide, levels, states, open_rows) -> list[SkuStock]:
    with_counters = counter_strategies()
    in_flight: Counter[str] = Counter()
    for ref, lines in side.records.items():
        status = states.get(ref, (None, None))[0]
        if status is None or status == Reservation.Status.RELEASED:
            in_flight.update(lines)  # Redis is lower by these until the other side catches up
    reserved: Counter[str] = Counter()
    for ref, lines, strategy in open_rows:
        reserved.update(lines)
        if strategy in with_counters and ref not in side.records:
            in_flight.subtract(lines)  # the database took these, Redis did not
    report = []
    for sku in skus:
        if sku not in levels:
            continue
        counter = side.counters.get(sku)
        drift = 0 if counter is None else counter - (levels[sku] - in_flight[sku])
        report.append(
            SkuStock(
                sku, levels[sku], counter, reserved[sku], in_flight[sku], drift,
                version=side.versions.get(sku, 0),
            )
        )  # fmt: skip
    return report


def stock_report(skus: list[str] | None = None) -> list[SkuStock]:
    """The measurement of :func:`measure`, for the commands and the dashboard."""
    return measure(skus)
