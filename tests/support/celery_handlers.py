"""Delay-queue handlers only the test suite's Celery workers load (CELERY_IMPORTS)."""

from __future__ import annotations

from typing import Any

from stock_locks.backends.redis import get_redis
from stock_locks.delayqueue import handler
from stock_locks.stock.expiry import expire_reservation

SLOW_DELIVERIES = "tests:slow:deliveries"
SLOW_STARTED = "tests:slow:started"


@handler("tests.expire_order_slowly")
def expire_order_slowly(payload: dict[str, Any]) -> None:
    """The reservation expiry (``{"order_ref": ...}``), except that the first delivery
    hangs until its worker is killed."""
    client = get_redis()
    if client.incr(SLOW_DELIVERIES) == 1:
        client.set(SLOW_STARTED, 1)
        while True:  # "mid-handler": the test SIGKILLs this worker now
            client.blpop(["tests:slow:never"], timeout=1)
    expire_reservation(payload["order_ref"])
