"""Locks: stock_locks' Lock against redis-py's Lock and python-redis-lock, side by side.

a. Uncontended acquire+release cycles/s on one connection, with client round
   trips and server commands per cycle (commands run inside Lua count too).
b. Contended handoff: P processes loop on one lock name; sections/s, the
   wait from starting acquire() to being granted, and the handoff gap: the
   idle time from a release to the next grant while another process waits
   (from the merged CLOCK_MONOTONIC timeline of every process; who waits is
   counted in Redis, INCR before acquire() and DECR after the grant). Mutual
   exclusion is checked while measuring with an INCR/DECR "inside" counter
   that must never exceed 1. Beside them, under the same load, the floor of any
   handoff: a baton list taken with BLPOP and given back with LPUSH on raw sockets.
c. Waits: how late ``acquire(timeout=t)`` on a held lock returns False (the
   overshoot past t), and how late a waiter is granted a lock whose holder
   died (the lateness past the lease end, from the server's PTTL).
d. The dashboard's lock list: one refresh (``dashboard.lock_page``) with a
   few held locks among many unrelated keys.

Everything runs against one private redis-server, FLUSHALL between contenders,
warm-up first, and the contenders are measured in interleaved rounds (order
rotated each round) because the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

import redis

from . import lock_loops, support

NAME = "bench:lock"  # every contender locks this name (each library adds its own prefix)
TTL = 30  # seconds, the lease of every contender

UNCONTENDED = (
    "stock_locks",
    "stock_locks watchdog",
    "stock_locks reentrant",
    "redis-py",
    "python-redis-lock",
)
CONTENDED = ("stock_locks", "redis-py", "python-redis-lock", "baton")
LABELS = {
    "stock_locks": "stock_locks Lock",
    "stock_locks watchdog": "stock_locks Lock(watchdog=True)",
    "stock_locks reentrant": "stock_locks Lock(reentrant=True)",
    "redis-py": "redis-py Lock",
    "python-redis-lock": "python-redis-lock Lock",
    "baton": "baton, the floor: not a lock",
}
HOW_THEY_WAIT = {
    "stock_locks": "BLPOP wake-up on release",
    "redis-py": "polls, sleep=0.1",
    "python-redis-lock": "BLPOP signal",
    "baton": "BLPOP/LPUSH on raw sockets",
}
SEGMENT = 0.2  # seconds, one contender's share of one uncontended round
# What the process's metrics flush (metrics_flush.lua by EVAL, once a second) runs.
FLUSH_COMMANDS = ("eval", "hincrby", "hset", "expire")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = support.parser("locks", __doc__, "abcd")
    parser.add_argument("--seconds", type=float, help="measured seconds per contender (3)")
    parser.add_argument(
        "--rounds", type=int, help="contended: interleaved rounds the seconds are cut in (3)"
    )
    parser.add_argument("--processes", type=int, default=8, help="contended processes (8)")
    parser.add_argument(
        "--work-ms", type=float, default=1.0, help="busy work inside a contended section (1)"
    )
    parser.add_argument(
        "--outside-ms", type=float, default=1.0, help="sleep between contended sections (1)"
    )
    parser.add_argument(
        "--sleep-inside", action="store_true", help="sleep inside the section instead of spinning"
    )
    parser.add_argument(
        "--unrelated-keys", type=int, default=200_000, help="d: unrelated keys (200000)"
    )
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (0.4 if args.quick else 3.0)
    args.contended_seconds = args.seconds
    args.rounds = args.rounds or (2 if args.quick else 3)
    # Uncontended: many short segments, so a noisy neighbour hits every contender alike.
    args.segments = max(3, round(args.seconds / SEGMENT))
    args.warmup = 0.1 if args.quick else 0.3  # seconds, before each contended phase
    per_chunk = (200 if args.quick else 3000) // args.segments
    args.counted_cycles = max(1, per_chunk) * args.segments
    return args


# -- the contenders -------------------------------------------------------------


def make_lock(kind: str, url: str | redis.Redis) -> Any:
    """One reusable lock object of ``kind`` on the server of ``url`` (or on a client);
    ``acquire()`` blocks."""
    if kind == "baton":  # (contended only: a url)
        return lock_loops.BatonLock(str(url))
    client = redis.Redis.from_url(url) if isinstance(url, str) else url
    if kind.startswith("stock_locks"):
        from stock_locks.locks import Lock

        return Lock(
            NAME,
            TTL,
            redis=client,
            watchdog=kind.endswith("watchdog"),
            reentrant=kind.endswith("reentrant"),
        )
    if kind == "redis-py":
        return client.lock(NAME, timeout=TTL)  # defaults: blocking=True, sleep=0.1
    if kind == "python-redis-lock":
        import redis_lock

        return redis_lock.Lock(client, NAME, expire=TTL)
    raise ValueError(kind)


def client_for(server, connection_class=redis.Connection) -> redis.Redis:
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=server.port, connection_class=connection_class
    )
    return redis.Redis(connection_pool=pool)


# -- a. uncontended ---------------------------------------------------------------


def counted_cycles(server, cycles: int, chunks: int) -> dict[str, dict]:
    """Per contender and cycle: client round trips, server commands (total and by name),
    client CPU and redis-server CPU in microseconds (median of ``chunks`` interleaved
    chunks). ``cycles`` cycles each; one counting connection for all."""
    client = client_for(server, support.CountingConnection)
    locks = {kind: make_lock(kind, client) for kind in UNCONTENDED}
    out = {
        kind: {"replies": 0, "by_name": Counter(), "client_us": [], "server_us": []}
        for kind in UNCONTENDED
    }
    per_chunk = max(1, cycles // chunks)
    # (no FLUSHALL between chunks: a chunk of a long-lived lock name, whose held-locks
    # index entry is written once a lease, not once a chunk)
    client.flushall()
    for r in range(-1, chunks):  # round -1 is the warm-up: connect, load scripts
        for kind in support.rotated(UNCONTENDED, r):
            acquire, release = locks[kind].acquire, locks[kind].release
            client.config_resetstat()
            server_before = support.server_cpu(client)
            support.CountingConnection.replies = 0
            client_before = time.process_time()
            for _ in range(per_chunk):
                acquire()
                release()
            client_used = time.process_time() - client_before
            replies = support.CountingConnection.replies
            server_used = support.server_cpu(client) - server_before
            calls = support.command_calls(client)
            if r < 0:
                continue
            entry = out[kind]
            entry["replies"] += replies
            entry["client_us"].append(client_used / per_chunk * 1e6)
            entry["server_us"].append(server_used / per_chunk * 1e6)
            entry["by_name"].update(calls)
    client.flushall()
    client.close()
    counted = per_chunk * chunks
    return {
        kind: {
            "trips": entry["replies"] / counted,
            "commands": sum(entry["by_name"].values()) / counted,
            "by_name": {name: calls / counted for name, calls in entry["by_name"].items()},
            "client_us": support.median(entry["client_us"]),
            "server_us": support.median(entry["server_us"]),
        }
        for kind, entry in out.items()
    }


def uncontended(server, args) -> list[str]:
    client = client_for(server)
    locks = {kind: make_lock(kind, client) for kind in UNCONTENDED}
    stats = lock_loops.uncontended(
        locks, args.segments, args.seconds, min(0.5, args.seconds / 2), client.flushall
    )
    support.progress("uncontended: counting round trips and commands")
    counts = counted_cycles(server, args.counted_cycles, args.segments)
    client.close()
    rates = {kind: stats[kind]["rates"] for kind in UNCONTENDED}
    rows = []
    for kind in UNCONTENDED:
        rate = support.median(rates[kind])
        count = counts[kind]
        rows.append(
            [
                LABELS[kind],
                f"{rate:,.0f}",
                f"{min(rates[kind]):,.0f}-{max(rates[kind]):,.0f}",
                f"{1e6 / rate:.1f}",
                f"{lock_loops.same_round(rates[kind], rates['redis-py']):.2f}x",
                f"{count['trips']:.2f}",
                f"{count['commands']:.2f}",
                f"{count['client_us']:.0f}",
                f"{count['server_us']:.0f}",
            ]
        )
    lines = [
        f"a. Uncontended acquire+release on one connection (one reused lock object each): "
        f"{args.segments} interleaved rounds x {args.seconds / args.segments:.2f} s per "
        "contender, order rotated each round; cycles/s is the median of rounds",
        "",
        support.table(
            [
                "contender",
                "cycles/s",
                "rounds min-max",
                "us/cycle",
                "vs redis-py*",
                "client round trips/cycle",
                "server commands/cycle",
                "client CPU us/cycle",
                "server CPU us/cycle",
            ],
            rows,
        ),
        "",
        "* median over rounds of (this contender's cycles/s / redis-py's in the same round).",
        f"Round trips, commands and CPU: a separate run of {args.counted_cycles} cycles per "
        f"contender in {args.segments} interleaved chunks (replies counted by the connection "
        "class; CONFIG RESETSTAT, then INFO commandstats, where commands run by Lua scripts "
        "count too; CPU: process_time() and the server's INFO cpu, median of chunks). Server "
        "commands per cycle by name:",
    ]
    for kind in UNCONTENDED:
        by_name = counts[kind]["by_name"]
        detail = ", ".join(f"{name} {calls:g}" for name, calls in sorted(by_name.items()))
        lines.append(f"  {LABELS[kind]}: {detail}")
    lines += ["", "Targets:"]
    for kind in UNCONTENDED[:3]:
        trips = counts[kind]["trips"]
        lines.append(
            f"  {LABELS[kind]}: {trips:.2f} client round trips/cycle <= 2: "
            f"{support.verdict(trips <= 2)}"
        )
    count = counts["stock_locks"]
    flush = sum(count["by_name"].get(name, 0) for name in FLUSH_COMMANDS)
    flush += count["by_name"].get("eval", 0)  # (the TIME of each flush)
    commands = round(count["commands"] - flush, 6)  # (the float sum's last digits)
    lines.append(
        f"  stock_locks Lock: {commands:.2f} server commands/cycle <= 6: "
        f"{support.verdict(commands <= 6.0)}  ({count['commands']:.3f} counted, less "
        f"{flush:.3f} of this process's metrics flush, once a second, in every row alike)"
    )
    paired = lock_loops.paired(rates["stock_locks"], rates["redis-py"])
    ratio = support.median(paired)
    lines.append(
        f"  stock_locks Lock / redis-py Lock cycles/s (median of same-round ratios) = "
        f"{ratio:.3f}x >= 1.0x: {support.verdict(ratio >= 1.0)}  (min {min(paired):.2f}, "
        f"max {max(paired):.2f})"
    )
    return lines


# -- b. contended -----------------------------------------------------------------


def contended(server, args) -> list[str]:
    stats = lock_loops.contended(
        CONTENDED, make_lock, (server.url,), processes=args.processes,
        seconds=args.contended_seconds, rounds=args.rounds, warmup=args.warmup,
        counter_url=server.url, work_ms=args.work_ms, outside_ms=args.outside_ms,
        sleep_inside=args.sleep_inside,
    )  # fmt: skip
    labels = {kind: f"{LABELS[kind]} ({HOW_THEY_WAIT[kind]})" for kind in CONTENDED}
    support.figure(
        "lock handoff waits (ms)",
        {LABELS[kind]: [w * 1000 for w in stats[kind]["waits"]] for kind in CONTENDED},
    )
    polling_gaps = stats["redis-py"]["gaps"]
    handoff_rows = []
    for kind in CONTENDED:
        gaps, other = stats[kind]["gaps"], stats[kind]["gaps_other"]

        def lower(pct: float, gaps=gaps) -> str:
            mine = support.percentile(gaps, pct)
            return f"{support.percentile(polling_gaps, pct) / mine:.1f}x" if mine else "-"

        handoff_rows.append(
            [
                labels[kind],
                len(gaps),
                lock_loops.ms(support.percentile(gaps, 50)),
                lock_loops.ms(support.percentile(gaps, 99)),
                f"{100 * len(other) / len(gaps):.0f}%" if gaps else "-",
                lock_loops.ms(support.percentile(other, 50)) if other else "-",
                lock_loops.ms(support.percentile(stats[kind]["release_calls"], 50)),
                lower(50),
                lower(99),
            ]
        )
    lines = [
        lock_loops.contended_intro("b", args, ""),
        "",
        *lock_loops.contended_table(stats, labels, "redis-py", args.processes),
        "",
        "Handoff gap: from release() called to the next grant (any process), for the "
        "releases made while at least one other process was waiting (Redis count read "
        "while still holding the lock); timestamps merged from every process's "
        "CLOCK_MONOTONIC. It includes the release's own round trip (release() p50).",
        "",
        support.table(
            [
                "contender",
                "handoffs",
                "gap p50 ms",
                "gap p99 ms",
                "next grant to another process",
                "gap p50 ms then",
                "release() p50 ms",
                "redis-py / this p50",
                "redis-py / this p99",
            ],
            handoff_rows,
        ),
        "",
        "Targets:",
    ]
    ours, polling, prl, baton = (stats[kind] for kind in CONTENDED)
    a, b = (support.percentile(e["waits"], 99) for e in (polling, ours))
    ratio = a / b if b else float("inf")
    lines.append(
        f"  p99 wait >= 10x lower than redis-py (design target): redis-py {a * 1000:.2f} ms / "
        f"stock_locks {b * 1000:.2f} ms = {ratio:.1f}x: {support.verdict(ratio >= 10)}"
    )
    a, b = (support.percentile(e["gaps"], 50) for e in (polling, ours))
    ratio = a / b if b else float("inf")
    lines.append(
        f"  handoff gap p50 >= 10x lower than redis-py: redis-py {a * 1000:.2f} ms / "
        f"stock_locks {b * 1000:.2f} ms = {ratio:.1f}x: {support.verdict(ratio >= 10)}"
    )
    floor = support.percentile(baton["gaps"], 50)
    lines.append(
        f"  (the baton's gap under this same load: {lock_loops.ms(floor)} ms p50, one BLPOP "
        "reply on raw sockets, no client library, no script; the 10x target asks for "
        f"{lock_loops.ms(a / 10)} ms = {a / 10 / floor:.1f}x that, with a release, a grant and "
        f"both clients' bookkeeping inside; stock_locks' gap is {b / floor:.1f}x it)"
    )
    again = 100 * polling["again"] / max(1, sum(polling["sections"].values()))
    lines.append(
        f"  (not a target: redis-py's p50 wait is low because its releaser re-takes the lock "
        f"(barging: same process again {again:.0f}%) while the pollers sleep out their 0.1 s; "
        f"so its gap is mostly the releaser's own {args.outside_ms:g} ms outside pause, and the "
        "pollers' cost shows in the p99 wait and the sections-per-process spread)"
    )
    paired = lock_loops.paired(ours["rates"], prl["rates"])
    ratio = support.median(paired)
    lines.append(
        f"  stock_locks / python-redis-lock sections/s (median of same-round ratios) = "
        f"{ratio:.3f}x >= 1.00x: {support.verdict(ratio >= 1)}  (rounds: "
        + ", ".join(f"{p:.2f}" for p in paired)
        + ")"
    )
    return lines + lock_loops.exclusion_targets(stats, ())


# -- c. waits -----------------------------------------------------------------------


def waits(server, args) -> list[str]:
    """Overshoot of acquire(timeout) on a held lock, and takeover lateness after a dead
    holder's lease, in ms past the deadline."""
    from stock_locks.locks import Lock

    trials = 6 if args.quick else 30
    timeout = 0.05  # seconds, the wait asked for
    lease = 0.2  # seconds, the dead holder's lease
    client = client_for(server)
    overshoot: list[float] = []
    lateness: list[float] = []
    support.progress(f"waits: {trials} trials")
    for _ in range(trials):
        client.flushall()
        Lock("bench:wait", 30, redis=client).acquire()
        start = time.perf_counter()
        if Lock("bench:wait", 30, redis=client).acquire(timeout=timeout):
            raise RuntimeError("a held lock was granted")
        overshoot.append((time.perf_counter() - start - timeout) * 1000)
        client.flushall()
        dead = Lock("bench:dead", lease, redis=client)
        dead.acquire()
        lease_end = time.perf_counter() + client.pttl(dead.keys.lock) / 1000
        if not Lock("bench:dead", 30, redis=client).acquire(timeout=5):
            raise RuntimeError("the dead holder's lock was not granted")
        lateness.append((time.perf_counter() - lease_end) * 1000)
    client.flushall()
    client.close()
    rows = [
        [what, f"{support.median(values):.1f}", f"{support.percentile(values, 90):.1f}",
         f"{max(values):.1f}"]
        for what, values in (
            (f"acquire(timeout={timeout}) overshoot", overshoot),
            (f"takeover after a {lease} s lease end", lateness),
        )
    ]  # fmt: skip
    return [
        f"c. Waits ending late: {trials} trials (ms past the deadline; takeover: past the "
        "lease end read from the server's PTTL, so within ~1 ms of the true end)",
        "",
        support.table(["stock_locks Lock", "median ms", "p90 ms", "max ms"], rows),
    ]


# -- d. dashboard ------------------------------------------------------------------------


def dashboard(server, args) -> list[str]:
    """One lock-list refresh with a few held locks, alone and among
    ``--unrelated-keys`` unrelated keys."""
    from stock_locks import dashboard
    from stock_locks.locks import Lock

    client = client_for(server)
    held = 20
    repeats = 3 if args.quick else 10
    rows = []
    for size in (0, args.unrelated_keys):
        client.flushall()
        pipe = client.pipeline(transaction=False)
        for n in range(size):
            pipe.set(f"app:session:{n}", "x")
            if n % 10_000 == 9_999:
                pipe.execute()
        pipe.execute()
        locks = [Lock(f"order:{n}", 300, redis=client) for n in range(held)]
        for lock in locks:
            lock.acquire()
        support.progress(f"dashboard: {size} unrelated keys")
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            page = dashboard.lock_page(client=client)
            times.append((time.perf_counter() - start) * 1000)
        if page["total"] != held:
            raise RuntimeError(f"listed {page['total']} locks, {held} held")
        for lock in locks:
            lock.release()
        rows.append([f"{size:,}", held, f"{support.median(times):.2f}"])
    client.flushall()
    client.close()
    return [
        f"d. Dashboard lock list: one refresh (lock_page, first page read in detail), "
        f"{held} held locks among N unrelated keys; median of {repeats}",
        "",
        support.table(["unrelated keys", "held locks", "refresh ms"], rows),
    ]


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    sections = set(args.only or "abcd")
    with support.private_redis() as server:
        support.setup_django(server.url)
        lines = support.header(
            "Lock benchmark", server, ("redis", "python-redis-lock", "Django"), args.quick
        )
        if "a" in sections:
            lines += [""] + uncontended(server, args)
        if "b" in sections:
            lines += [""] + contended(server, args)
        if "c" in sections:
            lines += [""] + waits(server, args)
        if "d" in sections:
            lines += [""] + dashboard(server, args)
    return "\n".join([*lines, "", support.load_line()])


if __name__ == "__main__":
    print(main(sys.argv[1:]))
