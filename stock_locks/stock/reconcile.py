"""Redis-vs-database stock drift: measure it, and repair it from the database.

The database is the system of record. Drift of a SKU is its Redis counter
minus its database quantity (0 when no counter is loaded). Repair closes the
Redis reservation records the database no longer holds open (older than a
grace period, so requests in flight are left alone), then sets each drifting
counter to the database's quantity with a compare-and-set, so a counter that
moved meanwhile is read again rather than overwritten.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from .. import scripts
from ..connection import get_redis
from ..keys import StockKeys
from ..models import Reservation
from .base import StockModel

ORPHAN_GRACE = 60  # seconds a Redis record may exist before its database row
SET_ATTEMPTS = 5
BATCH = 500  # keys per MGET / pipeline


@dataclass
class SkuStock:
    sku: str
    db: int
    redis: int | None  # None: no counter loaded
    reserved: int  # units in open (RESERVED) reservations, from the database
    drift: int  # redis - db, 0 when no counter

    def as_dict(self) -> dict:
        return asdict(self)


def stock_report(skus: list[str] | None = None) -> list[SkuStock]:
    """Database quantity, Redis counter, open reservations and drift per SKU."""
    stock = StockModel()
    rows = stock.objects.order_by(stock.sku)
    if skus:
        rows = rows.filter(**{f"{stock.sku}__in": skus})
    levels = dict(rows.values_list(stock.sku, stock.qty))
    reserved: Counter[str] = Counter()
    open_lines = Reservation.objects.filter(status=Reservation.Status.RESERVED)
    for lines in open_lines.values_list("lines", flat=True):
        reserved.update({sku: qty for sku, qty in lines.items() if sku in levels})
    counters = _counters(list(levels))
    report = []
    for sku, db in levels.items():
        redis_value = counters.get(sku)
        drift = 0 if redis_value is None else redis_value - db
        report.append(SkuStock(sku, db, redis_value, reserved[sku], drift))
    return report


def _counters(skus: list[str]) -> dict[str, int]:
    client, keys = get_redis(), StockKeys()
    found = {}
    for start in range(0, len(skus), BATCH):
        chunk = skus[start : start + BATCH]
        for sku, value in zip(chunk, client.mget([keys.counter(s) for s in chunk]), strict=True):
            if value is not None:
                found[sku] = int(value)
    return found


def close_orphan_records(grace: float = ORPHAN_GRACE) -> list[str]:
    """Delete Redis reservation records whose database reservation is not open.

    Only records older than ``grace`` seconds (Redis clock) are touched. Their
    units are not given back here: the counters are then set from the database.
    Returns the order refs closed.
    """
    client, keys = get_redis(), StockKeys()
    seconds, micros = client.time()
    cutoff = seconds * 1000 + micros // 1000 - int(grace * 1000)
    refs = [
        r.decode() if isinstance(r, bytes) else r
        for r in client.zrangebyscore(keys.index, "-inf", cutoff)
    ]
    if not refs:
        return []
    still_open = set(
        Reservation.objects.filter(
            order_ref__in=refs, status=Reservation.Status.RESERVED
        ).values_list("order_ref", flat=True)
    )
    orphans = [ref for ref in refs if ref not in still_open]
    for ref in orphans:
        scripts.STOCK_COMMIT([keys.record(ref), keys.index], [ref], client=client)
    return orphans


def repair_counters(report: list[SkuStock]) -> list[str]:
    """Set every drifting counter to the database's quantity. Returns the SKUs set."""
    client, keys, stock = get_redis(), StockKeys(), StockModel()
    fixed = []
    for row in report:
        if not row.drift:
            continue
        for _ in range(SET_ATTEMPTS):
            before = client.get(keys.counter(row.sku))
            target = stock.level(row.sku)
            args = [before.decode() if before is not None else "", target]
            if scripts.STOCK_SET_COUNTER([keys.counter(row.sku)], args, client=client):
                fixed.append(row.sku)
                break
    return fixed


def fix_drift(skus: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Close orphan Redis reservation records, then set drifting counters from the
    database. Returns (order refs closed, SKUs set)."""
    closed = close_orphan_records()
    fixed = repair_counters([row for row in stock_report(skus) if row.drift])
    return closed, fixed


def sync_counters(skus: list[str] | None = None) -> list[SkuStock]:
    """Load (overwrite) every counter from the database; the report before loading."""
    report = stock_report(skus)
    client, keys = get_redis(), StockKeys()
    pipe = client.pipeline(transaction=False)
    for row in report:
        pipe.set(keys.counter(row.sku), row.db)
    pipe.execute()
    return report
