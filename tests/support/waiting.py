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
