"""Helpers of the contract suite: capability requirements, the backend settings a
spawned process needs, where a waiter sleeps, and the critical-section journal.

Nothing here knows a backend: the journal is a plain file the processes append to
(``O_APPEND``: each line lands whole, in the order the writes happened), and a
waiter is known to sleep when its thread is inside the backend operation the
base interface names for it (``lock_wait``, ``semaphore_wait``).
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from tests.contract import modes
from tests.support.waiting import TIMEOUT, wait_until


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Mark a contract test as needing ``capabilities`` (names from
    ``stock_locks.backends.base``); the ``backend`` fixture skips it on a backend
    whose ``capabilities`` lack one, naming it."""
    return pytest.mark.requires(*capabilities)


def backends_setting() -> dict[str, Any]:
    """The ``STOCK_LOCKS["BACKENDS"]`` in force now (what a spawned process must use)."""
    return copy.deepcopy(getattr(django_settings, "STOCK_LOCKS", {}).get("BACKENDS", {}))


@contextmanager
def backends_configured(backends: dict[str, Any]) -> Iterator[None]:
    """``STOCK_LOCKS["BACKENDS"] = backends``, the rest of STOCK_LOCKS as it is."""
    merged = {**getattr(django_settings, "STOCK_LOCKS", {}), "BACKENDS": backends}
    with override_settings(STOCK_LOCKS=merged):
        yield


def sleeping_in(thread: threading.Thread, operation: str) -> bool:
    """Whether ``thread`` is inside a backend's ``operation`` (e.g. ``"lock_wait"``):
    in the backend's ``execute`` of a call of that verb (in the async mode: its
    actor task awaits the backend's ``aexecute`` of one)."""
    if modes.mode() == "async":
        return modes.waiting_in(thread, operation)
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "execute":
            call = frame.f_locals.get("call")
            if getattr(call, "verb", None) == operation:
                return True
        frame = frame.f_back
    return False


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``target()`` in a daemon thread; its result (or exception) lands in the list."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(target())
        except BaseException as exc:  # handed to the test, which asserts on it
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def child_signalled(signal: Any, process: Any) -> None:
    """Wait until the spawned ``process`` sets ``signal`` (an Event); fail at once if it
    exits first (its traceback is on stderr)."""
    wait_until(
        lambda: signal.is_set() or process.exitcode is not None,
        what="the child process to signal",
    )
    assert signal.is_set(), f"child process exited with {process.exitcode} before signalling"


def joined(thread: threading.Thread, result: list[Any]) -> Any:
    """``thread``'s result once it ended (re-raising what it raised)."""
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "thread still running after TIMEOUT"
    assert len(result) == 1, "thread ended without a result"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


# -- the journal of critical sections ------------------------------------------------


def record(path: str, *fields: object) -> None:
    """Append one line (whitespace-separated fields) to the journal at ``path``."""
    line = " ".join(str(field) for field in fields) + "\n"
    with open(path, "a", encoding="ascii") as journal:
        journal.write(line)


def entries(path: str | Path) -> list[list[str]]:
    """The journal's lines, split into fields, in the order they were written."""
    return [line.split() for line in Path(path).read_text(encoding="ascii").splitlines()]
