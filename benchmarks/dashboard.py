"""What one refresh of the admin dashboard costs as the keyspace grows.

A flash sale leaves keys behind (200,000 paid orders leave their order locks'
fence keys for a while): the dashboard's JSON snapshot must cost what is in use
(held locks, semaphores, delay queues, the stock table), not what the keyspace
holds. With semaphores and delay queues found by SCAN, one refresh took 737 ms at
400k keys against 12 ms on an empty Redis; they are now read from registries of
names in use (stock_locks.backends.redis.registry).

Per keyspace size (unrelated keys added with pipelined MSETs, shaped as order
locks' fence keys), the median time of ``--reps`` snapshots
(stock_locks.dashboard.snapshot.snapshot: charts, locks, semaphores, delay
queues, stock) with a few held locks, semaphores and queues in use, and the
Redis commands one snapshot sends.

Target (issue 23): the refresh cost is flat in the keyspace size: at the largest
size at most 1.5x the empty keyspace's.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from . import support
from .stock import database_url

SIZES = (0, 100_000, 400_000)
TARGET = 1.5
CHUNK = 10_000  # keys per MSET


def parse_args(argv: list[str]) -> Any:
    parser = support.parser("dashboard", __doc__)
    parser.add_argument("--reps", type=int, default=15, help="snapshots per size (15)")
    args = parser.parse_args(argv)
    args.sizes = SIZES if not args.quick else (0, 50_000)
    if args.quick:
        args.reps = 5
    return args


def fill(client: Any, start: int, end: int) -> None:
    """Unrelated keys ``start``..``end - 1``, shaped as order locks' fence keys."""
    for first in range(start, end, CHUNK):
        numbers = range(first, min(first + CHUNK, end))
        client.mset({f"sl:lock:{{order:{n}}}:fence": n for n in numbers})


def scan_lookup(client: Any) -> float:
    """Milliseconds the lookup the dashboard did before the registries takes here: SCAN
    for semaphore keys and for delay-queue keys, 1,000 keys a call (for comparison)."""
    started = time.perf_counter()
    for pattern in ("sl:sem:{*}", "sl:dq:{*}:items"):
        list(client.scan_iter(match=pattern, count=1000))
    return (time.perf_counter() - started) * 1000


def in_use() -> list[Any]:
    """A few held locks, semaphore permits and delay-queue items, as in a sale."""
    from stock_locks import DelayQueue, Lock, Semaphore

    held: list[Any] = []
    for n in range(5):
        lock = Lock(f"bench-dashboard:{n}", ttl=600)
        assert lock.acquire(timeout=0)
        held.append(lock)
    for n in range(3):
        permit = Semaphore(f"bench-exports-{n}", limit=2, ttl=600)
        assert permit.acquire(timeout=0)
        held.append(permit)
    for n in range(3):
        DelayQueue(f"bench-queue-{n}").schedule("bench.task", {"n": n}, delay=600)
    return held


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    load_before = support.load_average()
    db_url, _ = database_url()
    support.ensure_database(db_url)
    with support.private_redis() as server:
        support.setup_django(server.url, db_url)
        from django.core.management import call_command
        from django.db import connections

        from stock_locks.backends.redis import get_redis
        from stock_locks.dashboard.snapshot import snapshot

        call_command("migrate", verbosity=0, interactive=False)
        client = get_redis()
        client.flushall()
        held = in_use()
        lines = support.header(
            "The dashboard's refresh against the keyspace size", server, ["Django", "redis"],
            args.quick,
        )  # fmt: skip
        lines.append(
            f"median of {args.reps} snapshots per size; 5 held locks, 3 semaphores, 3 delay "
            "queues in use"
        )
        rows, medians, scans, filled = [], {}, {}, 0
        for size in args.sizes:
            support.progress(f"{size:,} keys")
            fill(client, filled, size)
            filled = max(filled, size)
            snapshot()  # warm: connections, templates of the charts
            client.config_resetstat()
            times = []
            for _ in range(args.reps):
                started = time.perf_counter()
                snapshot()
                times.append((time.perf_counter() - started) * 1000)
            calls = support.command_calls(client)
            medians[size] = support.median(times)
            scans[size] = scan_lookup(client)
            rows.append([
                f"{client.dbsize():,}", f"{medians[size]:.1f}",
                f"{medians[size] / medians[args.sizes[0]]:.2f}x",
                round(sum(calls.values()) / args.reps), calls.get("scan", 0),
                f"{scans[size]:.1f}",
            ])  # fmt: skip
            support.figure(f"dashboard.{size}", medians[size])
        for primitive in held:
            primitive.release()
        lines += [
            "",
            support.table(
                [
                    "keys in Redis",
                    "ms per refresh",
                    "vs empty",
                    "commands per refresh",
                    "SCAN",
                    "the old SCAN lookup (ms)",
                ],  # fmt: skip
                rows,
            ),
            "",
        ]
        worst = medians[args.sizes[-1]] / medians[args.sizes[0]]
        lines.append(
            f"target: flat in the keyspace: {args.sizes[-1]:,} keys / empty {worst:.2f}x "
            f"<= {TARGET}x: {support.verdict(worst <= TARGET)}"
        )
        lines += ["", support.load_line(load_before)]
        connections.close_all()
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
