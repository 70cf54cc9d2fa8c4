"""Semaphores: how long a permit stays idle while someone waits, and how late a wait ends.

a. Lapsed-lease handoff. P processes share one semaphore (limit L, lease TTL)
   and never release: each takes a permit, lets its lease run out and queues
   again at once. Every grant's start and lease end are read from Redis (the
   holders zset, Redis clock), so the idle time is measured on the server:
   the permit-seconds during which fewer than L permits were held while a
   waiter was queued, in total and per handoff (a handoff is a grant after
   the first L). Ideally each handoff is a few ms (one round trip after the
   lapse is due).
b. Timeout overshoot. With the semaphore full for good, ``acquire(timeout=T)``
   must return False after T seconds; the overshoot is the elapsed time minus
   T (client monotonic clock), for N calls. A wait bounded only by Redis's
   BLPOP timeout ends on the server's ``hz`` tick, up to 100 ms late.

Runs against a private redis-server; Django is set up with the demo settings
(django-redis client, socket timeout 5 s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from . import support

NAME = "bench:sem"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks semaphores", description=__doc__)
    parser.add_argument("--processes", type=int, default=8, help="waiting processes (8)")
    parser.add_argument("--limit", type=int, default=1, help="permits (1)")
    parser.add_argument("--ttl", type=float, default=0.3, help="lease that runs out, s (0.3)")
    parser.add_argument("--rounds", type=int, default=3, help="grants per process (3)")
    parser.add_argument("--timeout", type=float, default=0.05, help="part b: the wait, s (0.05)")
    parser.add_argument("--calls", type=int, default=40, help="part b: calls per kind (40)")
    parser.add_argument(
        "--kinds", default="fair,plain", help="comma-separated: fair, plain (fair,plain)"
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.calls = 1, 10
    return args


def _kind(name: str):
    from stock_locks import FairSemaphore, Semaphore

    return {"fair": FairSemaphore, "plain": Semaphore}[name]


def _flushall(server) -> None:
    """Empty the private redis-server, on a client of its own that is closed after."""
    with server.client() as client:
        client.flushall()


# -- a. lapsed-lease handoff ------------------------------------------------------


def _let_leases_lapse(team, kind: str, limit: int, ttl: float, rounds: int) -> list:
    """Take a permit ``rounds`` times, never releasing; (start ms, end ms) of each grant."""
    from stock_locks.backends.redis import get_redis

    client = get_redis()
    grants = []
    for _ in range(rounds):
        sem = _kind(kind)(NAME, limit, ttl=ttl, timeout=support.SYNC_TIMEOUT)
        if not sem.acquire():
            raise RuntimeError("no permit within the sync timeout")
        end = int(client.zscore(sem.keys.holders, sem.id))
        grants.append((end - int(ttl * 1000), end))  # the script sets end = grant + lease
        # The object is dropped without release(): its lease runs out in Redis.
    return grants


def idle_time(grants: list[tuple[int, int]], limit: int) -> tuple[float, list[float]]:
    """(idle permit-seconds, per-handoff idle seconds) from the grants' (start, end) ms.

    Counted from the L-th grant (the semaphore first full) to the last grant: a
    waiter was queued all that time (the last one granted, at least). A handoff's
    idle is the time from the lapse it replaced (the earliest lease end not yet
    reused) to its start, when positive.
    """
    grants = sorted(grants)
    if len(grants) <= limit:
        return 0.0, []
    window_start, window_end = grants[limit - 1][0], grants[-1][0]
    events = [(s, 1) for s, _ in grants] + [(e, -1) for _, e in grants]
    events.sort()
    held, last, idle = 0, window_start, 0.0
    for at, delta in events:
        lo, hi = max(last, window_start), min(at, window_end)
        if hi > lo:
            idle += (limit - min(held, limit)) * (hi - lo)
        last = max(last, at)
        held += delta
    ends = sorted(e for _, e in grants[:limit])
    handoffs = []
    for start, end in grants[limit:]:
        freed = ends.pop(0)
        handoffs.append(max(0, start - freed) / 1000)
        ends.append(end)
        ends.sort()
    return idle / 1000, handoffs


def handoff(server, args) -> list[str]:
    lines = [
        f"a. Lapsed-lease handoff: {args.processes} processes, limit {args.limit}, "
        f"lease {args.ttl} s, {args.rounds} grants each; nobody releases",
        "",
    ]
    rows = []
    for kind in args.kinds.split(","):
        _flushall(server)
        support.progress(f"handoff: {kind}")
        began = time.monotonic()
        per_process = support.run_workers(
            _let_leases_lapse, args.processes, kind, args.limit, args.ttl, args.rounds
        )
        elapsed = time.monotonic() - began
        grants = [grant for grants in per_process for grant in grants]
        idle, handoffs = idle_time(grants, args.limit)
        ms = [h * 1000 for h in handoffs]
        rows.append(
            [
                kind,
                len(grants),
                f"{idle:.3f}",
                f"{support.median(ms):.1f}",
                f"{support.percentile(ms, 90):.1f}",
                f"{max(ms):.1f}" if ms else "-",
                f"{elapsed:.1f}",
            ]
        )
    lines.append(
        support.table(
            [
                "semaphore",
                "grants",
                "idle permit-s",
                "handoff p50 ms",
                "p90 ms",
                "max ms",
                "run s",
            ],
            rows,
        )
    )
    return lines


# -- b. timeout overshoot -----------------------------------------------------------


def overshoot(server, args) -> list[str]:
    lines = [
        f"b. acquire(timeout={args.timeout}) on a full semaphore, {args.calls} calls: "
        "elapsed minus the timeout",
        "",
    ]
    rows = []
    for kind in args.kinds.split(","):
        _flushall(server)
        holder = _kind(kind)(NAME, 1, ttl=300)
        holder.acquire()
        late = []
        for _ in range(args.calls):
            sem = _kind(kind)(NAME, 1, ttl=300)
            began = time.monotonic()
            if sem.acquire(timeout=args.timeout):
                raise RuntimeError("granted a permit that is held")
            late.append((time.monotonic() - began - args.timeout) * 1000)
        holder.release()
        rows.append(
            [
                kind,
                f"{support.median(late):.1f}",
                f"{support.percentile(late, 90):.1f}",
                f"{max(late):.1f}",
            ]
        )
    lines.append(support.table(["semaphore", "late p50 ms", "p90 ms", "max ms"], rows))
    return lines


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    with support.private_redis() as server:
        support.setup_django(server.url)
        probe = server.client()
        version = support.redis_version(probe)
        hz = probe.config_get("hz")["hz"]
        probe.close()
        lines = [
            "Semaphores: idle permits and late waits",
            f"redis-server {version} (hz {hz}), {os.cpu_count()} CPUs, shared machine",
            "",
        ]
        lines += handoff(server, args)
        lines += [""] + overshoot(server, args)
        lines += ["", support.load_line()]
    if args.quick:
        lines.insert(1, "(--quick smoke run: numbers are rough)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
