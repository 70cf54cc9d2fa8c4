"""Repairing drift without racing sales.

Repairs never write an absolute value over a live counter:

- records and rows are settled one by one with atomic, idempotent scripts (a
  committed row's record is closed; a released row's record gives its units
  back; a record whose row never came, after ``ORPHAN_GRACE``, gets a
  RELEASED row first, so a late database step is refused, then gives its
  units back; an open row without a record is adopted under its row lock);
- a settled counter is corrected by the measured amount with a relative
  INCRBY, refused by the script if the counter moved since the measure
  (:mod:`.measure`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from ... import scripts
from ...backends.redis.client import get_redis
from ...conf import settings
from ...keys import StockKeys
from ...models import Reservation
from ..registry import counter_strategies
from ..soldout import units_back
from .measure import BATCH, SkuStock, measure, read_redis, stock_report
from .restore import load_missing_counters, restore_after_data_loss

log = logging.getLogger("stock_locks.stock.reconcile")


@dataclass
class Repair:
    """What one :func:`repair` did."""

    closed: list[str] = field(default_factory=list)  # records of committed rows
    given_back: list[str] = field(default_factory=list)  # records of released rows
    orphans: list[str] = field(default_factory=list)  # records whose row never came
    adopted: list[str] = field(default_factory=list)  # open rows given their record
    corrected: dict[str, int] = field(default_factory=dict)  # SKU -> amount added
    unsettled: list[str] = field(default_factory=list)  # SKUs that kept moving


def settle_records(client: Any = None, orphan_grace: float | None = None) -> Repair:
    """Settle every Redis reservation record with its database row (see the module doc)."""
    client = client or get_redis()
    keys, result = StockKeys(), Repair()
    grace_ms = int((settings.ORPHAN_GRACE if orphan_grace is None else orphan_grace) * 1000)
    side = read_redis(client, keys, [])
    states = dict(
        Reservation.objects.filter(order_ref__in=list(side.records)).values_list(
            "order_ref", "status"
        )
    )
    for ref, lines in side.records.items():
        status = states.get(ref)
        if status == Reservation.Status.RESERVED:
            continue
        if status == Reservation.Status.COMMITTED:
            scripts.STOCK_COMMIT([keys.record(ref), keys.index], [ref], client=client)
            result.closed.append(ref)
            continue
        if status is None:
            if side.now_ms - side.created.get(ref, side.now_ms) < grace_ms:
                continue  # its request may still be writing the row
            if not _tombstone(ref, lines):
                continue  # the row came after all: settled next time
            result.orphans.append(ref)
        else:
            result.given_back.append(ref)
        _release_record(client, keys, ref, lines)
    return result


def _tombstone(order_ref: str, lines: dict[str, int]) -> bool:
    """Insert a RELEASED row for a reservation whose database step never came, so a late
    one is refused by the unique order ref. False when a row exists (it came after all)."""
    try:
        with transaction.atomic():
            Reservation.objects.create(
                order_ref=order_ref,
                lines=lines,
                strategy="orphan",
                status=Reservation.Status.RELEASED,
            )
    except IntegrityError:
        return Reservation.objects.filter(
            order_ref=order_ref, status=Reservation.Status.RELEASED
        ).exists()
    log.warning(
        "reservation record %r had no database row after the orphan grace; its units %s went back",
        order_ref,
        lines,
    )
    return True


def _release_record(client: Any, keys: StockKeys, ref: str, lines: dict[str, int]) -> int:
    skus = list(lines)
    stock_keys = [keys.record(ref), keys.index, keys.loaded, keys.versions]
    outcome = scripts.STOCK_RELEASE(
        [*stock_keys, *map(keys.counter, skus)], [ref, *skus], client=client
    )
    units_back(skus)
    return outcome


def adopt_open_rows(client: Any = None) -> list[str]:
    """Give every open reservation of a counter strategy that has no Redis record its
    record, taking its units from the counters; each under its row's lock, so a
    commit or release cannot cross it. Returns the order refs adopted."""
    client = client or get_redis()
    keys = StockKeys()
    with_counters = counter_strategies()
    candidates = list(
        Reservation.objects.filter(
            status=Reservation.Status.RESERVED, strategy__in=with_counters
        ).values_list("order_ref", flat=True)
    )
    adopted = []
    for start in range(0, len(candidates), BATCH):
        chunk = candidates[start : start + BATCH]
        pipe = client.pipeline(transaction=False)
        for ref in chunk:
            pipe.exists(keys.record(ref))
        missing = [ref for ref, found in zip(chunk, pipe.execute(), strict=True) if not found]
        for ref in missing:
            with transaction.atomic():
                row = Reservation.objects.select_for_update().filter(order_ref=ref).first()
                if row is None or row.status != Reservation.Status.RESERVED:
                    continue
                skus = list(row.lines)
                created_ms = int(row.created_at.timestamp() * 1000)
                reply = scripts.STOCK_ADOPT(
                    [keys.record(ref), keys.index, keys.loaded, keys.versions,
                     *map(keys.counter, skus)],
                    [ref, created_ms, *row.lines.values(), *skus],
                    client=client,
                )  # fmt: skip
            if reply == 1:
                adopted.append(ref)
    if adopted:
        log.warning("gave %d open reservation(s) their lost Redis record", len(adopted))
    return adopted


def correct_counters(
    client: Any = None, skus: list[str] | None = None, *, expected: bool = False
) -> Repair:
    """Correct each settled, drifting counter by its measured drift (relative, and
    refused if the counter moved since it was measured). ``expected``: the caller
    knows the database changed (a save of the stock model): logged at INFO, not
    as a WARNING."""
    client = client or get_redis()
    keys, result = StockKeys(), Repair()
    report = measure(skus, client)
    result.unsettled = [row.sku for row in report if not row.settled]
    drifting = [row for row in report if row.settled and row.drift]
    if not drifting:
        return result
    args: list[Any] = []
    counters: list[str] = []
    for row in drifting:
        counters.append(keys.counter(row.sku))
        args += [row.sku, row.version, -row.drift]
    done = scripts.STOCK_CORRECT([keys.versions, *counters], args, client=client)
    units_back(row.sku for row in drifting if row.drift < 0)
    for row, ok in zip(drifting, done, strict=True):
        if ok:
            result.corrected[row.sku] = -row.drift
        else:
            result.unsettled.append(row.sku)
    if result.corrected:
        level = logging.INFO if expected else logging.WARNING
        log.log(level, "corrected drifting stock counters from the database: %s", result.corrected)
    return result


def repair(skus: list[str] | None = None, orphan_grace: float | None = None) -> Repair:
    """Settle records, adopt open rows, then correct settled counters. Safe during sales."""
    client = get_redis()
    result = settle_records(client, orphan_grace)
    result.adopted = adopt_open_rows(client)
    corrected = correct_counters(client, skus)
    result.corrected, result.unsettled = corrected.corrected, corrected.unsettled
    return result


def fix_drift(skus: list[str] | None = None) -> tuple[list[str], list[str]]:
    """:func:`repair`, for the command and the dashboard: (records settled, SKUs corrected)."""
    result = repair(skus)
    settled = result.closed + result.given_back + result.orphans + result.adopted
    return settled, sorted(result.corrected)


def sync_counters(skus: list[str] | None = None) -> list[SkuStock]:
    """Load missing counters from the database, then :func:`repair` the others.

    Returns the report from before. For deploy scripts and the demo's seeding;
    the sweeper does the same repairs periodically.
    """
    report = stock_report(skus)
    client = get_redis()
    restore_after_data_loss(client)
    missing = [row.sku for row in report if row.redis is None]
    if missing:
        load_missing_counters(missing, client)
    repair(skus)
    return report
