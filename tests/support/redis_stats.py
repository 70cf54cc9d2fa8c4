"""What a test may ask a real redis-server about its own work."""

from __future__ import annotations

import redis


def commandstats(client) -> dict[str, int]:
    """Calls per command (``cmdstat_<name>``) since the last CONFIG RESETSTAT."""
    return {name: stats["calls"] for name, stats in client.info("commandstats").items()}


def data_keys(client) -> list[bytes]:
    """The keys of the test's data: every key but the metrics timeline, which each
    process's flusher thread writes once a second whenever it has figures pending
    (from whatever ran before), so "nothing written" cannot count it, and the
    registries, which list a semaphore or queue for a day after its last use."""
    return sorted(
        key for key in client.scan_iter() if not key.startswith((b"sl:metrics:", b"sl:registry:"))
    )


def blocked_clients(client) -> int:
    """Clients blocked in a blocking command (BLPOP) right now."""
    return client.info("clients")["blocked_clients"]


def redis_ms(client) -> int:
    """The Redis clock (TIME) in epoch ms, truncated as the library's scripts do."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class CountingConnection(redis.Connection):
    """A real connection that counts the replies it reads (one per round trip).

    Reset ``CountingConnection.replies`` to 0 before the calls a test counts."""

    replies = 0

    def read_response(self, *args, **kwargs):
        CountingConnection.replies += 1
        return super().read_response(*args, **kwargs)
