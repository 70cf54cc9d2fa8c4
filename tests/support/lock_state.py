"""Whether locks are held, read from their keys: a lock key holds the holder's record
while held, then a tombstone (an empty token first) for a while after a release."""

from __future__ import annotations

from typing import Any

from .waiting import wait_until


def held(client: Any, *keys: str) -> int:
    """How many of the lock keys ``keys`` hold a holder's record (like ``EXISTS``, but a
    tombstone counts as free)."""
    count = 0
    for key in keys:
        value = client.get(key)
        if value is not None and not (
            value.decode() if isinstance(value, bytes) else value
        ).startswith("\n"):
            count += 1
    return count


def last_fence(client: Any, key: str) -> int | None:
    """The last fence a lock key carries (its record's or its tombstone's), or None."""
    value = client.get(key)
    if value is None:
        return None
    fields = (value.decode() if isinstance(value, bytes) else value).split("\n")
    return int(fields[1] if fields[0] == "" else fields[10])


def tombstone(last: int, released: tuple[str, ...] = ()) -> str:
    """A tombstone value (the lock free) carrying ``last`` and the ``released`` tokens
    (each kept by its first 16 characters, as the scripts keep them)."""
    return f"\n{last}\n0\n{' '.join(token[:16] for token in released)}"


def lease_runs_out(client: Any, key: str) -> None:
    """The lock at ``key`` lapses now, unreleased (as its holder's lease ending): returns
    once the key is gone."""
    client.pexpire(key, 1)
    wait_until(lambda: not client.exists(key), what="the lease end")
