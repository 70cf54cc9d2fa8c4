"""Now, from the Redis server's clock (the database server's when Redis is down): the
time of expiries and due dates, never a client's."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import connection

from ..backends.redis.client import get_redis
from ..backends.redis.errors import REDIS_OR_OS_ERRORS

log = logging.getLogger("stock_locks.stock")


def server_clock_ms() -> int:
    """Now in ms since the epoch, from the Redis server (the database's when Redis is down)."""
    try:
        seconds, micros = get_redis().time()
        return int(seconds) * 1000 + int(micros) // 1000
    except REDIS_OR_OS_ERRORS as exc:  # Redis down: the database server's clock
        log.warning("Redis clock unreachable (%s); using the database's", exc)
        with connection.cursor() as cursor:
            cursor.execute("SELECT CURRENT_TIMESTAMP")
            now = cursor.fetchone()[0]
        if isinstance(now, str):  # SQLite answers text, in UTC
            now = dt.datetime.fromisoformat(now).replace(tzinfo=dt.UTC)
        return int(now.timestamp() * 1000)
