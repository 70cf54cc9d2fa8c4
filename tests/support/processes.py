"""Run a function in N real OS processes that each set Django up, and collect results.

The function must be importable (module level in a test module or in
tests/support); it travels by name and is imported after ``django.setup()``,
since test modules import models. Every process gets its index and the given
args, waits at a shared barrier so they all start together, and sends back its
return value or its traceback. Any failure in a child fails the test with that
traceback; a child that dies without reporting fails it at once.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from .waiting import TIMEOUT

_ctx = multiprocessing.get_context("spawn")


def child_environment() -> dict[str, str]:
    """What a spawned process needs to reach the same Redis and test database."""
    from django.conf import settings
    from django.db import connection

    return {
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "REDIS_URL": settings.CACHES["stock_locks"]["LOCATION"],
        "STOCK_LOCKS_TEST_DB": connection.settings_dict["NAME"],
    }


def _reference(func: Callable) -> str:
    return f"{func.__module__}:{func.__qualname__}"


def _setup_and_import(env: dict[str, str], reference: str) -> Callable:
    os.environ.update(env)
    import django

    django.setup()
    module, name = reference.split(":")
    return getattr(importlib.import_module(module), name)


def _child(reference, index, args, env, barrier, results) -> None:  # runs in the child
    try:
        func = _setup_and_import(env, reference)
        barrier.wait(timeout=TIMEOUT)
        results.put((index, True, func(index, *args)))
    except BaseException:
        results.put((index, False, traceback.format_exc()))


def run_in_processes(
    func: Callable[..., Any], n: int, *args: Any, timeout: float = TIMEOUT * 4
) -> list[Any]:
    """Call ``func(index, *args)`` in ``n`` processes at once; results in index order."""
    env = child_environment()
    barrier = _ctx.Barrier(n)
    results = _ctx.Queue()
    reference = _reference(func)
    procs = [
        _ctx.Process(target=_child, args=(reference, i, args, env, barrier, results), daemon=True)
        for i in range(n)
    ]
    for proc in procs:
        proc.start()
    collected: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(collected) + len(failures) < n:
            try:
                index, ok, value = results.get(timeout=0.1)
            except queue.Empty:
                silent = [
                    i
                    for i, proc in enumerate(procs)
                    if proc.exitcode is not None and i not in collected and i not in failures
                ]
                if silent and results.empty():
                    failures[silent[0]] = f"exited with {procs[silent[0]].exitcode}, no result"
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"processes hung after {timeout}s") from None
                continue
            if ok:
                collected[index] = value
            else:
                failures[index] = value
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if failures:
        raise AssertionError("\n".join(f"process {i}: {text}" for i, text in failures.items()))
    return [collected[i] for i in range(n)]


def start_process(func: Callable[..., Any], *args: Any) -> multiprocessing.Process:
    """Start ``func(*args)`` in one spawned process with Django set up (no result)."""
    env = child_environment()
    proc = _ctx.Process(target=_run_plain, args=(_reference(func), args, env), daemon=True)
    proc.start()
    return proc


def _run_plain(reference, args, env) -> None:  # runs in the child
    _setup_and_import(env, reference)(*args)


def event() -> Any:
    """An Event shared with processes started by this module."""
    return _ctx.Event()
