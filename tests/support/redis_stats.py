"""What a test may ask a real redis-server about its own work."""

from __future__ import annotations


def commandstats(client) -> dict[str, int]:
    """Calls per command (``cmdstat_<name>``) since the last CONFIG RESETSTAT."""
    return {name: stats["calls"] for name, stats in client.info("commandstats").items()}


def blocked_clients(client) -> int:
    """Clients blocked in a blocking command (BLPOP) right now."""
    return client.info("clients")["blocked_clients"]
