"""Celery tasks of stock_locks. Names are explicit and stable."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .conf import settings
from .delayqueue import DelayQueue

DRAIN_TASK = "stock_locks.drain_delay_queue"


@shared_task(name=DRAIN_TASK, ignore_result=True)
def drain_delay_queue(queues: list[str] | None = None, max_batches: int = 50) -> dict[str, Any]:
    """Handle every due item of each queue (default ``STOCK_LOCKS["DELAY_QUEUES"]``).

    Safe to run twice at once (two beats, two workers): claims are atomic, so
    no item is handled twice while its visibility lasts. Returns per queue the
    counts handled, dispatched, failed and dead.
    """
    summary = {}
    for name in queues or settings.DELAY_QUEUES:
        result = DelayQueue(name).drain(max_batches=max_batches)
        summary[name] = {
            "handled": result.handled,
            "dispatched": result.dispatched,
            "failed": result.failed,
            "dead": result.dead,
        }
    return summary


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The beat entry that drains the delay queues every ``DELAY_QUEUE_INTERVAL`` seconds.

    In a project's Celery app: ``app.conf.beat_schedule = {**beat_schedule(), ...}``.
    """
    interval = settings.DELAY_QUEUE_INTERVAL
    return {
        "stock_locks-drain-delay-queues": {
            "task": DRAIN_TASK,
            "schedule": interval,
            "options": {"expires": max(interval * 5, 5)},  # a backlog of ticks is pointless
        }
    }
