"""Bounded waits. Every wait in the suite goes through TIMEOUT, the one knob."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Longest any test waits for something that should happen; raise it on a slow machine.
TIMEOUT = float(os.environ.get("STOCK_LOCKS_TEST_TIMEOUT", "30"))  # seconds


def wait_until(
    predicate: Callable[[], T], timeout: float = TIMEOUT, interval: float = 0.005, what: str = ""
) -> T:
    """Call ``predicate`` until it returns something truthy; return that.

    Raises AssertionError naming ``what`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def renewed(pttl: Callable[[], int], what: str = "the lease", timeout: float = TIMEOUT) -> int:
    """Wait for one renewal of a lease: ``pttl()`` (its PTTL in ms) rises from one
    reading to the next. Returns the PTTL it rose to.

    Fails at once when the lease ran out (a PTTL not above 0: -2 gone, -1 no
    expiry), and after ``timeout`` seconds when it was never renewed.
    """
    last = pttl()

    def rose() -> int:
        nonlocal last
        now = pttl()
        assert now > 0, f"{what} ran out (PTTL {now}): nobody renewed it"
        risen, last = now > last, now
        return now if risen else 0

    return wait_until(rose, timeout, interval=0.01, what=f"a renewal of {what}")


async def eventually(
    predicate: Callable[[], T], timeout: float = TIMEOUT, interval: float = 0.005, what: str = ""
) -> T:
    """:func:`wait_until` inside an event loop: the loop keeps running while it waits."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(interval)
