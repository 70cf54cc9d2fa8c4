"""Redis counters against the database: measure the drift honestly, repair it without racing sales.

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

Repairs never write an absolute value over a live counter:

- records and rows are settled one by one with atomic, idempotent scripts (a
  committed row's record is closed; a released row's record gives its units
  back; a record whose row never came, after ``ORPHAN_GRACE``, gets a
  RELEASED row first, so a late database step is refused, then gives its
  units back; an open row without a record is adopted under its row lock);
- a settled counter is corrected by the measured amount with a relative
  INCRBY, refused by the script if the counter moved since the measure.

When Redis lost its data (the ``loaded`` marker is gone: a restart without
persistence, a flushed database), :func:`restore_after_data_loss` gives every
open reservation of a counter strategy its record back and sets the marker;
counters then load from the database one by one as they are needed.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import IntegrityError, connections, router, transaction

from .. import scripts
from ..conf import settings
from ..connection import decoded, get_redis, on_node
from ..keys import StockKeys
from ..models import Reservation
from .cart import unknown_sku
from .soldout import units_back
from .table import StockModel

log = logging.getLogger("stock_locks.stock.reconcile")

BATCH = 500  # keys per MGET / pipeline
MEASURE_ATTEMPTS = 3
LOAD_ATTEMPTS = 10
RESTORE_LOCK = "stock_locks:restore-counters"


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


@dataclass
class Repair:
    """What one :func:`repair` did."""

    closed: list[str] = field(default_factory=list)  # records of committed rows
    given_back: list[str] = field(default_factory=list)  # records of released rows
    orphans: list[str] = field(default_factory=list)  # records whose row never came
    adopted: list[str] = field(default_factory=list)  # open rows given their record
    corrected: dict[str, int] = field(default_factory=dict)  # SKU -> amount added
    unsettled: list[str] = field(default_factory=list)  # SKUs that kept moving


def counter_strategies() -> set[str]:
    """Names of the registered strategies that keep Redis counters."""
    from django.utils.module_loading import import_string

    from .counters import RedisStockStrategy

    names = set()
    for name, path in settings.STRATEGIES.items():
        try:
            cls = import_string(path)
        except ImportError:
            continue
        if isinstance(cls, type) and issubclass(cls, RedisStockStrategy):
            names.add(name)
    return names


def _read_redis(client: Any, keys: StockKeys, skus: list[str]) -> _RedisSide:
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


def _read_database(stock: StockModel, skus: list[str] | None, refs: list[str]):
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
    stock, keys = StockModel(), StockKeys()
    names = sorted(stock.levels(skus or None))
    rows: dict[str, SkuStock] = {}
    pending = names
    for _ in range(MEASURE_ATTEMPTS):
        before = _read_redis(client, keys, pending)
        levels, states, open_rows = _read_database(stock, pending, list(before.records))
        after = _read_redis(client, keys, pending)
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


# -- repairs --------------------------------------------------------------------------


def settle_records(client: Any = None, orphan_grace: float | None = None) -> Repair:
    """Settle every Redis reservation record with its database row (see the module doc)."""
    client = client or get_redis()
    keys, result = StockKeys(), Repair()
    grace_ms = int((settings.ORPHAN_GRACE if orphan_grace is None else orphan_grace) * 1000)
    side = _read_redis(client, keys, [])
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


def load_missing_counters(skus: list[str], client: Any = None) -> dict[str, int]:
    """Create the missing counters of ``skus`` from the database; every counter's value.

    A counter is set only if nothing moved that SKU's stock between reading its
    version and reading the database (a restock, a release, a database strategy's
    sale bump the version even while the counter is missing), else read again:
    a level read before a relative change is never stored after it. Raises
    :class:`InvalidQuantity` for a SKU the database does not have.
    """
    client = client or get_redis()
    keys, stock = StockKeys(), StockModel()
    pending = list(skus)
    for _ in range(LOAD_ATTEMPTS):
        seen = client.hmget(keys.versions, pending)
        levels = stock.levels(pending)
        for sku in pending:
            if sku not in levels:
                raise unknown_sku(sku)
        args = [v for sku, ver in zip(pending, seen, strict=True)
                for v in (sku, decoded(ver) if ver is not None else "0", levels[sku])]  # fmt: skip
        done = scripts.STOCK_LOAD([keys.versions, *map(keys.counter, pending)], args, client=client)
        units_back(pending)
        pending = [sku for sku, outcome in zip(pending, done, strict=True) if outcome == -1]
        if not pending:
            break
    values = client.mget([keys.counter(sku) for sku in skus])
    return {sku: int(v) for sku, v in zip(skus, values, strict=True) if v is not None}


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


# -- data loss ---------------------------------------------------------------------------


def restore_after_data_loss(client: Any = None) -> bool:
    """If Redis lost its data (no ``loaded`` marker), give every open reservation of a
    counter strategy its record back and set the marker. True when this call did.

    Counters are not written here: a missing counter loads from the database
    (which already excludes open reservations) when first needed. One process
    restores while the others wait for it (a lock), then go on.
    """
    from ..locks import Lock

    client = client or get_redis()
    keys = StockKeys()
    if client.exists(keys.loaded):
        return False
    with Lock(RESTORE_LOCK, ttl=60, timeout=60, redis=client):
        if client.exists(keys.loaded):
            return False  # another process restored while this one waited
        open_rows = list(
            Reservation.objects.filter(
                status=Reservation.Status.RESERVED, strategy__in=counter_strategies()
            ).values_list("order_ref", "lines", "created_at")
        )
        marker = _marker(client)

        def restore(node: Any) -> None:
            # One MULTI/EXEC; every stock key shares one hash tag, so on a cluster it is
            # one node's transaction (cluster pipelines of redis-py 5 have none).
            pipe = node.pipeline(transaction=True)
            for ref, lines, created_at in open_rows:
                pipe.delete(keys.record(ref))
                pipe.hset(keys.record(ref), mapping=lines)
                pipe.zadd(keys.index, {ref: int(created_at.timestamp() * 1000)})
            pipe.hset(keys.loaded, mapping=marker)
            pipe.execute()

        on_node(client, keys.loaded, restore)
        restored = len(open_rows)
    if restored:
        log.warning(
            "Redis had lost the stock data; gave %d open reservation(s) their records back",
            restored,
        )
    else:
        log.info("stock data marked as loaded in Redis")
    return True


def _marker(client: Any) -> dict[str, Any]:
    seconds, _ = client.time()
    return {
        "epoch": secrets.token_hex(8),
        "run_id": run_id(client),
        "loaded_at": dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat(),
    }


def run_id(client: Any) -> str:
    """The run id of the Redis server holding the stock keys (on a cluster, the master
    serving their hash tag: a failover changes it, as a restart does)."""
    keys = StockKeys()
    return decoded(on_node(client, keys.loaded, lambda node: node.info("server")).get("run_id", ""))
