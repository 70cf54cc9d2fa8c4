"""What correctness costs: the ZooKeeper lock beside the Redis Lock and RedLock x3.

Every server is private (127.0.0.1, free ports, stopped by PID): 3 redis-servers
as independent masters (the Redis Lock uses the first, RedLock x3 all three),
one more for the contended test's inside counter, one standalone ZooKeeper
server and a 3-node ZooKeeper ensemble (``tests.support.zookeeper_servers``:
Debian's package, no fsync, ticks of 200 ms).

a. Uncontended acquire+release cycles/s, one reused lock object each: the
   stock_locks ``Lock`` on the default backend (one Redis), ``RedLock`` over 3
   masters, and ``Lock`` on a ``ZooKeeperBackend`` on one ZooKeeper server and
   on the 3-node ensemble. Interleaved rounds, order rotated each round; ratios
   are medians of same-round ratios (the machine is shared and noisy: compare
   within a run, not across runs). Every contender's fences are checked
   strictly increasing.
b. Contended: P processes loop on one name per contender: sections/s and the
   wait from calling ``acquire()`` to the grant (p50/p99), mutual exclusion
   checked with an INCR/DECR inside counter on the separate redis-server (never
   above 1), fences in grant order strictly increasing.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import redis

from tests.support.zookeeper_servers import (
    ZooKeeperEnsemble,
    ZooKeeperServer,
    four_letters,
    zookeeper_backend,
)

from . import support

NAME = "bench:zookeeper"
INSIDE = "bench:inside"
TTL = 30  # seconds (a lease on Redis; on ZooKeeper only a waiter's safety-net sleep)
BATCH = 10
SEGMENT = 0.3  # seconds, one contender's share of one uncontended round
KINDS = ("lock1", "redlock3", "zk1", "zk3")
LABELS = {
    "lock1": "Lock, one Redis",
    "redlock3": "RedLock, 3 Redis masters",
    "zk1": "Lock, ZooKeeper (1 server)",
    "zk3": "Lock, ZooKeeper (3-node ensemble)",
}
HOW_THEY_WAIT = {
    "lock1": "BLPOP wake-up",
    "redlock3": "BLPOP wake-up on one master",
    "zk1": "watch on the predecessor",
    "zk3": "watch on the predecessor",
}
REDLOCK_BACKEND = "stock_locks.backends.redlock.RedLockBackend"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks zookeeper",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument("--seconds", type=float, help="a: measured seconds per contender (3)")
    parser.add_argument("--processes", type=int, default=4, help="b: contending processes (4)")
    parser.add_argument(
        "--contended-seconds", type=float, help="b: measured seconds per contender (3)"
    )
    parser.add_argument("--rounds", type=int, help="b: interleaved rounds (3; quick 1)")
    parser.add_argument("--work-ms", type=float, default=1.0, help="b: busy work inside (1)")
    parser.add_argument("--outside-ms", type=float, default=1.0, help="b: sleep outside (1)")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (0.9 if args.quick else 3.0)
    args.contended_seconds = args.contended_seconds or (0.9 if args.quick else 3.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.segments = max(3, round(args.seconds / SEGMENT))
    args.warmup = 0.3 if args.quick else 1.0  # (the ZooKeeper JVMs need it: JIT)
    return args


@contextmanager
def zookeepers() -> Iterator[tuple[ZooKeeperServer, ZooKeeperEnsemble]]:
    single, ensemble = ZooKeeperServer(), ZooKeeperEnsemble(3)
    try:
        ensemble.start()
        single.start()
        yield single, ensemble
    finally:
        single.cleanup()
        ensemble.cleanup()


def backends(master_urls: list[str], zk1: str, zk3: str) -> dict[str, dict]:
    """``STOCK_LOCKS["BACKENDS"]`` of the run ("default": the first master)."""
    return {
        "redlock3": {"BACKEND": REDLOCK_BACKEND, "LOCATION": master_urls},
        "zk1": zookeeper_backend(zk1, "/bench", session_timeout=10),
        "zk3": zookeeper_backend(zk3, "/bench", session_timeout=10),
    }


def make_lock(kind: str) -> Any:
    from stock_locks import Lock, RedLock

    if kind == "lock1":
        return Lock(NAME, TTL)
    if kind == "redlock3":
        return RedLock(NAME, TTL, backend="redlock3")
    return Lock(NAME, TTL, backend=kind)


def timed_cycles(lock: Any, seconds: float) -> tuple[float, bool]:
    """Cycles per second for ``seconds``, and whether the fences strictly increased."""
    acquire, release = lock.acquire, lock.release
    cycles, last, rising = 0, 0, True
    clock = time.perf_counter
    start = clock()
    end = start + seconds
    while True:
        for _ in range(BATCH):
            if not acquire():
                raise RuntimeError("an uncontended acquire was refused")
            fence = lock.fence
            rising &= fence > last
            last = fence
            release()
        cycles += BATCH
        now = clock()
        if now >= end:
            return cycles / (now - start), rising


def uncontended(args: argparse.Namespace) -> list[str]:
    locks = {kind: make_lock(kind) for kind in KINDS}
    support.progress("uncontended: warm-up")
    for kind in KINDS:
        timed_cycles(locks[kind], args.warmup)
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    rising = dict.fromkeys(KINDS, True)
    support.progress(f"uncontended: {args.segments} rounds of {len(KINDS)} contenders")
    for r in range(args.segments):
        for kind in support.rotated(KINDS, r):
            rate, ok = timed_cycles(locks[kind], args.seconds / args.segments)
            rates[kind].append(rate)
            rising[kind] &= ok
    rows = []
    for kind in KINDS:
        rate = support.median(rates[kind])
        support.FIGURES.setdefault("uncontended cycles/s (zookeeper)", {})[LABELS[kind]] = rate
        rows.append(
            [
                LABELS[kind],
                f"{rate:,.0f}",
                f"{min(rates[kind]):,.0f}-{max(rates[kind]):,.0f}",
                f"{1e6 / rate:.0f}",
                f"{support.median(paired(rates[kind], rates['lock1'])):.2f}x",
                f"{support.median(paired(rates[kind], rates['redlock3'])):.2f}x",
                "strictly increasing" if rising[kind] else "NOT INCREASING",
            ]
        )
    return [
        f"a. Uncontended acquire+release, one reused lock object each: {args.segments} "
        f"interleaved rounds x {args.seconds / args.segments:.2f} s per contender (after "
        f"{args.warmup:g} s warm-up), order rotated each round; cycles/s: median of rounds",
        "",
        support.table(
            [
                "contender",
                "cycles/s",
                "rounds min-max",
                "us/cycle",
                "vs Lock*",
                "vs RedLock*",
                "fences",
            ],
            rows,
        ),  # fmt: skip
        "",
        "* median over rounds of (cycles/s / the other's in the same round).",
    ]


def paired(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True) if y]


def contended_worker(team, backends_setting, counter_url, plan, work_ms, outside_ms, warmup):
    """One process of the contended test: every phase of ``plan`` in step with the
    others; per phase its sections (acquire called, granted, fence) and counts."""
    from stock_locks.exceptions import StockLocksError

    support.configure_stock_locks(BACKENDS=backends_setting)
    counter = redis.Redis.from_url(counter_url)
    phases = []
    for kind, seconds in plan:
        lock = make_lock(kind)
        team.sync()
        if team.index == 0:
            counter.flushall()
        team.sync()
        measure_from = time.monotonic() + warmup
        stop = measure_from + seconds
        samples, violations, errors = [], 0, 0
        while time.monotonic() < stop:
            t0 = time.monotonic()
            try:
                if not lock.acquire():
                    raise RuntimeError(f"{kind}: a blocking acquire returned False")
            except StockLocksError:
                errors += 1
                continue
            t1 = time.monotonic()
            if counter.incr(INSIDE) != 1:
                violations += 1
            support.busy(work_ms / 1000)
            counter.decr(INSIDE)
            fence = lock.fence
            try:
                lock.release()
            except StockLocksError:
                errors += 1
            samples.append((t0, t1, fence))
            time.sleep(outside_ms / 1000)
        phases.append(
            {"kind": kind, "measure_from": measure_from, "stop": stop, "samples": samples,
             "violations": violations, "errors": errors}
        )  # fmt: skip
    counter.close()
    return phases


def contended(args: argparse.Namespace, backends_setting: dict, counter_url: str) -> list[str]:
    per_phase = args.contended_seconds / args.rounds
    plan = [(kind, per_phase) for r in range(args.rounds) for kind in support.rotated(KINDS, r)]
    support.progress(f"contended: {args.processes} processes, {len(plan)} phases")
    results = support.run_workers(
        contended_worker, args.processes, backends_setting, counter_url, plan, args.work_ms,
        args.outside_ms, args.warmup,
    )  # fmt: skip
    stats = {
        kind: {"rates": [], "waits": [], "violations": 0, "errors": 0, "fences": 0, "ok": True}
        for kind in KINDS
    }
    for p, (kind, _) in enumerate(plan):
        phase = [worker[p] for worker in results]
        lo = max(w["measure_from"] for w in phase)
        hi = min(w["stop"] for w in phase)
        entry = stats[kind]
        grants = []
        in_window = 0
        for w in phase:
            entry["violations"] += w["violations"]
            entry["errors"] += w["errors"]
            for t0, t1, fence in w["samples"]:
                grants.append((t1, fence))
                in_window += lo <= t1 < hi
                if lo <= t0 < hi:
                    entry["waits"].append(t1 - t0)
        grants.sort()
        fences = [fence for _, fence in grants]
        entry["fences"] += len(fences)
        entry["ok"] &= all(a < b for a, b in pairwise(fences))
        entry["rates"].append(in_window / (hi - lo))
    rows = []
    for kind in KINDS:
        entry = stats[kind]
        waits = entry["waits"]
        rows.append(
            [
                f"{LABELS[kind]} ({HOW_THEY_WAIT[kind]})",
                f"{support.median(entry['rates']):,.0f}",
                f"{support.median(paired(entry['rates'], stats['lock1']['rates'])):.2f}x",
                f"{support.percentile(waits, 50) * 1000:.2f}",
                f"{support.percentile(waits, 99) * 1000:.2f}",
                entry["violations"],
                entry["errors"],
                f"{entry['fences']:,} "
                + ("strictly increasing" if entry["ok"] else "NOT INCREASING"),
            ]
        )
    return [
        f"b. Contended: {args.processes} processes on one lock name; inside each section "
        f"{args.work_ms:g} ms busy work between INCR/DECR of the inside counter, "
        f"{args.outside_ms:g} ms sleep outside; {args.rounds} interleaved round(s) x "
        f"{per_phase:.2f} s (after {args.warmup:g} s warm-up) per contender; waits "
        "(acquire() called to granted) pooled over rounds",
        "",
        support.table(
            [
                "contender",
                "sections/s",
                "vs Lock*",
                "wait p50 ms",
                "wait p99 ms",
                "violations",
                "errors",
                "fences in grant order",
            ],
            rows,
        ),  # fmt: skip
        "",
        "* median over rounds of (sections/s / the Redis Lock's in the same round).",
    ]


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    load = support.load_average()
    with support.private_redis_servers(4) as servers, zookeepers() as (single, ensemble):
        masters, counter = servers[:3], servers[3]
        os.environ.pop("STOCK_LOCKS_REDIS_URL", None)
        support.setup_django(masters[0].url)
        setting = backends([s.url for s in masters], single.hosts, ensemble.hosts)
        zk_version = four_letters(single.port, b"srvr").splitlines()[0]
        with support.configure_stock_locks(BACKENDS=setting):
            lines = [
                f"ZooKeeper lock beside the Redis Lock and RedLock x3, "
                f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
                f"kazoo {support.dist_version('kazoo')}, redis-py "
                f"{support.dist_version('redis')}; {zk_version}",
                "",
                *uncontended(args),
                "",
                *contended(args, setting, counter.url),
                "",
                support.load_line(load),
            ]
    return "\n".join(lines)
