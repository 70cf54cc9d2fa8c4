"""Helpers shared by the benchmarks: a private redis-server, Django set-up, creating the
PostgreSQL database, worker processes that start together, counting replies and server
commands, percentiles and plain-text tables.

Nothing here talks to the system Redis: every benchmark starts its own
redis-server on a free port (``tests.support.redis_servers.RedisServer``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import queue
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import redis

from tests.support.redis_servers import RedisServer

SETTINGS_MODULE = "demo_shop.settings"
# Longest a worker waits for the others at a barrier, and default bound on a whole run.
SYNC_TIMEOUT = 120.0  # seconds

# What a spawned worker inherits from this process's environment.
ENV_PASSED = ("DJANGO_SETTINGS_MODULE", "DJANGO_DEBUG", "REDIS_URL", "DATABASE_URL")

_ctx = multiprocessing.get_context("spawn")

# Figures a benchmark hands to the report (benchmarks/report.py) beside its text:
# figure(key, value) during a run; __main__ collects them per module.
FIGURES: dict[str, Any] = {}


def figure(key: str, value: Any) -> None:
    """Keep ``value`` (numbers, lists of samples, dicts of them) for the report's plots."""
    FIGURES[key] = value


def progress(message: str) -> None:
    """A progress line on stderr (reports go to stdout)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- Redis and Django ---------------------------------------------------------


@contextmanager
def private_redis(*extra_args: str) -> Iterator[RedisServer]:
    """A redis-server of our own on a free port; stopped and removed on exit."""
    with private_redis_servers(1, *extra_args) as (server,):
        yield server


@contextmanager
def private_redis_servers(count: int, *extra_args: str) -> Iterator[list[RedisServer]]:
    """``count`` independent redis-servers of our own, each on a free port; all stopped
    (by PID) and removed on exit, also when one of them fails to start."""
    servers: list[RedisServer] = []
    try:
        for _ in range(count):
            server = RedisServer(*extra_args)
            servers.append(server)
            server.start()
        yield servers
    finally:
        for server in servers:
            server.cleanup()


def configure_stock_locks(**values: Any) -> Any:
    """Override keys of Django's ``STOCK_LOCKS`` setting (e.g. ``BACKENDS``) through
    ``override_settings``, so ``setting_changed`` reloads stock_locks' settings and
    drops its backends; returns the override (``.disable()`` undoes it). Django must
    be set up."""
    from django.conf import settings
    from django.test import override_settings

    override = override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, **values})
    override.enable()
    return override


def redis_version(client: Any) -> str:
    return str(client.info("server")["redis_version"])


class CountingConnection(redis.Connection):
    """Counts replies read (in ``CountingConnection.replies``, reset it before a run):
    client round trips when nothing is pipelined, else one per command sent."""

    replies = 0

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        CountingConnection.replies += 1
        return super().read_response(*args, **kwargs)


def server_cpu(client: Any) -> float:
    """Seconds of CPU (user + system) the redis-server of ``client`` has used."""
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def command_calls(client: Any) -> Counter:
    """Commands run on the server of ``client`` since its last CONFIG RESETSTAT, by
    name (commands run inside Lua included), leaving out ours: CONFIG and INFO."""
    calls: Counter = Counter()
    for key, value in client.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name.split("|")[0] not in ("config", "info"):
            calls[name] += value["calls"]
    return calls


def setup_django(redis_url: str, database_url: str | None = None) -> None:
    """Set Django up with the demo settings, pointing ``REDIS_URL`` at ``redis_url`` and,
    when given, ``DATABASE_URL`` at ``database_url``.

    Safe to call again with other URLs (a later benchmark's server or database):
    the default cache is then repointed and its client dropped, and the default
    database connection closed and reconfigured.
    """
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    # As a shop in production runs: without DEBUG, whose cursor records every query
    # (the demo settings turn it on unless DJANGO_DEBUG=0).
    os.environ.setdefault("DJANGO_DEBUG", "0")
    previous = os.environ.get("REDIS_URL")
    os.environ["REDIS_URL"] = redis_url
    previous_db = os.environ.get("DATABASE_URL")
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()
        return
    from django.conf import settings

    if previous != redis_url:
        from django.core.cache import caches

        from demo_shop.settings import redis_db

        settings.REDIS_URL = redis_url
        # As demo_shop/settings.py (which spawned workers read): Django's cache on
        # REDIS_URL, stock_locks' alias on its database 1 unless STOCK_LOCKS_REDIS_URL.
        settings.CACHES["default"]["LOCATION"] = redis_url
        settings.CACHES["stock_locks"]["LOCATION"] = os.environ.get(
            "STOCK_LOCKS_REDIS_URL"
        ) or redis_db(redis_url, 1)
        for alias in ("default", "stock_locks"):
            caches[alias].close()
            del caches[alias]
        from stock_locks import backends
        from stock_locks.stock import soldout

        backends.reset()  # (their clients are the old server's)
        soldout.reset()
    if database_url and previous_db != database_url:
        import dj_database_url
        from django.db import connections

        connections.close_all()
        settings.DATABASES["default"] = dj_database_url.parse(database_url, conn_max_age=60)
        connections.__dict__.pop("settings", None)  # a cached_property: read again
        for alias in list(connections):
            with suppress(AttributeError):
                delattr(connections._connections, alias)


def ensure_database(url: str) -> bool:
    """Create the PostgreSQL database of ``url`` when it is missing; True when created."""
    import dj_database_url

    config = dj_database_url.parse(url)
    if "postgresql" not in config["ENGINE"]:
        return False
    import psycopg
    from psycopg import sql

    params = {
        "host": config.get("HOST") or None,
        "port": config.get("PORT") or None,
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
    }
    params = {key: value for key, value in params.items() if value is not None}
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params) as conn:
        name = config["NAME"]
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return True


# -- worker processes ---------------------------------------------------------


class Team:
    """What a worker gets: its ``index``, the team ``size`` and ``sync()``, a barrier
    shared by all workers (use it to start phases together)."""

    def __init__(self, index: int, size: int, barrier: Any) -> None:
        self.index = index
        self.size = size
        self._barrier = barrier

    def sync(self) -> None:
        self._barrier.wait(SYNC_TIMEOUT)


def _worker(func, team, args, env, results) -> None:  # runs in the child
    try:
        os.environ.update(env)
        import django

        django.setup()
        team.sync()  # everyone has imported and set up: start together
        results.put((team.index, True, func(team, *args)))
    except BaseException:
        results.put((team.index, False, traceback.format_exc()))


def run_workers(
    func: Callable[..., Any], n: int, *args: Any, timeout: float = SYNC_TIMEOUT * 5
) -> list[Any]:
    """Run ``func(team, *args)`` in ``n`` spawned processes with Django set up (same
    settings, ``REDIS_URL`` and ``DATABASE_URL`` as this process); return their results
    in index order.

    ``func`` must be importable (module level). All workers pass a barrier after
    set-up, so their first instruction runs at the same time. A worker that raises
    breaks the barrier for the others and the call raises RuntimeError with its
    traceback.
    """
    env = {k: os.environ[k] for k in ENV_PASSED if k in os.environ}
    barrier = _ctx.Barrier(n)
    results = _ctx.Queue()
    procs = [
        _ctx.Process(
            target=_worker, args=(func, Team(i, n, barrier), args, env, results), daemon=True
        )
        for i in range(n)
    ]
    for proc in procs:
        proc.start()
    collected: dict[int, Any] = {}
    failures: list[str] = []
    try:
        for _ in range(n):
            try:
                index, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"{n - len(collected) - len(failures)} worker(s) hung") from None
            if ok:
                collected[index] = value
            else:
                failures.append(f"worker {index}:\n{value}")
                barrier.abort()
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if failures:
        raise RuntimeError("\n".join(failures))
    return [collected[i] for i in range(n)]


# -- measuring ----------------------------------------------------------------


def rotated(kinds: Sequence[Any], r: int) -> list[Any]:
    """``kinds`` starting at the ``r``-th: each round starts with another contender."""
    kinds = list(kinds)
    return kinds[r % len(kinds) :] + kinds[: r % len(kinds)]


def timed_calls(call: Callable[[], Any], seconds: float, batch: int = 50) -> tuple[float, float]:
    """Calls per second of ``call()`` for ``seconds`` (the clock read every ``batch``
    calls), and this process's CPU per call in microseconds (user + system, every
    thread's, so the socket calls count)."""
    calls = 0
    clock = time.perf_counter
    cpu = time.process_time()
    start = clock()
    end = start + seconds
    while True:
        for _ in range(batch):
            call()
        calls += batch
        now = clock()
        if now >= end:
            return calls / (now - start), (time.process_time() - cpu) / calls * 1e6


def busy(seconds: float) -> None:
    """Spin on the CPU for ``seconds`` (work that holds the CPU, unlike sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def dist_version(dist: str) -> str:
    """The installed version of distribution ``dist``, or "?"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def load_average() -> str:
    """The load average over 1/5/15 minutes, as "a/b/c"."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def load_line(before: str | None = None) -> str:
    """The report's closing line: the load average now (and ``before``, taken with
    ``load_average()`` at the start, when given)."""
    cpus = f"{os.cpu_count()} CPUs, shared machine"
    if before is None:
        return f"Load average (1/5/15 min) at the end: {load_average()} ({cpus})"
    return (
        f"Load average (1/5/15 min) at start {before}, at end {load_average()} ({cpus}): "
        "compare within a run, not across runs."
    )


# -- the report's frame -------------------------------------------------------


def parser(name: str, doc: str | None, sections: str = "") -> argparse.ArgumentParser:
    """The argument parser of benchmark ``name``: its docstring as help, ``--quick``,
    and ``--only`` when it has lettered ``sections``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    if sections:
        parser.add_argument(
            "--only", choices=list(sections), action="append", help="run only these sections"
        )
    return parser


def header(title: str, server: Any, dists: Sequence[str], quick: bool = False) -> list[str]:
    """A report's first lines: ``title`` and the time, the redis-server of ``server``
    (a RedisServer), Python and the machine, the versions of ``dists``."""
    with server.client() as client:
        version = redis_version(client)
    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "Python"
    names = {"redis": f"redis-py {dist_version('redis')} ({parser} parser)"}
    lines = [
        f"{title}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"redis-server {version} (private, 127.0.0.1); Python {platform.python_version()} "
        f"on {platform.machine()}; {os.cpu_count()} CPUs",
        ", ".join(names.get(dist, f"{dist} {dist_version(dist)}") for dist in dists),
    ]
    if quick:
        lines.append("(--quick smoke run: short measurements, numbers are rough)")
    return lines


# -- statistics and tables ----------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (0-100) by linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    data = sorted(values)
    rank = (len(data) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned text columns: numbers (and number-like text) right, text left."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    right = [
        all(_numeric(row[i]) for row in cells[1:]) and len(cells) > 1 for i in range(len(headers))
    ]
    lines = []
    for n, row in enumerate(cells):
        parts = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    head = text.split(" ")[0].rstrip("x%")
    try:
        float(head.replace(",", ""))
    except ValueError:
        return text in ("-", "n/a", "nan")
    return True


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"
