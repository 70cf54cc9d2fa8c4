"""Stock strategies side by side: the Redis ceiling, one hot SKU, and the flash sale.

a. Ceiling, one process on one connection: a raw EVALSHA loop of a trivial
   script (``return 1``), a raw EVALSHA loop of ``stock_reserve.lua``, and
   ``LuaStrategy.reserve_in_redis`` (the Redis half of a ``lua`` reservation,
   where Redis alone decides, with the strategy's Python around it). Short
   segments, interleaved, order rotated.
b. One hot SKU whose stock never runs out (10**9): P processes each loop
   ``strategy.reserve(<fresh order ref>, {SKU: 1})`` for a fixed time after a
   start barrier, for every strategy (plus the Redis half of ``lua`` alone, as
   the reference). Product reset, reservations deleted, Redis flushed and the
   tables vacuumed between contenders; the contenders run in interleaved
   rounds with the order rotated, because the machine is shared and noisy.
c. The flash sale (the design's headline): ``stock_locks.stock.stress.run_stress``,
   1,000 units, 10,000 buyers, 16 processes, every strategy, in rounds; beside
   them ``lua`` with its sold-out cache off and with its group commit off, and
   the same attempts as a bare Lua decrement (EVALSHA of GET/DECRBY, no
   database, no record) on the same Redis: what Redis alone allows. These four
   are cheap and run more rounds than the database-bound strategies.

Everything runs against a private redis-server and a dedicated PostgreSQL
database (``stock_locks_bench`` on 127.0.0.1, created and migrated when
missing), unless ``DATABASE_URL`` is set, which is then used as it is (only
this benchmark's rows are reset or deleted there).
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import sys
import time
from array import array
from collections import Counter
from datetime import UTC, datetime

from . import support

STRATEGIES = ("lua", "watch", "lock", "db_row_lock", "db_conditional")
REDIS_HALF = "lua: Redis half only"  # reserve_in_redis alone: no database write
LABELS = {
    "lua": "lua",
    "watch": "watch",
    "lock": "lock",
    "db_row_lock": "db_row_lock",
    "db_conditional": "db_conditional",
    REDIS_HALF: "(lua: Redis half only, no DB)",
}
BASELINE = "db_row_lock"
HOT_SKU = "BENCH-HOT"
HOT_STOCK = 10**9  # units: never runs out during a measurement
REF_PREFIX = "bench-"  # order refs of the hot-SKU phases (and only those are deleted)
FLASH_PREFIX = "BENCHSALE"  # SKU and order-ref prefix of the flash-sale runs
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/stock_locks_bench"
SEGMENT = 0.2  # seconds, one call's share of one ceiling round

# Targets (printed PASS/FAIL, never asserted).
CEILING_TARGET = 0.7  # lua's Redis half per process vs raw EVALSHA of `return 1`
HOT_TARGET = 3.0  # lua (with its DB write) vs db_row_lock at the most processes
FLASH_TARGET = 5.0  # flash sale attempts/s, lua vs db_row_lock
BARE_TARGET = 0.6  # flash sale attempts/s, lua vs a bare Lua decrement (no database)
BARE = "bare EVALSHA decrement"  # the flash sale's Redis-only reference (no database)
NO_CACHE = "lua, SOLD_OUT_TTL=0"  # lua without its sold-out cache: every refusal asks Redis
NO_GROUP = "lua, GROUP_COMMIT off"  # lua writing every sale in a transaction of its own
REDIS_SIDE = ("lua", NO_CACHE, NO_GROUP, BARE)  # the flash contenders that are cheap to repeat
BARE_DECREMENT = (
    "local left = tonumber(redis.call('GET', KEYS[1]) or '0') "
    "if left < tonumber(ARGV[1]) then return 0 end "
    "redis.call('DECRBY', KEYS[1], ARGV[1]) return 1"
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks stock",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument(
        "--processes",
        nargs="+",
        help="process counts of the hot-SKU test, e.g. 1 8 32 or 1,8,32 (1,8,32; quick 1,4)",
    )
    parser.add_argument(
        "--seconds", type=float, help="measured seconds per contender and round (1; quick 0.5)"
    )
    parser.add_argument(
        "--rounds", type=int, help="interleaved rounds of the hot-SKU test (2; quick 1)"
    )
    parser.add_argument(
        "--warmup", type=float, help="seconds before each measurement (0.5; quick 0.2)"
    )
    parser.add_argument(
        "--strategies",
        nargs="+",
        choices=STRATEGIES,
        default=list(STRATEGIES),
        help="strategies to compare (all)",
    )
    parser.add_argument(
        "--parts",
        default="ceiling,hot,flash",
        help="comma-separated parts to run: ceiling, hot, flash (all)",
    )
    parser.add_argument("--flash-stock", type=int, help="flash sale units (1000; quick 200)")
    parser.add_argument("--flash-buyers", type=int, help="flash sale buyers (10000; quick 2000)")
    parser.add_argument("--flash-processes", type=int, help="flash sale processes (16; quick 8)")
    parser.add_argument("--flash-rounds", type=int, help="flash sale rounds (1)")
    parser.add_argument(
        "--flash-redis-rounds",
        type=int,
        help="flash sale rounds of lua, its variants and the bare decrement (7; quick 1)",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    if args.processes:
        args.processes = [int(p) for item in args.processes for p in item.split(",") if p]
    else:
        args.processes = [1, 4] if quick else [1, 8, 32]
    if any(p < 1 for p in args.processes):
        parser.error("--processes: counts must be >= 1")
    # (Defaults sized for `make bench`: every benchmark within 10 minutes on 2 CPUs.)
    args.seconds = args.seconds or (0.5 if quick else 1.0)
    args.rounds = args.rounds or (1 if quick else 2)
    args.warmup = (0.2 if quick else 0.5) if args.warmup is None else args.warmup
    args.flash_stock = args.flash_stock or (200 if quick else 1000)
    args.flash_buyers = args.flash_buyers or (2000 if quick else 10000)
    args.flash_processes = args.flash_processes or (8 if quick else 16)
    args.flash_rounds = args.flash_rounds or 1
    args.flash_redis_rounds = max(args.flash_rounds, args.flash_redis_rounds or (1 if quick else 7))
    args.parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    unknown = args.parts - {"ceiling", "hot", "flash"}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}")
    args.strategies = [s for s in STRATEGIES if s in args.strategies]  # keep the fixed order
    # Ceiling: about as long as one contender's hot-SKU measurements, in short segments.
    args.segments = max(3, round(args.seconds * args.rounds / SEGMENT))
    return args


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# -- the database -------------------------------------------------------------------


def database_url() -> tuple[str, bool]:
    """The database to use and whether it is the user's own (``DATABASE_URL``)."""
    url = os.environ.get("DATABASE_URL")
    return (url, True) if url else (DEFAULT_DATABASE_URL, False)


def redacted(url: str) -> str:
    """``url`` without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


def vacuum() -> None:
    """VACUUM ANALYZE the stock and reservation tables (PostgreSQL only): every contender
    starts without the dead rows the previous one left on the hot row and the index."""
    from django.db import connection

    from stock_locks.models import Reservation
    from stock_locks.stock.table import StockTable

    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return
    with connection.cursor() as cursor:
        for model in (StockTable().model, Reservation):
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


def reset_hot() -> None:
    """The hot SKU back to ``HOT_STOCK`` (fence 0), this benchmark's reservations deleted,
    Redis flushed (our private server) and the counter loaded from the database."""
    from stock_locks.backends.redis import get_redis
    from stock_locks.models import Reservation
    from stock_locks.stock.reconcile import sync_counters
    from stock_locks.stock.table import StockTable

    stock = StockTable()
    fields = {f.name for f in stock.model._meta.get_fields()}
    defaults = {stock.qty: HOT_STOCK}
    if "fence" in fields:  # the Redis fencing counters go with the FLUSHALL below
        defaults["fence"] = 0
    if "name" in fields:
        defaults["name"] = "benchmark hot SKU"
    stock.objects.update_or_create(**{stock.sku: HOT_SKU}, defaults=defaults)
    Reservation.objects.filter(order_ref__startswith=REF_PREFIX).delete()
    get_redis().flushall()
    sync_counters([HOT_SKU])
    vacuum()


# -- a. ceiling -------------------------------------------------------------------


def ceiling_calls() -> tuple:
    """The client and the three single-connection calls on it, each with a fresh order
    ref where one is needed."""
    from stock_locks import scripts
    from stock_locks.stock import get_strategy

    strategy = get_strategy("lua")
    client = strategy.redis
    trivial_sha = client.script_load("return 1")
    reserve_sha = client.script_load(scripts.STOCK_RESERVE.script)
    keys = strategy.keys
    counter, index = keys.counter(HOT_SKU), keys.index
    lines = {HOT_SKU: 1}
    strategy.restore_after_data_loss()  # the "loaded" marker the script checks first
    refs = itertools.count()

    def trivial():
        return client.evalsha(trivial_sha, 0)

    def raw_reserve():
        ref = f"ceiling-raw-{next(refs)}"
        return client.evalsha(
            reserve_sha, 7, keys.record(ref), index, keys.loaded, keys.versions,
            keys.confirm_queue, keys.confirm_leader, counter, ref, 0, 1, HOT_SKU,
        )  # fmt: skip

    def redis_half():
        return strategy.reserve_in_redis(f"ceiling-half-{next(refs)}", lines)

    # Each must actually reserve (or answer), not fail quietly.
    assert int(trivial()) == 1
    assert int(raw_reserve()[0]) == 1, "stock_reserve.lua did not reserve"
    assert redis_half()[0] is True, "reserve_in_redis did not reserve"
    return client, {
        "EVALSHA `return 1` (raw client.evalsha)": trivial,
        "EVALSHA stock_reserve.lua (raw client.evalsha)": raw_reserve,
        "LuaStrategy.reserve_in_redis (lua's Redis half)": redis_half,
    }


def ceiling(args) -> tuple[list[str], dict]:
    reset_hot()
    client, calls = ceiling_calls()
    names = list(calls)
    support.progress("ceiling: warm-up")
    for name in names:
        support.timed_calls(calls[name], 0.2)
    rates: dict[str, list[float]] = {name: [] for name in names}
    client_us: dict[str, list[float]] = {name: [] for name in names}
    server_us: dict[str, list[float]] = {name: [] for name in names}
    support.progress(f"ceiling: {args.segments} rounds")
    for r in range(args.segments):
        for name in support.rotated(names, r):
            client.config_resetstat()
            rate, cpu = support.timed_calls(calls[name], SEGMENT)
            evalsha = client.info("commandstats").get("cmdstat_evalsha", {})
            rates[name].append(rate)
            client_us[name].append(cpu)
            if evalsha.get("calls"):
                server_us[name].append(evalsha["usec"] / evalsha["calls"])
    trivial = names[0]

    def vs_trivial(name: str) -> list[float]:
        return [a / b for a, b in zip(rates[name], rates[trivial], strict=True)]

    rows = []
    for name in names:
        rate = support.median(rates[name])
        rows.append(
            [
                name,
                f"{rate:,.0f}",
                f"{min(rates[name]):,.0f}-{max(rates[name]):,.0f}",
                f"{1e6 / rate:.1f}",
                f"{support.median(client_us[name]):.1f}",
                f"{support.median(server_us[name]):.1f}",
                f"{support.median(vs_trivial(name)):.2f}x",
            ]
        )
    half = vs_trivial(names[2])
    result = {
        "half_ratio": support.median(half),
        "half_rate": support.median(rates[names[2]]),
        "trivial_rate": support.median(rates[trivial]),
    }
    lines = [
        f"a. Ceiling: one process, one connection (the strategy's django-redis client); "
        f"{args.segments} interleaved rounds x {SEGMENT:.2f} s per call, "
        "order rotated; calls/s is the median of rounds",
        "",
        support.table(
            [
                "call",
                "calls/s",
                "rounds min-max",
                "us/call",
                "client CPU us/call",
                "server us/call",
                "vs return 1*",
            ],
            rows,
        ),
        "",
        "* median over rounds of (this call's rate / EVALSHA `return 1`'s in the same round).",
        "stock_reserve.lua and reserve_in_redis reserve for real (fresh order ref each call). "
        "client CPU: process_time() (user + system) per call; server: INFO commandstats "
        "usec per EVALSHA (the script and the commands it runs); medians of rounds.",
    ]
    return lines, result


# -- b. one hot SKU -----------------------------------------------------------------


def run_phase(kind: str, seconds: float, warmup: float, prefix: str) -> dict:
    """One worker's part of one contender's measurement: reserve for ``warmup + seconds``."""
    from stock_locks.stock import get_strategy

    redis_only = kind == REDIS_HALF
    strategy = get_strategy("lua" if redis_only else kind)
    call = strategy.reserve_in_redis if redis_only else strategy.reserve
    cart = {HOT_SKU: 1}
    starts, ends, retries = array("d"), array("d"), array("l")
    errors: Counter[str] = Counter()
    samples: list[str] = []
    clock = time.monotonic
    begin = clock()
    measure_from = begin + warmup
    stop = measure_from + seconds
    n = 0
    while True:
        t0 = clock()
        if t0 >= stop:
            break
        n += 1
        try:
            reply = call(f"{prefix}{n}", cart)
        except Exception as exc:  # counted and sampled: watch gives up, lock times out
            if t0 >= measure_from:
                errors[type(exc).__name__] += 1
                if len(samples) < 3:
                    samples.append(f"{type(exc).__name__}: {exc}")
            continue
        t1 = clock()
        starts.append(t0)
        ends.append(t1)
        retries.append(reply[2] if redis_only else reply.retries)  # (took, now ms, retries)
    return {
        "measure_from": measure_from,
        "stop": stop,
        "starts": starts,
        "ends": ends,
        "retries": retries,
        "errors": errors,
        "samples": samples,
    }


def hot_worker(team, plan, warmup):
    """One process of the hot-SKU test: every phase of ``plan`` in step with the others;
    worker 0 resets the stock between phases while the others wait."""
    from django.db import connections

    phases = []
    for p, (kind, seconds) in enumerate(plan):
        team.sync()
        if team.index == 0:
            reset_hot()
        team.sync()
        phases.append(run_phase(kind, seconds, warmup, f"{REF_PREFIX}{p}-{team.index}-"))
    connections.close_all()
    return phases


def hot(args) -> tuple[list[str], dict]:
    kinds = [*args.strategies, REDIS_HALF] if "lua" in args.strategies else args.strategies
    stats: dict[tuple[str, int], dict] = {}
    for processes in args.processes:
        rounds = range(args.rounds)
        plan = [(kind, args.seconds) for r in rounds for kind in support.rotated(kinds, r)]
        support.progress(
            f"hot SKU: {processes} process(es), {len(plan)} phases of "
            f"{args.warmup:g} s warm-up + {args.seconds:g} s"
        )
        results = support.run_workers(hot_worker, processes, plan, args.warmup)
        for p, (kind, _) in enumerate(plan):
            phase = [worker[p] for worker in results]
            lo = max(w["measure_from"] for w in phase)
            hi = min(w["stop"] for w in phase)
            entry = stats.setdefault(
                (kind, processes),
                {
                    "rates": [],
                    "latencies": [],
                    "ok": 0,
                    "retries": 0,
                    "errors": Counter(),
                    "samples": [],
                },
            )
            done = 0
            for w in phase:
                for t0, t1, tries in zip(w["starts"], w["ends"], w["retries"], strict=True):
                    if lo <= t1 < hi:
                        done += 1
                        entry["retries"] += tries
                    if lo <= t0 < hi:
                        entry["latencies"].append(t1 - t0)
                entry["errors"].update(w["errors"])
                entry["samples"] += w["samples"][: 3 - len(entry["samples"])]
            entry["ok"] += done
            entry["rates"].append(done / (hi - lo))

    def paired(kind: str, processes: int) -> list[float]:  # same-round ratios vs the baseline
        base = stats.get((BASELINE, processes))
        if base is None:
            return []
        mine = stats[kind, processes]["rates"]
        return [ratio(a, b) for a, b in zip(mine, base["rates"], strict=True)]

    support.figure(
        "reservations/s by processes",
        {LABELS[kind]: {p: support.median(stats[kind, p]["rates"]) for p in args.processes}
         for kind in kinds},
    )  # fmt: skip
    # Side by side: reservations/s per strategy and process count.
    side = []
    for kind in kinds:
        row = [LABELS[kind]]
        for processes in args.processes:
            entry = stats[kind, processes]
            cell = f"{support.median(entry['rates']):,.0f}"
            pairs = paired(kind, processes)
            if pairs:
                cell += f" ({support.median(pairs):.2f}x)"
            row.append(cell)
        side.append(row)
    detail = []
    for kind in kinds:
        for processes in args.processes:
            entry = stats[kind, processes]
            ok = entry["ok"]
            errors = sum(entry["errors"].values())
            detail.append(
                [
                    LABELS[kind],
                    processes,
                    f"{support.median(entry['rates']):,.0f}",
                    "/".join(f"{rate:,.0f}" for rate in entry["rates"]),
                    f"{support.percentile(entry['latencies'], 50) * 1000:.2f}",
                    f"{support.percentile(entry['latencies'], 99) * 1000:.2f}",
                    f"{entry['retries']:,}",
                    f"{entry['retries'] / ok:.2f}" if ok else "-",
                    f"{errors:,}",
                ]
            )
    lines = [
        f"b. One hot SKU (stock {HOT_STOCK:,}, never runs out), cart {{SKU: 1}}, a fresh order "
        f"ref per attempt; P processes loop reserve() for {args.warmup:g} s warm-up + "
        f"{args.seconds:g} s after a start barrier; {args.rounds} interleaved round(s), order "
        "rotated; between contenders the product is reset, reservations deleted, Redis "
        "flushed, tables vacuumed. Successful reservations/s (median of rounds), "
        f"(x) = median same-round ratio to {BASELINE}:",
        "",
        support.table(
            ["strategy"] + [f"{p} process{'es' if p > 1 else ''}" for p in args.processes], side
        ),
        "",
        support.table(
            [
                "strategy",
                "processes",
                "reservations/s",
                "rounds",
                "p50 ms",
                "p99 ms",
                "retries",
                "retries/success",
                "errors",
            ],
            detail,
        ),
        "",
        "Latency: reserve() call to return, successful attempts started in the measured window. "
        "retries: optimistic WATCH conflicts (watch only; each one a re-read after a jittered "
        "backoff), summed over successes in the window. errors: attempts that raised.",
    ]
    for kind in kinds:
        for processes in args.processes:
            entry = stats[kind, processes]
            if entry["errors"]:
                counts = ", ".join(f"{name} {n}" for name, n in entry["errors"].most_common())
                lines.append(
                    f"  {LABELS[kind]} at {processes}: {counts}; e.g. {entry['samples'][0]}"
                )
    return lines, {"stats": stats, "paired": paired}


# -- c. flash sale ------------------------------------------------------------------


def flash(args) -> tuple[list[str], dict]:
    from django.db import connections

    from stock_locks.backends.redis import get_redis
    from stock_locks.models import Reservation
    from stock_locks.stock.stress import StressConfig, run_stress

    config = StressConfig(
        stock=args.flash_stock,
        buyers=args.flash_buyers,
        processes=args.flash_processes,
        prefix=FLASH_PREFIX,
        fields={"name": "Flash sale"},
    )
    # The hot part's last phase leaves its reservations open: each run here starts on
    # an emptied Redis, whose preparation would give them all their records back
    # (restore_after_data_loss, one MULTI of ~11k commands) before every run.
    Reservation.objects.filter(order_ref__startswith=REF_PREFIX).delete()
    names = list(args.strategies)
    if "lua" in names:
        names += [NO_CACHE, NO_GROUP, BARE]
    runs: dict[str, list] = {name: [] for name in names}
    variants = {NO_CACHE: {"SOLD_OUT_TTL": 0}, NO_GROUP: {"GROUP_COMMIT": False}}
    for r in range(args.flash_redis_rounds):
        for name in support.rotated(names, r):
            if r >= args.flash_rounds and name not in REDIS_SIDE:
                continue
            support.progress(
                f"flash sale round {r + 1}/{args.flash_redis_rounds}: {name} "
                f"({config.buyers} buyers, {config.processes} processes)"
            )
            # A clean slate: Redis flushed (run_stress removes its own rows and reservations
            # after each run).
            get_redis().flushall()
            vacuum()
            connections.close_all()  # run_stress forks its workers
            if name == BARE:
                runs[name].append(bare_flash(config))
            elif name in variants:
                override = support.configure_stock_locks(**variants[name])
                try:
                    runs[name].append(run_stress(config, "lua"))
                finally:
                    override.disable()
            else:
                runs[name].append(run_stress(config, name))
    rows = []
    for name in names:
        for r, res in enumerate(runs[name]):
            rows.append(
                [
                    name,
                    r + 1,
                    f"{res.throughput_per_s:,.0f}",
                    res.attempts,
                    res.sold,
                    res.refused,
                    res.errors,
                    res.oversold,
                    res.final_stock,
                    res.drift,
                    "yes" if res.conserved else "NO",
                    f"{res.p50_ms:.2f}",
                    f"{res.p99_ms:.2f}",
                    res.retries,
                    f"{res.seconds:.2f}",
                ]
            )

    def paired(name: str, baseline: str = BASELINE) -> list[float]:
        if baseline not in runs:
            return []
        return [  # same-round pairs (the Redis side has more rounds than the rest)
            ratio(a.throughput_per_s, b.throughput_per_s)
            for a, b in zip(runs[name], runs[baseline], strict=False)
        ]

    support.figure(
        "flash sale attempts/s",
        {name: support.median([res.throughput_per_s for res in runs[name]]) for name in names},
    )
    side = []
    for name in names:
        rates = [res.throughput_per_s for res in runs[name]]
        pairs = paired(name)
        side.append(
            [
                name,
                f"{support.median(rates):,.0f}",
                f"{support.median(pairs):.2f}x" if pairs else "-",
                sum(res.oversold for res in runs[name]),
                "yes" if all(res.ok for res in runs[name]) else "NO",
            ]
        )
    lines = [
        f"c. Flash sale (stock_locks.stock.stress.run_stress, ORM buyers): {config.stock:,} units, "
        f"{config.buyers:,} buyers, {config.processes} forked processes, one hot SKU, cart "
        f"{{SKU: {config.qty}}}; {args.flash_rounds} round(s), {args.flash_redis_rounds} of lua, "
        "its variants and the bare decrement; order rotated",
        "",
        support.table(
            [
                "strategy",
                "round",
                "attempts/s",
                "attempts",
                "sold",
                "refused",
                "errors",
                "oversold",
                "final",
                "drift",
                "conserved",
                "p50 ms",
                "p99 ms",
                "retries",
                "seconds",
            ],
            rows,
        ),
        "",
        support.table(
            [
                "strategy",
                "attempts/s (median)",
                f"vs {BASELINE}*",
                "oversold (all rounds)",
                "ok (no oversell, drift 0, conserved)",
            ],
            side,
        ),
        "",
        f"* median over rounds of (attempts/s / {BASELINE}'s in the same round). attempts/s "
        "counts from the start signal to the last worker's report (fork and set-up excluded).",
    ]
    for name in args.strategies:
        samples = [s for res in runs[name] for s in res.error_samples]
        if samples:
            lines.append(f"  {name} errors, e.g. {samples[0]}")
    return lines, {"runs": runs, "paired": paired}


def bare_flash(config):
    """The flash sale's attempts as a bare Lua decrement on the same Redis, in as many
    forked processes, timed like run_stress (start signal to the last report)."""
    import multiprocessing

    from stock_locks.backends.redis import get_redis
    from stock_locks.stock.stress import StressResult

    client, key = get_redis(), f"{{{FLASH_PREFIX}}}:bare"
    client.set(key, config.stock)
    sha = client.script_load(BARE_DECREMENT)
    ctx = multiprocessing.get_context("fork")
    start, ready, results = ctx.Event(), ctx.Semaphore(0), ctx.Queue()
    share, extra = divmod(config.buyers, config.processes)
    workers = [
        ctx.Process(target=_bare_buyer, args=(sha, key, share + (i < extra), ready, start, results))
        for i in range(config.processes)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:  # connected, as run_stress's buyers are before its clock starts
        if not ready.acquire(timeout=support.SYNC_TIMEOUT):
            raise RuntimeError("a bare-decrement buyer did not connect")
    began = time.perf_counter()
    start.set()
    outcomes = [results.get(timeout=300) for _ in workers]
    seconds = time.perf_counter() - began
    for worker in workers:
        worker.join()
    sold = sum(o[0] for o in outcomes)
    latencies = sorted(x for o in outcomes for x in o[1])
    final = int(client.get(key))
    client.delete(key)
    return StressResult(
        strategy=BARE, attempts=config.buyers, sold=sold, refused=config.buyers - sold,
        errors=0, oversold=max(0, sold - config.stock), final_stock=final, drift=0,
        throughput_per_s=config.buyers / seconds,
        p50_ms=support.percentile(latencies, 50) * 1000,
        p99_ms=support.percentile(latencies, 99) * 1000, retries=0, orders=sold,
        initial_stock=config.stock, conserved=sold + final == config.stock, seconds=seconds,
    )  # fmt: skip


def _bare_buyer(sha, key, attempts, ready, start, results) -> None:  # forked
    from stock_locks.backends.redis import get_redis

    client = get_redis()
    client.ping()
    ready.release()
    start.wait()
    sold, latencies = 0, array("d")
    for _ in range(attempts):
        began = time.perf_counter()
        sold += client.evalsha(sha, 1, key, 1)
        latencies.append(time.perf_counter() - began)
    results.put((sold, list(latencies)))


# -- report -------------------------------------------------------------------------


def header(db_url: str, own_db: bool, created: bool) -> list[str]:
    import redis
    from django.db import connection

    from stock_locks.backends.redis import get_redis

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            database = f"PostgreSQL {cursor.fetchone()[0]}"
    else:
        database = connection.vendor
    source = "DATABASE_URL" if own_db else ("created now" if created else "dedicated")
    redis_py, django_redis, psycopg, django = map(
        support.dist_version, ("redis", "django-redis", "psycopg", "Django")
    )
    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "Python"
    return [
        f"Stock strategy benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"redis-server {support.redis_version(get_redis())} (private, 127.0.0.1); "
        f"{database} at {redacted(db_url)} ({source}); Python {platform.python_version()} "
        f"on {platform.machine()}; {os.cpu_count()} CPUs",
        f"redis-py {redis_py} ({parser} parser), django-redis {django_redis}, "
        f"psycopg {psycopg}, Django {django}; settings "
        f"{support.SETTINGS_MODULE}",
    ]


def targets(args, ceiling_result, hot_result, flash_result) -> list[str]:
    lines = ["Targets:"]
    if ceiling_result:
        r = ceiling_result["half_ratio"]
        lines.append(
            f"  lua Redis half per process {ceiling_result['half_rate']:,.0f}/s vs raw EVALSHA "
            f"`return 1` {ceiling_result['trivial_rate']:,.0f}/s = {r:.2f}x >= "
            f"{CEILING_TARGET}x: {support.verdict(r >= CEILING_TARGET)}"
        )
    if hot_result and "lua" in args.strategies and BASELINE in args.strategies:
        most = max(args.processes)
        pairs = hot_result["paired"]("lua", most)
        r = support.median(pairs)
        stats = hot_result["stats"]
        lines.append(
            f"  lua (with its DB write) / {BASELINE} reservations/s at {most} processes = "
            f"{r:.2f}x >= {HOT_TARGET:g}x: {support.verdict(r >= HOT_TARGET)}  (rounds: "
            + ", ".join(f"{p:.2f}" for p in pairs)
            + f"; {support.median(stats['lua', most]['rates']):,.0f} vs "
            f"{support.median(stats[BASELINE, most]['rates']):,.0f}/s)"
        )
    if flash_result:
        runs = flash_result["runs"]

        def lua_against(baseline: str, target: float) -> None:
            pairs = flash_result["paired"]("lua", baseline)
            r = support.median(pairs)
            lines.append(
                f"  flash sale lua / {baseline} attempts/s = {r:.3f}x >= {target:g}x: "
                f"{support.verdict(r >= target)}  (rounds: "
                + ", ".join(f"{p:.3f}" for p in pairs)
                + ")"
            )

        if "lua" in runs and BASELINE in runs:
            lua_against(BASELINE, FLASH_TARGET)
        if "lua" in runs and BARE in runs:
            lua_against(BARE, BARE_TARGET)
            for name in (NO_CACHE, NO_GROUP):  # what each of the two contributes
                pairs = flash_result["paired"](name, BARE)
                lines.append(
                    f"    for reference, {name} / {BARE} = {support.median(pairs):.2f}x  "
                    "(rounds: " + ", ".join(f"{p:.2f}" for p in pairs) + ")"
                )
        oversold = sum(res.oversold for results in runs.values() for res in results)
        bad = [name for name, results in runs.items() if not all(res.ok for res in results)]
        lines.append(
            f"  flash sale oversold, every strategy and round: {oversold} == 0: "
            f"{support.verdict(oversold == 0)}"
        )
        lines.append(
            "  flash sale stock conserved and drift 0, every strategy and round: "
            + (support.verdict(True) if not bad else f"FAIL ({', '.join(bad)})")
        )
    return lines


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    load_before = support.load_average()
    db_url, own_db = database_url()
    created = support.ensure_database(db_url)
    with support.private_redis() as server:
        support.setup_django(server.url, db_url)
        from django.core.management import call_command
        from django.db import connections

        support.progress(f"migrating {redacted(db_url)}")
        call_command("migrate", verbosity=0, interactive=False)
        lines = header(db_url, own_db, created)
        if args.quick:
            lines.append("(--quick smoke run: short measurements, small numbers, rough)")
        ceiling_result = hot_result = flash_result = None
        if "ceiling" in args.parts:
            part, ceiling_result = ceiling(args)
            lines += [""] + part
        connections.close_all()
        if "hot" in args.parts:
            part, hot_result = hot(args)
            lines += [""] + part
        if "flash" in args.parts:
            part, flash_result = flash(args)
            lines += [""] + part
        lines += [""] + targets(args, ceiling_result, hot_result, flash_result)
        lines += ["", support.load_line(load_before)]
        connections.close_all()
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
