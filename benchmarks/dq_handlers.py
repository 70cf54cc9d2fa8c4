"""The delay-queue handler the delay-queue benchmark's drainers run, and the app that loads it.

``benchmarks/dq_settings.py`` lists :class:`DelayQueueBenchConfig` in
``INSTALLED_APPS``, so every process set up with those settings (the Celery
worker, ``manage.py run_delay_queue``) imports this module and has
``bench.record`` registered before it drains anything.

``bench.record`` takes ``{"n": <item number>, "due": <due time, epoch ms by the
Redis clock>, "key": <Redis list>}`` and RPUSHes ``"<n> <due ms> <handled ms>"``
to that list, where handled is ``time.time()`` when the handler starts (the
drainer runs on the same machine as Redis, so both clocks are the same clock).
"""

from __future__ import annotations

import time
from typing import Any

from django.apps import AppConfig

from stock_locks.delayqueue import handler

RECORD_TASK = "bench.record"


@handler(RECORD_TASK)
def record(payload: dict[str, Any]) -> None:
    handled_ms = time.time() * 1000
    from stock_locks.backends.redis import get_redis

    get_redis().rpush(payload["key"], f"{payload['n']} {payload['due']} {handled_ms:.3f}")


class DelayQueueBenchConfig(AppConfig):
    name = "benchmarks"
    label = "benchmarks_dq"
    verbose_name = "Delay-queue benchmark handlers"
