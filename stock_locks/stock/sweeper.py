"""The sweeper: what keeps stock whole when the fast paths lose something.

Run periodically by Celery beat (task ``stock_locks.sweep_stock``, every
``SWEEP_INTERVAL`` seconds; see :func:`stock_locks.tasks.beat_schedule`) or by
hand (``manage.py reconcile_stock --fix`` does the same repairs). One run:

1. expires reservations overdue by more than ``SWEEP_GRACE`` seconds (Redis
   clock): the ones whose delay-queue item was lost;
2. notices that Redis lost its data (the ``loaded`` marker gone, or a new
   server run id: a restart, a failover, a restore from an older snapshot)
   and gives open reservations their records back;
3. settles Redis reservation records with their database rows, adopts open
   rows that lost their record, and corrects counters whose drift it could
   measure while they stood still (:mod:`stock_locks.stock.reconcile`).

Every step is relative and idempotent, so two sweepers at once, or a sweep
during a sale, cannot move stock twice; a lock keeps a second sweeper from
doing the same work meanwhile.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from ..backends.redis.client import get_redis
from ..backends.redis.errors import REDIS_ERRORS, REDIS_FAILURES
from ..backends.redis.protocol import decoded
from ..conf import settings
from ..exceptions import BackendUnavailable, LockError, RedisUnavailable, StockLocksError
from ..keys import StockKeys
from ..locks import Lock
from . import reconcile
from .clock import server_clock_ms
from .expiry import expire_reservation, overdue

log = logging.getLogger("stock_locks.stock.sweeper")

SWEEP_LOCK = "stock_locks:sweeper"
# What the sweeper's lock may meet when Redis is down (or refusing, mid-failover).
LOCK_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, BackendUnavailable, LockError)
EXPIRE_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, RedisUnavailable, StockLocksError)


@dataclass
class SweepResult:
    expired: list[str] = field(default_factory=list)
    restored: bool = False  # Redis had lost its data; open reservations got their records back
    restarted: bool = False  # the Redis server's run id changed since the last sweep
    repair: reconcile.Repair | None = None
    skipped: str = ""  # why the run did nothing (another sweeper, Redis down)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        repair = self.repair or reconcile.Repair()
        return {
            "expired": len(self.expired),
            "restored": self.restored,
            "restarted": self.restarted,
            "closed": len(repair.closed),
            "given_back": len(repair.given_back),
            "orphans": len(repair.orphans),
            "adopted": len(repair.adopted),
            "corrected": repair.corrected,
            "unsettled": repair.unsettled,
            "skipped": self.skipped,
            "errors": self.errors,
        }


def sweep(*, grace: float | None = None, orphan_grace: float | None = None) -> SweepResult:
    """One sweeper run (see the module doc). Returns what it did.

    ``grace`` and ``orphan_grace`` override ``SWEEP_GRACE`` and ``ORPHAN_GRACE``
    (seconds). Never raises for Redis being down: the database part (expiry of
    strategies that do not need Redis) still runs, and the rest waits for the
    next run.
    """
    result = SweepResult()
    grace = settings.SWEEP_GRACE if grace is None else grace
    now = dt.datetime.fromtimestamp(server_clock_ms() / 1000, tz=dt.UTC)
    client = get_redis()
    try:
        lock = Lock(SWEEP_LOCK, ttl=max(60, settings.SWEEP_INTERVAL * 4), blocking=False)
        if not lock.acquire():
            result.skipped = "another sweeper is running"
            return result
    except LOCK_ERRORS as exc:
        lock = None
        result.skipped = f"Redis unreachable: {exc}"
    try:
        _expire(result, now, grace)
        if lock is not None:
            _repair_redis(result, client, orphan_grace)
    finally:
        if lock is not None:
            try:
                lock.release()
            except LOCK_ERRORS as exc:
                log.warning("sweeper lock not released cleanly: %s", exc)
    return result


def _expire(result: SweepResult, now: dt.datetime, grace: float) -> None:
    for ref in overdue(now, grace, settings.SWEEP_BATCH):
        try:
            if expire_reservation(ref, now=now):
                result.expired.append(ref)
        except EXPIRE_ERRORS as exc:
            result.errors.append(f"{ref}: {exc}")
            log.warning("sweeper could not expire %r: %s", ref, exc)
    if result.expired:
        log.warning(
            "sweeper expired %d overdue reservation(s) the delay queue had lost",
            len(result.expired),
        )


def _repair_redis(result: SweepResult, client, orphan_grace: float | None) -> None:
    keys = StockKeys()
    try:
        run_id = reconcile.run_id(client)
        seen = client.hget(keys.loaded, "run_id")
        result.restored = reconcile.restore_after_data_loss(client)
        if not result.restored and seen is not None and decoded(seen) != run_id:
            result.restarted = True
            log.warning(
                "Redis restarted (new run id); checking the stock data against the database"
            )
            client.hset(keys.loaded, "run_id", run_id)
        result.repair = reconcile.repair(orphan_grace=orphan_grace)
    except REDIS_FAILURES as exc:
        result.errors.append(f"Redis: {exc}")
        log.warning("sweeper: Redis unreachable, stock repairs wait for the next run: %s", exc)
