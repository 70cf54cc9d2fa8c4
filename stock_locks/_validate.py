"""Argument checks shared by every primitive (locks, semaphores, decorators).

Each check runs before any round trip and raises :class:`LockError` naming
the argument, its value and the primitive's name. Durations are seconds; a
bool is never a number here, and NaN is refused (it compares false with
everything, so it would wait forever).
"""

from __future__ import annotations

import math
from typing import TypeGuard

from .exceptions import LockError


def _number(value: object) -> TypeGuard[int | float]:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and not (isinstance(value, float) and math.isnan(value))
    )


def lease_ms(seconds: object, what: str = "ttl", name: str | None = None) -> int:
    """A lease (``ttl``, ``extend(seconds)``) as whole milliseconds, at least 1.

    Raises :class:`LockError` unless ``seconds`` is a finite number > 0.
    """
    if not _number(seconds) or not 0 < seconds < math.inf:
        raise LockError(f"{what} must be a positive number of seconds, got {seconds!r}", name=name)
    return max(1, int(seconds * 1000))


def wait_seconds(timeout: object, what: str = "timeout", name: str | None = None) -> float | None:
    """A wait bound: None (wait as long as it takes), or seconds >= 0 (``math.inf`` allowed).

    Raises :class:`LockError` for anything else (a string, a bool, NaN, a negative number).
    """
    if timeout is None:
        return None
    if not _number(timeout) or timeout < 0:
        raise LockError(
            f"{what} must be None or a number of seconds >= 0, got {timeout!r}", name=name
        )
    return timeout


def limit(value: object, name: str | None = None) -> int:
    """A semaphore's limit: an int >= 1 (not a bool), else :class:`LockError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LockError(f"limit must be an int >= 1, got {value!r}", name=name)
    return value


def flag(value: object, what: str, name: str | None = None) -> bool:
    """A bool option (``blocking``, ``reentrant``, ``watchdog``), else :class:`LockError`."""
    if not isinstance(value, bool):
        raise LockError(f"{what} must be True or False, got {value!r}", name=name)
    return value
