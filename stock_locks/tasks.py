"""Celery tasks of stock_locks. Names are explicit and stable."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from .backends.redis.errors import REDIS_FAILURES
from .conf import settings
from .delayqueue import DelayQueue

DRAIN_TASK = "stock_locks.drain_delay_queue"
SWEEP_TASK = "stock_locks.sweep_stock"

log = logging.getLogger("stock_locks.delayqueue")


@shared_task(name=DRAIN_TASK, ignore_result=True)
def drain_delay_queue(queues: list[str] | None = None, max_batches: int = 50) -> dict[str, Any]:
    """Handle every due item of each queue (default ``STOCK_LOCKS["DELAY_QUEUES"]``).

    Safe to run twice at once (two beats, two workers): claims are atomic, so
    no item is handled twice while its visibility lasts. A Redis error on one
    queue is logged and the next queue is drained (the next tick tries again).
    Returns per queue the counts handled, dispatched, failed, dead and given
    back, or the error.
    """
    summary: dict[str, Any] = {}
    for name in queues or settings.DELAY_QUEUES:
        try:
            result = DelayQueue(name).drain(max_batches=max_batches)
        except REDIS_FAILURES as exc:
            log.warning("delay queue %r: drain task: %s: %s", name, type(exc).__name__, exc)
            summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        summary[name] = {
            "handled": result.handled,
            "dispatched": result.dispatched,
            "failed": result.failed,
            "dead": result.dead,
            "released": result.released,
        }
    return summary


@shared_task(name=SWEEP_TASK, ignore_result=True)
def sweep_stock() -> dict[str, Any]:
    """Expire reservations the delay queue lost, restore what Redis lost, repair drift.

    See :mod:`stock_locks.stock.sweeper`. Safe to run twice at once (the
    second run finds the first's lock and does nothing).
    """
    from .stock.sweeper import sweep  # (a worker imports the tasks before the apps are ready)

    return sweep().as_dict()


def beat_schedule() -> dict[str, dict[str, Any]]:
    """Beat entries: drain the delay queues every ``DELAY_QUEUE_INTERVAL`` seconds, and
    run the stock sweeper every ``SWEEP_INTERVAL`` seconds.

    In a project's Celery app: ``app.conf.beat_schedule = {**beat_schedule(), ...}``.
    """
    interval = settings.DELAY_QUEUE_INTERVAL
    sweep_every = settings.SWEEP_INTERVAL
    return {
        "stock_locks-drain-delay-queues": {
            "task": DRAIN_TASK,
            "schedule": interval,
            "options": {"expires": max(interval * 5, 5)},  # a backlog of ticks is pointless
        },
        "stock_locks-sweep-stock": {
            "task": SWEEP_TASK,
            "schedule": sweep_every,
            "options": {"expires": max(sweep_every, 5)},
        },
    }
