"""Delay queue: drain throughput of one drainer, and lateness of the two runners.

1. Drain throughput, one drainer, one connection, N items already due (seeded
   by a pipeline straight into the queue's keys: ZADD due + HSET items, the
   layout ``delay_schedule.lua`` writes), a trivial handler registered in this
   process. Contenders: ``DelayQueue.drain()`` at several batch sizes (batched
   atomic claims by ``delay_claim.lua``, one batched ack by ``delay_ack.lua``);
   ``claim()`` + ``ack()`` alone (no handler dispatch); the two scripts by raw
   EVALSHA (no JSON decoding, no ``Item``: the floor of this design); and the
   naive loop (ZRANGEBYSCORE 0 now LIMIT 0 1, ZREM as ownership, HGET, handler,
   HDEL: four round trips per item) on fewer items. Every run is checked: each
   item handled exactly once, the queue's keys empty afterwards. Contenders run
   in interleaved rounds, order rotated, on a FLUSHALLed private redis-server.
2. Lateness (handled minus due) of items scheduled over a few seconds with
   random delays, drained by (a) a real Celery worker + beat (the shipped
   ``stock_locks.drain_delay_queue`` every ``DELAY_QUEUE_INTERVAL`` = 1 s) and
   (b) ``manage.py run_delay_queue`` (wakes at the next due time, or when an
   earlier item is scheduled). Both run the whole time, as subprocesses with
   ``DJANGO_SETTINGS_MODULE=benchmarks.dq_settings`` (the demo settings plus the
   handler ``bench.record`` of ``benchmarks/dq_handlers.py``), on the private
   Redis (also the Celery broker) and their own PostgreSQL database; they drain
   different queues, and the workloads alternate between them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import redis

from . import support

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/stock_locks_bench_dq"
CHILD_SETTINGS = "benchmarks.dq_settings"

NOOP_TASK = "bench.noop"  # the trivial handler of part 1, registered in this process
DRAIN_QUEUE = "bench_drain"  # part 1's queue
BEAT_QUEUE = "default"  # what the Celery task drains (STOCK_LOCKS["DELAY_QUEUES"])
RUNNER_QUEUE = "bench_runner"  # what run_delay_queue drains
DEFAULT_BATCH = 500  # STOCK_LOCKS["DELAY_QUEUE_BATCH"]
SEED_CHUNK = 5000  # items per ZADD/HSET when seeding
TARGET_RATE = 20_000  # items/s drained by one drainer
TARGET_P99_MS = 50.0  # run_delay_queue lateness p99
TARGET_CLAIM_ACK = 0.6  # claim()+ack() items/s / the two scripts' by raw EVALSHA
CLAIM_ACK = f"claim()+ack() only, batch {DEFAULT_BATCH}"
RAW_CLAIM_ACK = f"raw EVALSHA claim+ack, batch {DEFAULT_BATCH}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks delay_queue", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument("--items", type=int, help="items per drain run (50,000; quick 5,000)")
    parser.add_argument(
        "--naive-items", type=int, help="items per naive-loop run (min(items, 10,000); quick 1,000)"
    )
    parser.add_argument("--rounds", type=int, help="interleaved drain rounds (3; quick 1)")
    parser.add_argument(
        "--batches", default="10,100,500,1000", help="drain() batch sizes (10,100,500,1000)"
    )
    parser.add_argument(
        "--lateness-items", type=int, help="items per lateness workload (200; quick 40)"
    )
    parser.add_argument(
        "--spread", type=float, help="seconds over which those items fall due (10; quick 3)"
    )
    parser.add_argument(
        "--lateness-rounds", type=int, help="workloads per runner, alternated (2; quick 1)"
    )
    parser.add_argument(
        "--parts", default="drain,lateness", help="which parts to run (drain,lateness)"
    )
    parser.add_argument(
        "--database-url", default=DEFAULT_DATABASE_URL, help="PostgreSQL for the subprocesses"
    )
    args = parser.parse_args(argv)
    args.items = args.items or (5_000 if args.quick else 50_000)
    args.naive_items = args.naive_items or min(args.items, 1_000 if args.quick else 10_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    args.lateness_items = args.lateness_items or (40 if args.quick else 200)
    args.spread = args.spread or (3.0 if args.quick else 10.0)
    args.lateness_rounds = args.lateness_rounds or (1 if args.quick else 2)
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    return args


# -- part 1: drain throughput ------------------------------------------------------

SEEN = bytearray()  # handled count per item number, reset before every run


def noop(payload: int) -> None:
    SEEN[payload] += 1


def seed(client: redis.Redis, keys, n: int) -> None:
    """N items of ``bench.noop``, payloads 0..n-1, all due in the past, in distinct order."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    pipe = client.pipeline(transaction=False)
    for start in range(0, n, SEED_CHUNK):
        chunk = range(start, min(n, start + SEED_CHUNK))
        pipe.zadd(keys.due, {f"i{i}": now_ms - n + i for i in chunk})
        pipe.hset(
            keys.items, mapping={f"i{i}": f'{{"task":"{NOOP_TASK}","payload":{i}}}' for i in chunk}
        )
    pipe.execute()


def run_drain(queue, batch: int) -> int:
    result = queue.drain(limit=batch, max_batches=10**9)
    if result.failed or result.dead or result.dispatched:
        raise RuntimeError(f"drain: unexpected outcome {result}")
    return result.handled


def run_claim_ack(queue, batch: int) -> int:
    done = 0
    while True:
        items = queue.claim(batch)
        if not items:
            return done
        for item in items:
            SEEN[item.payload] += 1  # the bookkeeping of the check, not a dispatch
        done += queue.ack(*[item.id for item in items])


def run_raw_scripts(queue, batch: int) -> int:
    from stock_locks import scripts

    k = queue.keys
    claim_keys = (k.due, k.items, k.attempts, k.errors, k.inflight, k.dead)
    ack_keys = (k.inflight, k.items, k.attempts, k.errors)
    argv = (batch, 30_000, 5)
    client = queue.redis
    done = 0
    while True:
        flat = scripts.DELAY_CLAIM(claim_keys, argv, client=client)
        if not flat:
            return done
        done += scripts.DELAY_ACK(ack_keys, flat[:-2][0::3], client=client)


def run_naive(queue, batch: int) -> int:
    """One item per iteration, four round trips, as the seeds do it."""
    from stock_locks.delayqueue import HANDLERS

    client, due, items = queue.redis, queue.keys.due, queue.keys.items
    done = 0
    while True:
        now_ms = int(time.time() * 1000)
        ids = client.zrangebyscore(due, 0, now_ms, start=0, num=1)
        if not ids:
            return done
        if client.zrem(due, ids[0]) != 1:
            continue  # another drainer took it
        body = client.hget(items, ids[0])
        item = json.loads(body)
        HANDLERS[item["task"]](item["payload"])
        client.hdel(items, ids[0])
        done += 1


def contenders(args) -> dict[str, tuple[Callable, int, str]]:
    """label -> (function, batch, kind); kind 'handler': the handler's counts are checked."""
    out = {}
    for b in args.batches:
        label = f"drain(), batch {b}" + (" (default)" if b == DEFAULT_BATCH else "")
        out[label] = (run_drain, b, "handler")
    out[CLAIM_ACK] = (run_claim_ack, DEFAULT_BATCH, "handler")
    out[RAW_CLAIM_ACK] = (run_raw_scripts, DEFAULT_BATCH, "raw")
    out["naive loop, 1 item / 4 round trips"] = (run_naive, 1, "handler")
    return out


def one_run(server, client, admin, queue, func, batch, kind, n) -> dict:
    """Flush, seed n items, drain them with ``func`` (timed), check, return the numbers."""
    global SEEN
    admin.flushall()
    seed(admin, queue.keys, n)
    SEEN = bytearray(n)
    admin.config_resetstat()
    cpu_before = support.server_cpu(admin)
    support.CountingConnection.replies = 0
    client_cpu = time.process_time()
    start = time.perf_counter()
    done = func(queue, batch)
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - client_cpu
    trips = support.CountingConnection.replies
    server_used = support.server_cpu(admin) - cpu_before
    stats = admin.info("commandstats")
    commands = sum(
        v["calls"]
        for name, v in stats.items()
        if name.removeprefix("cmdstat_").split("|")[0] not in ("config", "info")
    )
    server_by_name = {
        name.removeprefix("cmdstat_"): v["usec"] / n
        for name, v in stats.items()
        if name.removeprefix("cmdstat_").split("|")[0] not in ("config", "info", "hello")
    }
    leftover = sum(admin.exists(key) for key in queue.keys[:6])  # due..dead
    if kind == "handler":
        counts = Counter(SEEN)
        exactly_once = counts.get(1, 0) == n and done == n
        detail = ", ".join(f"{c}x: {m}" for c, m in sorted(counts.items()) if c != 1)
    else:
        exactly_once = done == n
        detail = f"acked {done}"
    ok = exactly_once and leftover == 0
    return {
        "rate": done / elapsed,
        "ok": ok,
        "problem": "" if ok else f"handled {done}/{n}; {detail}; {leftover} queue keys left",
        "trips": trips / n,
        "commands": commands / n,
        "client_us": client_cpu / n * 1e6,
        "server_us": server_used / n * 1e6,
        "usec_by_name": server_by_name,
    }


def timed_drain(admin, queue, n: int) -> dict[str, float]:
    """One drain(batch 500) of ``n`` items with timing wrappers around claim(), its round
    trip (the claim script), the handling of each item, ack() and its round trip (the ack
    script), restored after: seconds spent in each."""
    global SEEN
    from stock_locks.delayqueue import runner

    admin.flushall()
    seed(admin, queue.keys, n)
    SEEN = bytearray(n)
    spent: Counter = Counter()
    within: list[str] = []  # the public call running now: its round trips count as its script's

    def timed(name, func):
        def wrapper(*a, **kw):
            within.append(name)
            t0 = time.perf_counter()
            try:
                return func(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
                within.pop()

        return wrapper

    def timed_run(requests):
        t0 = time.perf_counter()
        try:
            return queue.backend.run(requests)
        finally:
            if within:
                spent[f"{within[-1]} script"] += time.perf_counter() - t0

    original_handle = runner._handle
    queue.claim = timed("claim", queue.claim)
    queue.ack = timed("ack", queue.ack)
    queue._run = timed_run
    runner._handle = timed("handle", original_handle)
    try:
        start = time.perf_counter()
        handled = queue.drain(limit=DEFAULT_BATCH, max_batches=10**9).handled
        spent["total"] = time.perf_counter() - start
    finally:
        runner._handle = original_handle
        for name in ("claim", "ack", "_run"):
            del queue.__dict__[name]
    if handled != n:
        raise RuntimeError(f"breakdown: handled {handled} of {n}")
    admin.flushall()
    return spent


def breakdown(admin, queue, n: int, repeats: int, by_name: dict[str, list[dict]]) -> list[str]:
    """Where drain(batch 500) spends its wall time per item (median of ``repeats`` runs with
    timing wrappers), and Redis' own time per item by command (from the measured rounds)."""
    runs = [timed_drain(admin, queue, n) for _ in range(repeats)]

    def us(pick) -> float:
        return support.median([pick(run) for run in runs]) / n * 1e6

    parts = [
        ("claim(): EVALSHA delay_claim (send, Lua, read reply)", lambda r: r["claim script"]),
        ("claim(): Python (JSON decode, an Item per item)",
         lambda r: r["claim"] - r["claim script"]),
        ("handling per item (lookup, call, count)", lambda r: r["handle"]),
        ("ack(): EVALSHA delay_ack", lambda r: r["ack script"]),
        ("ack(): Python", lambda r: r["ack"] - r["ack script"]),
        ("drain() loop itself + the wrappers",
         lambda r: r["total"] - r["claim"] - r["handle"] - r["ack"]),
    ]  # fmt: skip
    total = us(lambda r: r["total"])
    lines = [
        f"Where drain(batch {DEFAULT_BATCH}) spends its wall time, per item: median of "
        f"{repeats} extra run(s) of {n:,} items with timing wrappers on "
        f"({1e6 / total:,.0f} items/s with them):",
    ]
    for label, pick in parts:
        value = us(pick)
        lines.append(f"  {label:<55} {value:6.2f} us  {value / total:6.1%}")
    lines += [
        "",
        "Redis' own time per item by command (INFO commandstats usec / items, median of the "
        "measured rounds; evalsha includes the commands its script runs, listed after it):",
    ]
    for label, runs_of in by_name.items():
        names = sorted({name for run in runs_of for name in run})
        values = {name: support.median([run.get(name, 0.0) for run in runs_of]) for name in names}
        inner = ", ".join(
            f"{name} {value:.2f}"
            for name, value in sorted(values.items(), key=lambda kv: -kv[1])
            if name != "evalsha" and value >= 0.005
        )
        lines.append(f"  {label}: evalsha {values.get('evalsha', 0.0):.2f} us = {inner}")
    return lines


def drain_part(server, args) -> tuple[list[str], dict]:
    from stock_locks.delayqueue import DelayQueue, handler

    handler(NOOP_TASK)(noop)
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=server.port, connection_class=support.CountingConnection
    )
    client = redis.Redis(connection_pool=pool)
    admin = server.client()
    queue = DelayQueue(DRAIN_QUEUE, redis=client)
    runs = contenders(args)
    labels = list(runs)
    naive_label = labels[-1]

    def size(label: str) -> int:
        return args.naive_items if label == naive_label else args.items

    support.progress("drain: warm-up")
    for label in labels:
        func, batch, kind = runs[label]
        one_run(server, client, admin, queue, func, batch, kind, min(1000, size(label)))
    results: dict[str, list[dict]] = {label: [] for label in labels}
    for r in range(args.rounds):
        support.progress(f"drain: round {r + 1}/{args.rounds}")
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            func, batch, kind = runs[label]
            results[label].append(
                one_run(server, client, admin, queue, func, batch, kind, size(label))
            )
    default_label = next(label for label in labels if "(default)" in label)
    support.progress("drain: breakdown")
    by_name = {default_label: [x["usec_by_name"] for x in results[default_label]]}
    parts = breakdown(admin, queue, args.items, args.rounds, by_name)
    client.close()
    admin.close()

    def same_round(label: str, other: str) -> float:
        return support.median(
            [a["rate"] / b["rate"] for a, b in zip(results[label], results[other], strict=True)]
        )

    rows = []
    for label in labels:
        runs_of = results[label]
        rates = [x["rate"] for x in runs_of]
        rows.append(
            [
                label,
                f"{size(label):,}",
                f"{support.median(rates):,.0f}",
                f"{min(rates):,.0f}-{max(rates):,.0f}",
                f"{1e6 / support.median(rates):.1f}",
                f"{same_round(label, naive_label):.1f}x",
                f"{support.median([x['trips'] for x in runs_of]):.3f}",
                f"{support.median([x['commands'] for x in runs_of]):.2f}",
                f"{support.median([x['client_us'] for x in runs_of]):.1f}",
                f"{support.median([x['server_us'] for x in runs_of]):.1f}",
                "yes" if all(x["ok"] for x in runs_of) else "NO",
            ]
        )
    lines = [
        f"1. Drain throughput of ONE drainer (one connection, items already due, trivial "
        f"handler in-process): {args.rounds} interleaved round(s), order rotated, FLUSHALL + "
        "pipelined seeding before each run (not timed); items/s is the median of rounds",
        "",
        support.table(
            [
                "contender",
                "items",
                "items/s",
                "rounds min-max",
                "us/item",
                "vs naive*",
                "round trips/item",
                "server cmds/item",
                "client CPU us/item",
                "server CPU us/item",
                "exactly once, queue empty",
            ],
            rows,
        ),
        "",
        "* median over rounds of (this contender's items/s / the naive loop's in the same "
        "round). Round trips: replies read by the drainer's connection; server commands: "
        "INFO commandstats calls (commands run inside Lua count too; a variadic command counts "
        "once); CPU: process_time() and "
        "the server's INFO cpu.",
    ]
    problems = [
        f"  {label}, round {i + 1}: {x['problem']}"
        for label in labels
        for i, x in enumerate(results[label])
        if not x["ok"]
    ]
    if problems:
        lines += ["", "Check FAILED:", *problems]
    lines += ["", *parts]
    rate = support.median([x["rate"] for x in results[default_label]])
    summary = {
        "rate": rate,
        "label": default_label,
        "vs_naive": same_round(default_label, naive_label),
        "claim_ack_vs_raw": same_round(CLAIM_ACK, RAW_CLAIM_ACK),
        "ok": not problems,
    }
    return lines, summary


# -- part 2: lateness ------------------------------------------------------------------


class Child:
    """A subprocess logging to a file; ``start()`` waits for a marker line in the log."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], marker: str) -> None:
        self.name, self.command, self.env, self.marker = name, command, env, marker
        self.dir = tempfile.mkdtemp(prefix=f"sl-bench-dq-{name}-")
        self.log = Path(self.dir) / "log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> Child:
        command = [part.replace("{dir}", self.dir) for part in self.command]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while self.marker not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def child_env(server, db_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE=CHILD_SETTINGS,
        REDIS_URL=server.url,
        CELERY_BROKER_URL=server.url,
        DATABASE_URL=db_url,
        DELAY_QUEUE_INTERVAL="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


def children(server, db_url: str) -> dict[str, Child]:
    env = child_env(server, db_url)
    celery = [sys.executable, "-m", "celery", "-A", "demo_shop"]
    return {
        "worker": Child(
            "worker",
            celery
            + [
                "worker",
                "--pool=solo",
                "--loglevel=INFO",
                "--hostname=bench-dq@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            env,
            "ready.",
        ),  # fmt: skip
        "beat": Child(
            "beat",
            celery + ["beat", "--loglevel=INFO", "--schedule={dir}/beat-schedule"],
            env,
            "beat: Starting...",
        ),
        "runner": Child(
            "runner",
            [sys.executable, "manage.py", "run_delay_queue", "--queue", RUNNER_QUEUE],
            env,
            "draining delay queue",
        ),
    }


def lateness_workload(client, queue, n: int, spread: float, key: str, rng: random.Random) -> dict:
    """Schedule ``n`` items of ``bench.record`` over the first half of ``spread`` seconds,
    each due a random 0.05..spread/2 s later (so due times cover ~spread seconds and a new
    item is often due before those already waiting); wait until each is recorded; return
    lateness in ms and the exactly-once check."""
    from .dq_handlers import RECORD_TASK

    half = spread / 2
    at = sorted(rng.uniform(0, half) for _ in range(n))
    delays = [rng.uniform(0.05, half) for _ in range(n)]
    client.delete(key)
    start = time.monotonic()
    for i, (t, delay) in enumerate(zip(at, delays, strict=True)):
        pause = start + t - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        seconds, micros = client.time()
        due_ms = seconds * 1000 + micros // 1000 + int(delay * 1000)
        eta = datetime.fromtimestamp(due_ms / 1000, UTC)
        queue.schedule(RECORD_TASK, {"n": i, "due": due_ms, "key": key}, eta=eta, id=f"{key}:{i}")
    deadline = time.monotonic() + half + 30
    while client.llen(key) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a late duplicate would show up now
    while queue.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    records = [line.decode().split() for line in client.lrange(key, 0, -1)]
    late = [float(handled) - int(due) for _, due, handled in records]
    numbers = Counter(int(number) for number, _, _ in records)
    stats = queue.stats()
    ok = (
        len(numbers) == n
        and all(count == 1 for count in numbers.values())
        and not stats["scheduled"]
        and not stats["in_flight"]
        and not stats["dead"]
    )
    problem = (
        ""
        if ok
        else f"recorded {len(records)} ({len(numbers)} distinct) of {n}; queue left: "
        f"{stats['scheduled']} scheduled, {stats['in_flight']} in flight, {stats['dead']} dead"
    )
    return {"late": late, "ok": ok, "problem": problem}


def lateness_part(server, args, db_url: str) -> tuple[list[str], dict]:
    from django.conf import settings

    from stock_locks.delayqueue import DelayQueue

    # The Redis database the drainers use: stock_locks' cache alias (db 1 of the server).
    client = redis.Redis.from_url(settings.CACHES["stock_locks"]["LOCATION"])
    queues = {"beat": DelayQueue(BEAT_QUEUE, redis=client),
              "runner": DelayQueue(RUNNER_QUEUE, redis=client)}  # fmt: skip
    labels = {
        "beat": "Celery beat + worker (drain_delay_queue every 1 s)",
        "runner": "manage.py run_delay_queue",
    }
    client.flushall()
    procs = children(server, db_url)
    results: dict[str, list[dict]] = {"beat": [], "runner": []}
    try:
        for name, proc in procs.items():
            support.progress(f"lateness: starting {name}")
            proc.start()
        time.sleep(1.5)  # let beat's first tick and the runner's first wait pass
        rng = random.Random(20240611)
        order = ["beat", "runner"]
        for r in range(args.lateness_rounds):
            for who in order[r % 2 :] + order[: r % 2]:
                support.progress(
                    f"lateness: round {r + 1}/{args.lateness_rounds}, {who}: "
                    f"{args.lateness_items} items over ~{args.spread:g} s"
                )
                for name, proc in procs.items():
                    if not proc.alive():
                        raise RuntimeError(f"{name} died:\n{proc.output()[-3000:]}")
                results[who].append(
                    lateness_workload(
                        client, queues[who], args.lateness_items, args.spread,
                        f"bench:dq:record:{who}:{r}", rng,
                    )
                )  # fmt: skip
    finally:
        for proc in procs.values():
            proc.cleanup()
        client.flushall()
        client.close()

    rows = []
    pooled = {}
    for who in ("beat", "runner"):
        late = [x for run in results[who] for x in run["late"]]
        pooled[who] = late
        support.FIGURES.setdefault("delay queue lateness (ms)", {})[who] = late
        per_round = ", ".join(
            f"{support.percentile(run['late'], 50):.0f}/{support.percentile(run['late'], 99):.0f}"
            for run in results[who]
        )
        rows.append(
            [
                labels[who],
                f"{len(late)}",
                f"{min(late):.1f}" if late else "-",
                f"{support.percentile(late, 50):.1f}",
                f"{support.percentile(late, 90):.1f}",
                f"{support.percentile(late, 99):.1f}",
                f"{max(late):.1f}" if late else "-",
                per_round,
                "yes" if all(run["ok"] for run in results[who]) else "NO",
            ]
        )
    lines = [
        f"2. Lateness (handled - due, ms): {args.lateness_rounds} workload(s) per runner, "
        f"alternated; each schedules {args.lateness_items} items over ~{args.spread / 2:g} s, "
        f"each due 0.05-{args.spread / 2:g} s later (due times cover ~{args.spread:g} s), "
        "with DelayQueue.schedule(eta=...) from this process",
        "",
        support.table(
            [
                "runner",
                "items",
                "min",
                "p50",
                "p90",
                "p99",
                "max",
                "per workload p50/p99",
                "exactly once, queue empty",
            ],
            rows,
        ),
        "",
        "Clocks: due = Redis TIME at scheduling + the delay (the queue's own clock); handled = "
        "time.time() in the handler as it starts, in the drainer process. Redis and every "
        "process run on this one machine, so both read the same system clock.",
    ]
    problems = [
        f"  {labels[who]}, workload {i + 1}: {run['problem']}"
        for who in results
        for i, run in enumerate(results[who])
        if not run["ok"]
    ]
    if problems:
        lines += ["", "Check FAILED:", *problems]
    summary = {
        who: {
            "p50": support.percentile(pooled[who], 50),
            "p99": support.percentile(pooled[who], 99),
        }
        for who in pooled
    }
    summary["ok"] = not problems
    return lines, summary


# -- report --------------------------------------------------------------------------------


def header(client, db_url: str | None) -> list[str]:
    redis_py, celery, django = map(support.dist_version, ("redis", "celery", "Django"))
    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "Python"
    lines = [
        f"Delay queue benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"redis-server {support.redis_version(client)} (private, 127.0.0.1); "
        f"Python {platform.python_version()} on {platform.machine()}; {os.cpu_count()} CPUs",
        f"redis-py {redis_py} ({parser} parser), Celery {celery}, Django {django}",
    ]
    if db_url:
        lines.append(f"Database of the subprocesses: {db_url}")
    return lines


def targets(drain: dict | None, late: dict | None) -> list[str]:
    lines = ["Targets:"]
    if drain:
        rate = drain["rate"]
        lines.append(
            f"  >= {TARGET_RATE:,} items/s drained by one drainer: {drain['label']} "
            f"{rate:,.0f} items/s ({drain['vs_naive']:.0f}x the naive loop): "
            f"{support.verdict(rate >= TARGET_RATE and drain['ok'])}"
        )
        ratio = drain["claim_ack_vs_raw"]
        lines.append(
            f"  claim()+ack() / raw EVALSHA claim+ack items/s (median of same-round ratios) = "
            f"{ratio:.2f}x >= {TARGET_CLAIM_ACK}x: {support.verdict(ratio >= TARGET_CLAIM_ACK)}"
        )
    if late:
        p99 = late["runner"]["p99"]
        lines.append(
            f"  run_delay_queue lateness p99 < {TARGET_P99_MS:g} ms: {p99:.1f} ms: "
            f"{support.verdict(p99 < TARGET_P99_MS and late['ok'])}  (beside it, Celery beat "
            f"at 1 s: p50 {late['beat']['p50']:.0f} ms, p99 {late['beat']['p99']:.0f} ms; "
            f"p50 ratio beat/run_delay_queue "
            f"{late['beat']['p50'] / max(late['runner']['p50'], 0.001):.0f}x)"
        )
    return lines


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    load_before = support.load_average()
    db_url = args.database_url if "lateness" in args.parts else None
    created = support.ensure_database(db_url) if db_url else False
    with support.private_redis() as server:
        support.setup_django(server.url, db_url)
        if db_url:
            from django.core.management import call_command
            from django.db import connections

            support.progress(f"migrating {db_url}" + (" (created)" if created else ""))
            call_command("migrate", verbosity=0, interactive=False)
            connections.close_all()
        probe = server.client()
        lines = header(probe, db_url)
        probe.close()
        if args.quick:
            lines.append("(--quick smoke run: small numbers, short; rough)")
        drain_summary = late_summary = None
        if "drain" in args.parts:
            part, drain_summary = drain_part(server, args)
            lines += [""] + part
        if "lateness" in args.parts:
            part, late_summary = lateness_part(server, args, db_url)
            lines += [""] + part
        lines += [""] + targets(drain_summary, late_summary)
        lines += ["", support.load_line(load_before)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
