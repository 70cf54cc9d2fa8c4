"""One spawned process per actor of a fault scenario, with its result, its pause and its database.

``run_in_processes`` (tests/support/processes.py) starts N identical buyers
at a barrier; a fault scenario needs named actors instead ("holder A", "buyer
B") that the test pauses, resumes and waits on one by one:

    a = Child(_hold_and_buy, "a", pause_marker, env={"PGAPPNAME": "faults-a"})
    wait_until(a.paused, what="A at its marker")     # A stopped itself (SIGSTOP)
    ...
    a.resume()                                       # SIGCONT
    outcome = a.result()                             # its return value, or its traceback

A child stops *itself* at a marker (:func:`stop_here`), so the test never
races a signal against the code it wants to interrupt. ``PGAPPNAME`` names
the child's PostgreSQL sessions, so the test can see from ``pg_stat_activity``
that a child is waiting on a row lock (:func:`waiting_on_a_lock`) rather than
running or paused.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import queue
import signal
import traceback
from collections.abc import Callable
from typing import Any

from .processes import child_environment
from .waiting import TIMEOUT, wait_until

_ctx = multiprocessing.get_context("spawn")
_children: list[Child] = []  # started and not yet reaped, for kill_children()


def stop_here(marker: Any) -> None:
    """In a child: set ``marker`` (an Event from :func:`marker`), then SIGSTOP this process.

    The test sees the marker, sees the process stopped, and later SIGCONTs it:
    a real pause of every thread, as a GC pause or a frozen VM gives.
    """
    marker.set()
    os.kill(os.getpid(), signal.SIGSTOP)


def marker() -> Any:
    """An Event to hand to a child (set by :func:`stop_here`)."""
    return _ctx.Event()


def is_stopped(pid: int) -> bool:
    """Whether the process ``pid`` is stopped by a signal (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] in ("T", "t")


def _run(reference: str, args: tuple, env: dict[str, str], results: Any) -> None:  # in the child
    try:
        os.environ.update(env)
        import django

        django.setup()
        module, name = reference.split(":")
        func = getattr(importlib.import_module(module), name)
        results.put(("ok", func(*args)))
    except BaseException:
        results.put(("error", traceback.format_exc()))


class Child:
    """``func(*args)`` in a spawned process with Django set up on the test's Redis and database.

    ``env`` is added to the child's environment (e.g. ``PGAPPNAME``).
    """

    def __init__(self, func: Callable[..., Any], *args: Any, env: dict[str, str] | None = None):
        self._results = _ctx.Queue()
        self._outcome: tuple[str, Any] | None = None
        environment = {**child_environment(), **(env or {})}
        reference = f"{func.__module__}:{func.__qualname__}"
        self.process = _ctx.Process(
            target=_run, args=(reference, args, environment, self._results), daemon=True
        )
        self.process.start()
        _children.append(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stopped(self) -> bool:
        return is_stopped(self.pid)

    def resume(self) -> None:
        """SIGCONT (harmless when the child is not stopped)."""
        if self.process.is_alive():
            os.kill(self.pid, signal.SIGCONT)

    def _poll(self, timeout: float | None) -> bool:
        if self._outcome is None:
            try:
                if timeout is None:
                    self._outcome = self._results.get_nowait()
                else:
                    self._outcome = self._results.get(timeout=timeout)
            except queue.Empty:
                return False
        return True

    def done(self) -> bool:
        """Whether the child has reported its outcome."""
        return self._poll(None)

    def result(self, timeout: float = TIMEOUT) -> Any:
        """The child's return value; AssertionError with its traceback if it raised or hung."""
        if not self._poll(timeout):
            state = "stopped" if self.stopped() else "running"
            self.kill()
            raise AssertionError(f"child {self.pid} gave no result within {timeout}s ({state})")
        kind, value = self._outcome
        self.process.join(timeout=TIMEOUT)
        if kind == "error":
            raise AssertionError(f"child {self.pid} failed:\n{value}")
        return value

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=TIMEOUT)


def wait_stopped(child: Child, pause: Any, what: str) -> None:
    """Wait until ``child`` stopped itself at ``pause``; fail at once with its
    traceback (or result) if it ended without getting there."""

    def there() -> bool:
        if child.done():
            raise AssertionError(f"{what}: the child ended first with {child.result()!r}")
        return pause.is_set() and child.stopped()

    wait_until(there, interval=0.01, what=what)


def kill_children() -> None:
    """SIGKILL every child still alive (a stopped one ignores SIGTERM and would keep
    its database transaction open, blocking the test database's flush)."""
    while _children:
        _children.pop().kill()


def waiting_on_a_lock(application_name: str) -> bool:
    """Whether a PostgreSQL session named ``application_name`` waits on a lock now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s "
            "AND wait_event_type = 'Lock'",
            [application_name],
        )
        return cursor.fetchone()[0] > 0


def wait_paused_blocked_or_done(child: Child, pause: Any, application_name: str, what: str) -> str:
    """Wait until ``child`` stopped at its marker, waits on a database lock, or finished.

    Returns "paused", "blocked" or "done". A child blocked on a row lock that
    a paused holder took is a correct design too (the database serialises
    them); the scenario then goes on without that child's pause.
    """

    def state() -> str | None:
        if pause.is_set() and child.stopped():
            return "paused"
        if child.done():
            return "done"
        if waiting_on_a_lock(application_name):
            return "blocked"
        return None

    return wait_until(state, interval=0.01, what=what)
