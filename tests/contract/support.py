"""Helpers of the contract suite: capability requirements, the backend settings a
spawned process needs, where a waiter sleeps, and the critical-section journal.

Nothing here knows a backend: the journal is a plain file the processes append to
(``O_APPEND``: each line lands whole, in the order the writes happened), and a
waiter is known to sleep when its thread is inside the backend operation the
base interface names for it (``lock_wait``, ``semaphore_wait``).
"""

from __future__ import annotations

import asyncio
import copy
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

import stock_locks
from stock_locks import aio
from tests.contract import modes
from tests.support.fault_proxy import Interrupted, raise_interrupted
from tests.support.waiting import TIMEOUT, wait_until


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Mark a contract test as needing ``capabilities`` (names from
    ``stock_locks.backends.base``); the ``backend`` fixture skips it on a backend
    whose ``capabilities`` lack one, naming it."""
    return pytest.mark.requires(*capabilities)


@pytest.fixture(params=modes.MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each execution mode, for a test that configures its own backend (the ``backend``
    fixture's kinds do not fit it): ``tests.contract.modes``' primitives follow it."""
    monkeypatch.setenv(modes.MODE_ENV, request.param)
    try:
        yield request.param
    finally:
        if request.param == "async":
            modes.close_async_resources()


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
    """Whether ``thread`` is inside a backend's ``operation`` (e.g. ``"lock_wait"``, or
    a variant of it such as ``"lock_wait_try"``): in the backend's ``execute`` of a
    call of that verb (in the async mode: its actor task awaits the backend's
    ``aexecute`` of one)."""
    if modes.mode() == "async":
        return modes.waiting_in(thread, operation)
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "execute":
            call = frame.f_locals.get("pending")
            if modes.is_verb(getattr(call, "verb", None), operation):
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


def interrupted_acquire(
    name: str, *, backend: str, sent: Callable[[], bool], ttl: float = 300
) -> BaseException:
    """Acquire ``name`` on a Redis backend in the current mode and interrupt it once
    ``sent()`` is true (its try ran on the server and the reply is still on its way)
    and it waits for that reply: in the sync mode by a signal whose handler raises in
    the main thread (inside redis-py's read of the reply), as Ctrl-C or a Celery soft
    time limit does; in the async mode by cancelling its task. The exception the
    acquire ended with (it gave back what it may hold first); it must not return."""
    if modes.mode() == "async":
        return modes.loop_thread().submit(_cancelled_acquire(name, backend, sent, ttl))
    main, main_ident = threading.main_thread(), threading.main_thread().ident
    assert threading.current_thread() is main and main_ident, "a signal interrupts the main thread"
    lock = stock_locks.Lock(name, ttl=ttl, backend=backend)
    acquiring = threading.Event()

    def interrupt() -> None:
        wait_until(
            lambda: (sent() and _reading_a_reply(main_ident)) or not acquiring.is_set(),
            what=f"the try of {name!r} sent, its caller reading the reply",
        )
        if acquiring.is_set():
            signal.pthread_kill(main_ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    acquiring.set()
    watcher, result = in_thread(interrupt)
    try:
        try:
            granted = lock.acquire()
        except Interrupted as exc:
            return exc
        finally:
            acquiring.clear()
        raise AssertionError(f"the interrupted acquire returned {granted!r}")
    finally:
        joined(watcher, result)
        signal.signal(signal.SIGUSR1, previous)


def _reading_a_reply(ident: int) -> bool:
    """Whether thread ``ident`` is inside redis-py's parser, reading a reply."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "read_response" and "_parsers" in code.co_filename:
            return True
        frame = frame.f_back
    return False


async def _cancelled_acquire(
    name: str, backend: str, sent: Callable[[], bool], ttl: float
) -> BaseException:
    task = asyncio.create_task(aio.Lock(name, ttl=ttl, backend=backend).acquire())
    # (the predicate may block on I/O: in a worker thread, the loop keeps running)
    await asyncio.to_thread(
        wait_until, lambda: sent() or task.done(), what=f"the try of {name!r} sent"
    )
    task.cancel()
    try:
        granted = await task
    except asyncio.CancelledError as exc:
        return exc
    raise AssertionError(f"the cancelled acquire returned {granted!r}")


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
