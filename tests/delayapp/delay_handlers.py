"""Handlers that count their deliveries in Redis, so tests can see what ran how often.

Counts go to ``DQ_COUNTER_URL`` (a Redis URL; default: stock_locks' own client),
so a drainer whose stock_locks connection runs through a fault proxy still
records every handling directly on the server.

- ``tests.dq.count``, payload ``{"n": <key>, "hang": <bool>}``: HINCRBY
  ``COUNTS`` ``n`` 1 once the handler finishes. With ``hang``, its first
  delivery sets ``HANGING`` to ``n`` and then blocks until something is pushed
  to ``RELEASE`` (the test decides when); later deliveries do not block.
  With ``stop`` as well, that first delivery SIGSTOPs its own process right
  after setting ``HANGING``: the whole drainer (helper thread included) is
  paused at that point, not whenever a test's signal arrives.
"""

from __future__ import annotations

import os
import signal
from functools import cache
from typing import Any

import redis

from stock_locks.backends.redis import get_redis
from stock_locks.delayqueue import handler

COUNT_TASK = "tests.dq.count"
COUNTS = "tests:dq:counts"  # hash: n -> times handled to the end
HANGING = "tests:dq:hanging"  # set by a hanging delivery when it starts
RELEASE = "tests:dq:release"  # list: push one element to let the hanging delivery finish
DELIVERIES = "tests:dq:deliveries:"  # + n: deliveries started, for the hang-once rule


@cache
def counter() -> redis.Redis:
    url = os.environ.get("DQ_COUNTER_URL")
    return redis.Redis.from_url(url) if url else get_redis()


@handler(COUNT_TASK)
def count(payload: dict[str, Any]) -> None:
    client = counter()
    n = str(payload["n"])
    if payload.get("hang") and client.incr(DELIVERIES + n) == 1:
        client.set(HANGING, n)
        if payload.get("stop"):
            os.kill(os.getpid(), signal.SIGSTOP)
        while not client.blpop([RELEASE], timeout=1):
            pass
    client.hincrby(COUNTS, n, 1)
