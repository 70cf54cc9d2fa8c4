"""RedLock and Redis Cluster: stock_locks' RedLock on 3 and 5 masters beside the
single-master Lock, pottery's Redlock and redis-py's Lock; the Lock and the flash
sale on a Redis Cluster beside one Redis.

Every server is private (127.0.0.1, free ports, stopped by PID): 5 redis-servers
as independent masters (RedLock x3 and pottery use the first 3, RedLock x5 all
5, the single-master contenders the first), one more for the contended test's
inside counter, and for c a 3-master Redis Cluster
(``tests.support.redis_cluster.RedisClusterServers``).

a. Uncontended acquire+release cycles/s, one reused lock object each, TTL 30 s:
   stock_locks ``Lock`` on the "default" backend (one master), ``RedLock`` on
   backends "redlock3" and "redlock5" (``RedLockBackend`` over 3 and 5 masters,
   default options), pottery's ``Redlock`` on the same 3 masters, redis-py's
   ``Lock`` on one master. Every master is flushed between contenders. Then a
   counted run: replies read and server commands (Lua's included) per cycle,
   summed over the masters, and this process's CPU per cycle (pottery's
   threads included). stock_locks' grants carry a fencing token, checked
   strictly increasing over the counted run; pottery's and redis-py's locks
   have none.
b. Contended: P processes loop on one name, RedLock x3 against pottery x3:
   sections/s, the wait from calling acquire() to the grant (p50/p99), and
   mutual exclusion checked with an INCR/DECR inside counter on the separate
   redis-server (never above 1), plus RedLock's fences in grant order (merged
   CLOCK_MONOTONIC timeline of every process) strictly increasing.
c. Redis Cluster beside one Redis: the uncontended Lock cycle on the default
   backend (one Redis) and on a ``RedisBackend`` with ``OPTIONS["CLUSTER"]``
   (a ``RedisCluster`` client), with redis-py's ``Lock`` on both as the
   reference for what the cluster client itself costs. Then the ``lua``
   flash sale (``benchmarks.stock.flash``, i.e. ``stock_locks.stock.stress.run_stress``)
   with the default backend on one Redis and on the cluster, in interleaved
   rounds. The flash sale needs PostgreSQL: ``--database-url``, else
   ``DATABASE_URL``, else ``stock_locks_bench`` on 127.0.0.1 (created and
   migrated when missing); ``--no-flash`` skips it.

Warm-up first; contenders run in interleaved rounds with the order rotated
each round, and ratios are medians of same-round ratios, because the machine
is shared and noisy: compare within a run, not across runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from itertools import pairwise
from typing import Any

import redis

from . import lock_loops, stock, support

NAME = "bench:redlock"  # every contender locks this name (each library adds its own prefix)
TTL = 30  # seconds, the lease of every contender
MASTERS = 5  # independent masters started; RedLock x3 and pottery use the first 3
CLUSTER_MASTERS = 3
SEGMENT = 0.2  # seconds, one contender's share of one uncontended round

UNCONTENDED = ("lock1", "redlock3", "redlock5", "pottery3", "redis-py")
CONTENDED = ("redlock3", "pottery3")
CLUSTER_KINDS = ("lock1", "cluster", "redis-py", "redis-py cluster")
LABELS = {
    "lock1": "stock_locks Lock, 1 master (default backend)",
    "redlock3": "stock_locks RedLock, 3 masters",
    "redlock5": "stock_locks RedLock, 5 masters",
    "pottery3": "pottery Redlock, 3 masters",
    "redis-py": "redis-py Lock, 1 master",
    "cluster": "stock_locks Lock, Redis Cluster (3 masters)",
    "redis-py cluster": "redis-py Lock, Redis Cluster (RedisCluster.lock)",
}
MASTER_COUNT = {"lock1": 1, "redlock3": 3, "redlock5": 5, "pottery3": 3, "redis-py": 1}
FENCED = {"lock1", "redlock3", "redlock5", "cluster"}
HOW_THEY_WAIT = {
    "redlock3": "wake-up on release, BLPOP on one master",
    "pottery3": "polls, random sleep 0-0.2 s",
}
REDLOCK_BACKEND = "stock_locks.backends.redlock.RedLockBackend"
REDIS_BACKEND = "stock_locks.backends.redis.RedisBackend"
TARGET = 1.0  # RedLock x3 / pottery x3 uncontended cycles/s, fencing on


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = support.parser("redlock", __doc__, "abc")
    parser.add_argument(
        "--seconds", type=float, help="a and c: measured seconds per contender (3; quick 0.6)"
    )
    parser.add_argument("--processes", type=int, default=4, help="b: contending processes (4)")
    parser.add_argument(
        "--contended-seconds",
        type=float,
        help="b: measured seconds per contender, cut in --rounds rounds (3; quick 0.8)",
    )
    parser.add_argument("--rounds", type=int, help="b: interleaved rounds (3; quick 2)")
    parser.add_argument(
        "--work-ms", type=float, default=1.0, help="b: busy work inside a section (1)"
    )
    parser.add_argument(
        "--outside-ms", type=float, default=1.0, help="b: sleep between sections (1)"
    )
    parser.add_argument(
        "--cluster-replicas",
        type=int,
        default=0,
        help="c: replicas per cluster master (0: 2 CPUs are shared by every server)",
    )
    parser.add_argument("--no-flash", action="store_true", help="c: skip the flash sale")
    parser.add_argument("--database-url", help="c: PostgreSQL of the flash sale")
    parser.add_argument("--flash-stock", type=int, help="c: flash sale units (1000; quick 200)")
    parser.add_argument("--flash-buyers", type=int, help="c: flash sale buyers (5000; quick 1000)")
    parser.add_argument("--flash-processes", type=int, help="c: flash sale processes (8; quick 4)")
    parser.add_argument(
        "--flash-rounds", type=int, help="c: flash sale rounds, each side once (2; quick 1)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.seconds = args.seconds or (0.6 if quick else 3.0)
    args.contended_seconds = args.contended_seconds or (0.8 if quick else 3.0)
    args.rounds = args.rounds or (2 if quick else 3)
    args.segments = max(3, round(args.seconds / SEGMENT))
    args.warmup = 0.1 if quick else 0.3  # seconds, per contender before measuring
    args.flash_stock = args.flash_stock or (200 if quick else 1000)
    args.flash_buyers = args.flash_buyers or (1000 if quick else 5000)
    args.flash_processes = args.flash_processes or (4 if quick else 8)
    args.flash_rounds = args.flash_rounds or (1 if quick else 2)
    if args.processes < 2:
        parser.error("--processes: at least 2 (it is a contended test)")
    return args


# -- the servers and the backends ------------------------------------------------------


class Env:
    """The servers of a run, by URL (the independent masters, the counter server and,
    for c, the cluster), admin clients of them, and the backends configured on them."""

    def __init__(self, master_urls: list[str], counter_url: str) -> None:
        self.master_urls = master_urls
        self.counter_url = counter_url
        self.admin = [redis.Redis.from_url(url) for url in master_urls]
        self.cluster: Any = None
        self.cluster_admin: Any = None

    def urls(self, count: int) -> list[str]:
        return self.master_urls[:count]

    def backends(self, counting: bool = False) -> dict[str, dict]:
        """``STOCK_LOCKS["BACKENDS"]`` of this run (``default`` left implicit: the
        django-redis cache on the first master). With ``counting``, also
        "redlock3-counted" and "redlock5-counted", whose connections count replies."""
        backends: dict[str, dict] = {}
        for count in (3, 5):
            backends[f"redlock{count}"] = {"BACKEND": REDLOCK_BACKEND, "LOCATION": self.urls(count)}
            if counting:
                backends[f"redlock{count}-counted"] = {
                    "BACKEND": REDLOCK_BACKEND,
                    "LOCATION": self.urls(count),
                    "OPTIONS": {"CONNECTION_CLASS": support.CountingConnection},
                }
        if self.cluster is not None:
            backends["cluster"] = cluster_backend(self.cluster)
        return backends

    def flush(self) -> None:
        for client in self.admin:
            client.flushall()
        if self.cluster_admin is not None:
            self.cluster_admin.flushall()

    def close(self) -> None:
        for client in self.admin:
            client.close()
        if self.cluster_admin is not None:
            self.cluster_admin.close()


def cluster_backend(cluster: Any) -> dict:
    return {"BACKEND": REDIS_BACKEND, "LOCATION": cluster.url, "OPTIONS": {"CLUSTER": True}}


def master_clients(env: Env, count: int, counting: bool = False) -> list[redis.Redis]:
    kwargs = {"connection_class": support.CountingConnection} if counting else {}
    return [redis.Redis.from_url(url, **kwargs) for url in env.urls(count)]


def make_lock(kind: str, env: Env, counting: bool = False) -> Any:
    """One reusable lock object of ``kind``; ``acquire()`` blocks, ``release()``.
    With ``counting``, on connections that count replies."""
    from stock_locks import Lock, RedLock

    if kind == "lock1":
        if counting:
            from demo_shop.settings import redis_db

            client = redis.Redis.from_url(
                redis_db(env.master_urls[0], 1), connection_class=support.CountingConnection
            )
            return Lock(NAME, TTL, redis=client)
        return Lock(NAME, TTL)
    if kind in ("redlock3", "redlock5"):
        return RedLock(NAME, TTL, backend=f"{kind}-counted" if counting else kind)
    if kind == "pottery3":
        from pottery import Redlock

        masters = set(master_clients(env, 3, counting))
        return Redlock(key=NAME, masters=masters, auto_release_time=TTL)
    if kind == "redis-py":
        (client,) = master_clients(env, 1, counting)
        return client.lock(NAME, timeout=TTL)  # defaults: blocking, sleep=0.1
    if kind == "cluster":
        return Lock(NAME, TTL, backend="cluster")
    if kind == "redis-py cluster":
        return env.cluster_admin.lock(NAME, timeout=TTL)
    raise ValueError(kind)


# -- a. uncontended ---------------------------------------------------------------------


def measure(env: Env, kinds: tuple[str, ...], args: argparse.Namespace, what: str) -> dict:
    """``lock_loops.uncontended`` of ``kinds``, every master flushed before each run."""
    locks = {kind: make_lock(kind, env) for kind in kinds}
    return lock_loops.uncontended(locks, args.segments, args.seconds, args.warmup, env.flush, what)


def server_cpu(env: Env) -> float:
    """Seconds of CPU (user + system) every master has used since it started, summed."""
    return sum(support.server_cpu(client) for client in env.admin)


def server_commands(env: Env) -> Counter:
    """Commands run on every master since its last CONFIG RESETSTAT, by name, summed."""
    total: Counter = Counter()
    for client in env.admin:
        total.update(support.command_calls(client))
    return total


def counted(env: Env, kinds: tuple[str, ...], chunks: int, seconds: float) -> dict[str, dict]:
    """Per contender and cycle: replies read and server commands (all masters), from
    ``chunks`` interleaved chunks of ``seconds`` each (a warm-up chunk first); and the
    fences of stock_locks' grants, checked strictly increasing."""
    locks = {kind: make_lock(kind, env, counting=True) for kind in kinds}
    out = {
        kind: {
            "cycles": 0,
            "replies": 0,
            "by_name": Counter(),
            "server_us": [],
            "fences": 0,
            "fence_ok": True,
        }
        for kind in kinds
    }
    for r in range(-1, chunks):  # round -1 is the warm-up: connect, load scripts
        for kind in support.rotated(kinds, r):
            lock = locks[kind]
            env.flush()
            # One cycle first: on masters just emptied the fences proposed (each master's
            # clock) disagree, which costs the first grant one more round.
            lock.acquire()
            lock.release()
            for client in env.admin:
                client.config_resetstat()
            cpu_before = server_cpu(env)
            fences: list[int] = []
            cycles = 0
            support.CountingConnection.replies = 0
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                if not lock.acquire():
                    raise RuntimeError("an uncontended acquire was refused")
                if kind in FENCED:
                    fences.append(lock.fence)
                lock.release()
                cycles += 1
            replies = support.CountingConnection.replies
            cpu_used = server_cpu(env) - cpu_before
            if r < 0:
                continue
            entry = out[kind]
            entry["cycles"] += cycles
            entry["replies"] += replies
            entry["server_us"].append(cpu_used / cycles * 1e6)
            entry["by_name"].update(server_commands(env))
            entry["fences"] += len(fences)
            entry["fence_ok"] &= all(a < b for a, b in pairwise(fences))
    env.flush()
    return {
        kind: {
            "replies": entry["replies"] / entry["cycles"],
            "commands": sum(entry["by_name"].values()) / entry["cycles"],
            "by_name": {n: calls / entry["cycles"] for n, calls in entry["by_name"].items()},
            "server_us": support.median(entry["server_us"]),
            "fences": entry["fences"],
            "fence_ok": entry["fence_ok"],
        }
        for kind, entry in out.items()
    }


def fence_text(kind: str, count: dict) -> str:
    if kind not in FENCED:
        return "none (not fenced)"
    ok = "strictly increasing" if count["fence_ok"] else "NOT INCREASING"
    return f"yes: {count['fences']:,} fences {ok}"


def uncontended(env: Env, args: argparse.Namespace) -> list[str]:
    stats = measure(env, UNCONTENDED, args, "uncontended")
    support.progress("uncontended: counting replies and commands")
    counts = counted(env, UNCONTENDED, args.segments, 0.1 if args.quick else 0.2)
    rates = {kind: stats[kind]["rates"] for kind in UNCONTENDED}
    support.figure(
        "uncontended cycles/s (redlock)",
        {LABELS[kind]: support.median(rates[kind]) for kind in UNCONTENDED},
    )
    rows = []
    for kind in UNCONTENDED:
        rate = support.median(rates[kind])
        count = counts[kind]
        rows.append(
            [
                LABELS[kind],
                MASTER_COUNT[kind],
                f"{rate:,.0f}",
                f"{min(rates[kind]):,.0f}-{max(rates[kind]):,.0f}",
                f"{1e6 / rate:.0f}",
                f"{lock_loops.same_round(rates[kind], rates['pottery3']):.2f}x",
                f"{lock_loops.same_round(rates[kind], rates['lock1']):.2f}x",
                f"{count['replies'] / MASTER_COUNT[kind]:.2f}",
                f"{count['commands']:.1f}",
                f"{support.median(stats[kind]['cpu']):.0f}",
                f"{count['server_us']:.0f}",
                fence_text(kind, count),
            ]
        )
    lines = [
        f"a. Uncontended acquire+release, one reused lock object each, TTL {TTL} s: "
        f"{args.segments} interleaved rounds x {args.seconds / args.segments:.2f} s per "
        f"contender (after {args.warmup:g} s warm-up each), order rotated each round; "
        "cycles/s is the median of rounds",
        "",
        support.table(
            [
                "contender",
                "masters",
                "cycles/s",
                "rounds min-max",
                "us/cycle",
                "vs pottery x3*",
                "vs Lock x1*",
                "replies per master/cycle",
                "server commands/cycle (all masters)",
                "client CPU us/cycle",
                "server CPU us/cycle (all masters)",
                "fenced",
            ],
            rows,
        ),
        "",
        "* median over rounds of (this contender's cycles/s / the other's in the same round).",
        "Replies and commands: a separate counted run (connections that count replies; "
        "CONFIG RESETSTAT, then INFO commandstats on every master, where commands run by "
        "Lua count too; after each flush one cycle runs uncounted, since on emptied "
        "masters the fences proposed disagree and the first grant takes a third round). "
        "A RedLock round sends to every master at once and reads the "
        "replies after, so replies per master is its sequential round trips; pottery "
        "sends from one thread per master (a new thread pool per acquire and per "
        "release). Client CPU: process_time() (all threads) over the timed rounds; server "
        "CPU: INFO cpu of every master over the counted run (median of chunks). "
        "Fences: stock_locks' grants, read after each acquire in the counted run; "
        "pottery's Redlock and redis-py's Lock give no fencing token. Server commands "
        "per cycle by name:",
    ]
    for kind in UNCONTENDED:
        by_name = counts[kind]["by_name"]
        detail = ", ".join(f"{name} {calls:.2f}" for name, calls in sorted(by_name.items()))
        lines.append(f"  {LABELS[kind]}: {detail}")
    pairs = lock_loops.paired(rates["redlock3"], rates["pottery3"])
    ratio = support.median(pairs)
    of_medians = support.median(rates["redlock3"]) / support.median(rates["pottery3"])
    fenced = counts["redlock3"]["fence_ok"] and counts["redlock3"]["fences"] > 0
    lines += [
        "",
        "Targets:",
        f"  RedLock x3 (fenced) / pottery Redlock x3 (unfenced) cycles/s, median of same-round "
        f"ratios = {ratio:.2f}x >= {TARGET:.2f}x: {support.verdict(ratio >= TARGET and fenced)}"
        f"  (min {min(pairs):.2f}, max {max(pairs):.2f}; ratio of the medians "
        f"{of_medians:.2f}x; fences strictly increasing: {'yes' if fenced else 'NO'})",
    ]
    for kind in ("redlock3", "redlock5"):
        trips = counts[kind]["replies"] / MASTER_COUNT[kind]
        lines.append(
            f"  {LABELS[kind]}: {trips:.2f} round trips/cycle (replies per master) <= 2: "
            f"{support.verdict(trips <= 2.005)}"
        )
    return lines


# -- b. contended -------------------------------------------------------------------------


def child_lock(kind: str, master_urls: list[str]) -> Any:
    """``make_lock`` in a contended child process (it has no Env)."""
    return make_lock(kind, Env(master_urls, ""))


def contended(env: Env, args: argparse.Namespace) -> list[str]:
    stats = lock_loops.contended(
        CONTENDED, child_lock, (env.master_urls,), processes=args.processes,
        seconds=args.contended_seconds, rounds=args.rounds, warmup=args.warmup,
        counter_url=env.counter_url, flush_urls=env.master_urls, backends=env.backends(),
        work_ms=args.work_ms, outside_ms=args.outside_ms,
    )  # fmt: skip
    labels = {kind: f"{LABELS[kind]} ({HOW_THEY_WAIT[kind]})" for kind in CONTENDED}
    return [
        lock_loops.contended_intro("b", args, f", TTL {TTL} s"),
        "",
        *lock_loops.contended_table(stats, labels, "pottery3", args.processes),
        "",
        "Targets:",
        *lock_loops.exclusion_targets(stats, ("redlock3",)),
    ]


# -- c. Redis Cluster ---------------------------------------------------------------------


def cluster_locks(env: Env, args: argparse.Namespace) -> list[str]:
    stats = measure(env, CLUSTER_KINDS, args, "cluster locks")
    rates = {kind: stats[kind]["rates"] for kind in CLUSTER_KINDS}
    reference = {"lock1": "lock1", "cluster": "lock1", "redis-py": "redis-py"}
    reference["redis-py cluster"] = "redis-py"
    rows = []
    for kind in CLUSTER_KINDS:
        rate = support.median(rates[kind])
        rows.append(
            [
                LABELS[kind],
                f"{rate:,.0f}",
                f"{min(rates[kind]):,.0f}-{max(rates[kind]):,.0f}",
                f"{1e6 / rate:.0f}",
                f"{lock_loops.same_round(rates[kind], rates[reference[kind]]):.2f}x",
                f"{lock_loops.same_round(rates[kind], rates['redis-py']):.2f}x",
                f"{support.median(stats[kind]['cpu']):.0f}",
            ]
        )
    cluster_ratio = lock_loops.same_round(rates["cluster"], rates["lock1"])
    redis_py_ratio = lock_loops.same_round(rates["redis-py cluster"], rates["redis-py"])
    return [
        f"c1. Uncontended Lock cycle, one Redis against a {CLUSTER_MASTERS}-master Redis "
        f"Cluster ({args.cluster_replicas} replicas per master), TTL {TTL} s: "
        f"{args.segments} interleaved rounds x {args.seconds / args.segments:.2f} s per "
        f"contender (after {args.warmup:g} s warm-up each); cycles/s the median of rounds",
        "",
        support.table(
            [
                "contender",
                "cycles/s",
                "rounds min-max",
                "us/cycle",
                "cluster / one Redis*",
                "vs redis-py 1 master*",
                "client CPU us/cycle",
            ],
            rows,
        ),
        "",
        "* median over rounds of same-round ratios; 'cluster / one Redis' pairs each "
        "cluster row with the same library on one Redis (1.00x on the one-Redis rows).",
        f"  stock_locks Lock on the cluster runs at {cluster_ratio:.2f}x its one-Redis rate; "
        f"redis-py's Lock at {redis_py_ratio:.2f}x (what RedisCluster's routing costs any "
        "client).",
    ]


def flash_sales(env: Env, args: argparse.Namespace) -> list[str]:
    """The lua flash sale (benchmarks.stock.flash) with the default backend on one Redis
    and on the cluster, one run per side and round, sides interleaved. A side whose run
    raises is reported with where it raised and not run again."""
    sides = ("one Redis", "cluster")
    options = argparse.Namespace(
        strategies=["lua"],
        flash_stock=args.flash_stock,
        flash_buyers=args.flash_buyers,
        flash_processes=args.flash_processes,
        flash_rounds=1,
        flash_redis_rounds=1,
    )
    runs: dict[str, dict[int, Any]] = {side: {} for side in sides}
    failed: dict[str, str] = {}
    for r in range(1, args.flash_rounds + 1):
        for side in support.rotated(sides, r - 1):
            if side in failed:
                continue
            backends = env.backends()
            if side == "cluster":
                backends["default"] = cluster_backend(env.cluster)
            override = support.configure_stock_locks(BACKENDS=backends)
            support.progress(f"flash sale round {r}/{args.flash_rounds}: {side}")
            try:
                _, result = stock.flash(options)
                runs[side][r] = result["runs"]["lua"][0]
            except Exception as exc:  # report it; keep the other side's figures
                failed[side] = (
                    f"round {r}: {type(exc).__name__}: {exc}\n    raised at {raised_at(exc)}"
                )
            finally:
                override.disable()
    rows = []
    for side in sides:
        for r, res in runs[side].items():
            rows.append(
                [
                    side,
                    r,
                    f"{res.throughput_per_s:,.0f}",
                    res.attempts,
                    res.sold,
                    res.refused,
                    res.errors,
                    res.oversold,
                    res.drift,
                    "yes" if res.conserved else "NO",
                    f"{res.p50_ms:.2f}",
                    f"{res.p99_ms:.2f}",
                    f"{res.seconds:.2f}",
                ]
            )
        if side in failed:
            rows.append([side, "-", "failed", *["-"] * 10])
    both = [r for r in runs["cluster"] if r in runs["one Redis"]]
    pairs = [
        runs["cluster"][r].throughput_per_s / runs["one Redis"][r].throughput_per_s for r in both
    ]
    bad = [side for side in sides if not all(res.ok for res in runs[side].values())]
    lines = [
        f"c2. Flash sale, lua strategy (benchmarks.stock.flash -> "
        f"stock_locks.stock.stress.run_stress, ORM buyers): {args.flash_stock:,} units, "
        f"{args.flash_buyers:,} buyers, "
        f"{args.flash_processes} forked processes, one hot SKU; STOCK_LOCKS BACKENDS "
        f'"default" on one Redis (the django-redis cache) or on the cluster (RedisBackend, '
        f"CLUSTER); {args.flash_rounds} round(s), sides interleaved",
        "",
        support.table(
            [
                "default backend",
                "round",
                "attempts/s",
                "attempts",
                "sold",
                "refused",
                "errors",
                "oversold",
                "drift",
                "conserved",
                "p50 ms",
                "p99 ms",
                "seconds",
            ],
            rows,
        ),
        "",
    ]
    if pairs:
        lines.append(
            "  cluster / one Redis attempts/s, median of same-round ratios: "
            f"{support.median(pairs):.2f}x (rounds: " + ", ".join(f"{p:.2f}" for p in pairs) + ")"
        )
    else:
        lines.append("  cluster / one Redis: no round where both sides ran")
    measured = [side for side in sides if runs[side]]
    lines.append(
        f"  oversold 0, drift 0, stock conserved, no errors ({', '.join(measured) or 'none'}): "
        + (support.verdict(bool(measured)) if not bad else f"FAIL ({', '.join(bad)})")
    )
    for side, why in failed.items():
        lines.append(f"  {side}: not measured, the run raised ({why})")
    for side in sides:
        samples = [s for res in runs[side].values() for s in res.error_samples]
        if samples:
            lines.append(f"  {side} errors, e.g. {samples[0]}")
    return lines


def cluster_part(env: Env, args: argparse.Namespace) -> list[str]:
    from tests.support.redis_cluster import RedisClusterServers

    support.progress(
        f"starting a {CLUSTER_MASTERS}-master Redis Cluster ({args.cluster_replicas} replicas each)"
    )
    cluster = RedisClusterServers(
        masters=CLUSTER_MASTERS, replicas_per_master=args.cluster_replicas
    )
    try:
        cluster.start()
        env.cluster = cluster
        env.cluster_admin = cluster.client()
        override = support.configure_stock_locks(BACKENDS=env.backends())
        try:
            lines = cluster_locks(env, args)
        finally:
            override.disable()
        if not args.no_flash:
            lines += [""]
            try:
                lines += flash_sales(env, args)
            except Exception as exc:  # report, keep the lock figures
                lines.append(f"c2. Flash sale: not measured: {type(exc).__name__}: {exc}")
                lines.append(f"  raised at {raised_at(exc)}")
    finally:
        if env.cluster_admin is not None:
            env.cluster_admin.close()
        env.cluster = env.cluster_admin = None
        cluster.stop()
    return lines


def raised_at(exc: BaseException) -> str:
    """The innermost stock_locks frames of ``exc``'s traceback, innermost last."""
    import traceback

    frames = [
        f"{frame.filename[frame.filename.rindex('stock_locks') :]}:{frame.lineno} ({frame.name})"
        for frame in traceback.extract_tb(exc.__traceback__)
        if f"{os.sep}stock_locks{os.sep}" in frame.filename
    ]
    return " <- ".join(reversed(frames[-3:])) or "outside stock_locks"


def prepare_database(args: argparse.Namespace) -> tuple[str | None, str]:
    """The flash sale's database URL (created and migrated later), or None with why not."""
    if args.no_flash:
        return None, "not asked for"
    url = args.database_url or stock.database_url()[0]
    try:
        support.ensure_database(url)
    except Exception as exc:
        return None, f"database not reachable: {type(exc).__name__}: {exc}"
    return url, ""


# -- report -------------------------------------------------------------------------------


def header(server: Any, quick: bool) -> list[str]:
    from stock_locks.backends.redlock import backend as redlock

    return [
        *support.header("RedLock and Redis Cluster benchmark", server,
                        ("redis", "pottery", "Django"), quick),
        f"{MASTERS} independent masters + 1 counter server; RedLockBackend default options "
        f"(NODE_TIMEOUT {redlock.NODE_TIMEOUT:g} s, RETRY_DELAY {redlock.RETRY_DELAY:g} s, "
        f"CLOCK_DRIFT {redlock.CLOCK_DRIFT:g})",
    ]  # fmt: skip


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    sections = set(args.only or "abc")
    load_before = support.load_average()
    db_url, no_db = prepare_database(args) if "c" in sections else (None, "")
    with (
        support.private_redis_servers(MASTERS) as masters,
        support.private_redis() as counter,
    ):
        support.setup_django(masters[0].url, db_url)
        env = Env([server.url for server in masters], counter.url)
        override = support.configure_stock_locks(BACKENDS=env.backends(counting=True))
        try:
            lines = header(masters[0], args.quick)
            if "a" in sections:
                lines += [""] + uncontended(env, args)
            if "b" in sections:
                lines += [""] + contended(env, args)
        finally:
            override.disable()
        if "c" in sections:
            if db_url:
                from django.core.management import call_command

                support.progress(f"migrating {stock.redacted(db_url)}")
                call_command("migrate", verbosity=0, interactive=False)
            elif not args.no_flash:
                args.no_flash = True
                lines += ["", f"(c2. flash sale skipped: {no_db})"]
            lines += [""] + cluster_part(env, args)
        env.close()
    lines += ["", support.load_line(load_before)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
