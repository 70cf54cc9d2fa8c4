"""Run a function in N real OS processes that each set Django up, and collect results.

The function must be importable (module level in a test module or in
tests/support). Every process gets its index and the given args, waits at a
shared barrier so they all start together, and sends back its return value or
its traceback. Any failure in a child fails the test with that traceback.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
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
        "REDIS_URL": settings.CACHES["default"]["LOCATION"],
        "STOCK_LOCKS_TEST_DB": connection.settings_dict["NAME"],
    }


def _child(func, index, args, env, barrier, results) -> None:  # pragma: no cover - runs in child
    try:
        os.environ.update(env)
        import django

        django.setup()
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
    procs = [
        _ctx.Process(target=_child, args=(func, i, args, env, barrier, results), daemon=True)
        for i in range(n)
    ]
    for proc in procs:
        proc.start()
    collected: dict[int, Any] = {}
    failures = []
    try:
        for _ in range(n):
            try:
                index, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"{n - len(collected) - len(failures)} process(es) hung"
                ) from None
            if ok:
                collected[index] = value
            else:
                failures.append(f"process {index}:\n{value}")
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if failures:
        raise AssertionError("\n".join(failures))
    return [collected[i] for i in range(n)]


def start_process(func: Callable[..., Any], *args: Any) -> multiprocessing.Process:
    """Start ``func(*args)`` in one spawned process with Django set up (no result)."""
    env = child_environment()
    proc = _ctx.Process(target=_run_plain, args=(func, args, env), daemon=True)
    proc.start()
    return proc


def _run_plain(func, args, env) -> None:  # pragma: no cover - runs in child
    os.environ.update(env)
    import django

    django.setup()
    func(*args)


def event() -> Any:
    """An Event shared with processes started by this module."""
    return _ctx.Event()
