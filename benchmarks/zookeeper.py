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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.zookeeper_servers import (
    ZooKeeperEnsemble,
    ZooKeeperServer,
    four_letters,
    zookeeper_backend,
)

from . import lock_loops, support

NAME = "bench:zookeeper"
TTL = 30  # seconds (a lease on Redis; on ZooKeeper only a waiter's safety-net sleep)
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
    parser = support.parser("zookeeper", __doc__)
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


def uncontended(args: argparse.Namespace) -> list[str]:
    locks = {kind: make_lock(kind) for kind in KINDS}
    stats = lock_loops.uncontended(locks, args.segments, args.seconds, args.warmup)
    rates = {kind: stats[kind]["rates"] for kind in KINDS}
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
                f"{lock_loops.same_round(rates[kind], rates['lock1']):.2f}x",
                f"{lock_loops.same_round(rates[kind], rates['redlock3']):.2f}x",
                "strictly increasing" if stats[kind]["rising"] else "NOT INCREASING",
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


def contended(args: argparse.Namespace, backends_setting: dict, counter_url: str) -> list[str]:
    stats = lock_loops.contended(
        KINDS, make_lock, processes=args.processes, seconds=args.contended_seconds,
        rounds=args.rounds, warmup=args.warmup, counter_url=counter_url,
        backends=backends_setting, work_ms=args.work_ms, outside_ms=args.outside_ms,
    )  # fmt: skip
    labels = {kind: f"{LABELS[kind]} ({HOW_THEY_WAIT[kind]})" for kind in KINDS}
    return [
        lock_loops.contended_intro("b", args, ""),
        "",
        *lock_loops.contended_table(stats, labels, "lock1", args.processes),
        "",
        "Targets:",
        *lock_loops.exclusion_targets(stats, KINDS),
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
        override = support.configure_stock_locks(BACKENDS=setting)
        try:
            lines = [
                *support.header(
                    "ZooKeeper lock beside the Redis Lock and RedLock x3", masters[0],
                    ("redis", "kazoo", "Django"), args.quick,
                ),
                zk_version,
                "",
                *uncontended(args),
                "",
                *contended(args, setting, counter.url),
                "",
                support.load_line(load),
            ]  # fmt: skip
        finally:
            override.disable()
    return "\n".join(lines)
