"""Redis with Sentinel failing over mid flash sale: what is lost, what is refused, how
long until buyers are served again and until Redis agrees with the database again.

One deployment (``tests.support.sentinel_failover.FailoverDeployment``): a primary,
one replica and three sentinels (down-after 1 s, failover-timeout 2 s) on free
127.0.0.1 ports, every path (sentinels, replication, clients) through a fault
proxy. The shop's default backend is ``redis+sentinel://`` (``SOCKET_TIMEOUT`` 2 s,
``SOCKET_CONNECT_TIMEOUT`` 1 s), so locks and ``get_redis()`` (the stock
strategies, the delay queue, the sweeper) follow the failover. Four buyers are OS
processes (three sync, one asyncio with three shoppers) that reserve one unit of
one of 16 SKUs at a time with ``lua``, ``watch`` and ``lock`` in turn, then pay,
release or walk away (a 1 s reservation TTL). This process plays the shop's
Celery beat and workers (threads: ``stock_locks.tasks.drain_delay_queue`` every 0.5 s
and ``stock_locks.stock.sweeper.sweep`` every ``SWEEP_INTERVAL`` = 1 s, side by side;
``SWEEP_GRACE`` 1 s, ``ORPHAN_GRACE`` 5 s) and the lock holders. PostgreSQL is the
record: ``--database-url``, else ``DATABASE_URL``, else ``stock_locks_bench`` on
127.0.0.1 (created and migrated when missing; only this benchmark's rows are reset
or deleted).

Per cell (scenario x setting), ``--runs`` runs, interleaved (each round visits every
cell, the order rotated). Settings: WAIT off/on (the backend's ``OPTIONS["REPLICAS"]``
0/1, ``REPLICA_TIMEOUT`` 0.5 s) x the servers' ``min-replicas-to-write`` 0/1
(``min-replicas-max-lag`` ``--max-lag``, 2 s). Scenarios:

kill       The sale runs ``--warm`` s; then the replica stops hearing the primary
           (its replication stream held for ``--hold`` s) while the sale goes on and
           the lock holder takes a lock at 20%, 50% and 90% of the hold; then the
           primary is SIGKILLed. Right after the promotion a supervisor restarts it,
           empty, as a replica of the promoted one (as Helm charts start a pod).
partition  The sale runs ``--warm`` s with buyers 0 and 1 (sync) on the primary's side
           (clients that reach the sentinels through proxies the partition stalls).
           The primary is cut off from the sentinels and the replica, not from those
           buyers (Jepsen's 2013 Redis test). At the promotion buyers 2 and 3 (sync,
           asyncio) start on the other side, and the lock holder takes 3 locks on the
           old primary; ``--split-brain`` s later the partition heals; the sentinels
           demote the old primary about 10 s after that.

Columns (every count per run; then the median):

- Redis decrements lost: units the old primary took (a counter decremented by a
  reserve) that the promoted replica does not have. Counted on the servers, past
  the proxies: writes are paused (``CLIENT PAUSE WRITE``, a few ms) while the replica
  catches up and the fault starts, so the replica's counters and move versions at
  that moment are exactly what the new primary starts from; the old primary's are
  read under the same pause just before the SIGKILL, or (partition) every 10 ms until
  it is demoted, the last read before its data is replaced. Each counter move is 1
  unit and bumps its SKU's version once, so per SKU
  ``decrements = (moves + net) / 2`` with ``moves`` = versions the old primary got
  ahead, ``net`` = units the replica has more. (Give-backs lost are the other half.)
- oversold: from the database after the sweeper settled the run: units held
  (committed + open) plus units in stock beyond the initial stock. Must be 0.
- stale writes passed: the lock holder's grants the old primary acknowledged; after
  the promotion a second holder asks the promoted replica for the same names (until
  granted or the run ends). Where granted (a grant lost), the second holder writes
  its fenced row (``fenced_update_row``), then the first holder writes with its own
  (older) fence: writes the database accepted from the first holder. Must be 0.
- grants lost: acknowledged first grants that the promoted replica granted again.
- served again: from the SIGKILL / the partition to the end of the first successful
  reserve served by the promoted replica (kill: any reserve started after the kill;
  partition: the buyers of the majority side).
- drift 0: from the fault to the start of the final stretch (at least 1 s, samples
  every 0.25 s from the promotion on) in which every SKU's counter on the primary the
  sentinels name equals the database, work in flight netted out, as
  ``stock_locks.stock.reconcile.measure`` (what the sweeper corrects by) reads it,
  while the sale and the beat go on. A SKU whose counter moved while it was measured
  keeps the state of its last settled measure.
- errors by type: exceptions the buyers' calls (reserve, pay, release) and the lock
  holders' calls raised: RedisUnavailable, LockNotReplicated, StaleFencingToken and
  other (OutOfStock is an answer, not counted).

The run ends when the buyers were served again, the old primary is out of the way,
the second holders are done and drift was 0 for a second (or after 20 s / 30 s);
then the buyers stop, the sweeper runs until nothing is open and drift is 0 (quiet),
and the database is audited. The numbers and medians are printed side by side;
oversold and stale writes passed are checked (PASS/FAIL), with units lost, no call
past the hang bound and no unexpected exception.

A kill run takes about 13-21 s, a partition run 20-30 s (Sentinel waits about 8 s
before it demotes a primary that comes back): the default 3 runs of 8 cells take
about 8 minutes on 2 CPUs. ``--runs 1``, ``--scenarios`` and ``--settings`` shorten it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import multiprocessing
import os
import platform
import queue
import random
import sys
import textwrap
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import redis

from tests.support.sentinel_failover import FailoverDeployment, Node

from . import stock, support

SCENARIOS = ("kill", "partition")
SETTINGS = ((0, 0), (1, 0), (0, 1), (1, 1))  # (REPLICAS, min-replicas-to-write)
STRATEGIES = ("lua", "watch", "lock")
BUYERS = ("sync", "sync", "sync", "async")
MINORITY = (0, 1)  # partition: the buyers on the old primary's side
MAJORITY = (2, 3)  # partition: the buyers of the other side (they start at the promotion)
SKUS = 16
SKU_PREFIX = "FAILOVER-"
ROW_PREFIX = "FAILOVER-ROW-"  # the fenced rows of the lock holders (stock 0)
REF_PREFIX = "failover-"  # order refs of this benchmark (only those are deleted)
LOCK_PREFIX = "failover:row:"
HOLDERS = 3  # lock names the first holder takes per run
GRANT_AT = (0.2, 0.5, 0.9)  # kill: when, as fractions of the hold, the first holder takes them
LEASE = 60  # seconds: the first holder's lease outlives the run

SOCKET_TIMEOUT = 2.0  # seconds: the backends' socket timeout
CONNECT_TIMEOUT = 1.0  # seconds: their connect timeout
LOCK_TIMEOUT = 1.0  # STOCK_LOCK_TIMEOUT: how long the lock strategy waits for a SKU's lock
GROUP_COMMIT_WAIT = 1.0
REPLICA_TIMEOUT = 0.5  # seconds a grant waits for WAIT (below the socket timeout: W009)
# The longest a call may take without hanging: a try, one repeat and one give-back (each a
# connect and a reply), the lock strategy's wait and the group commit's wait.
HANG_BOUND = 3 * (CONNECT_TIMEOUT + SOCKET_TIMEOUT) + LOCK_TIMEOUT + GROUP_COMMIT_WAIT
TIMEOUTS = {"SOCKET_TIMEOUT": SOCKET_TIMEOUT, "SOCKET_CONNECT_TIMEOUT": CONNECT_TIMEOUT}
DRAIN_INTERVAL = 0.5  # seconds: the beat's delay-queue drain
SHOP = {
    "STOCK_LOCK_TTL": 2,  # a stock lock whose holder died frees soon after the failover
    "STOCK_LOCK_TIMEOUT": LOCK_TIMEOUT,
    "GROUP_COMMIT_WAIT": GROUP_COMMIT_WAIT,
    "REPLICA_TIMEOUT": REPLICA_TIMEOUT,
    "SWEEP_INTERVAL": 1,  # (the default, 30 s, would stretch the drift column by as much)
    "SWEEP_GRACE": 1,
    "ORPHAN_GRACE": 5,
    "DELAY_QUEUE_INTERVAL": DRAIN_INTERVAL,
}
TTL = 1  # seconds an unpaid reservation holds its units
TASKS = 3  # shoppers of the asyncio buyer
RETRY_AFTER = 0.02  # seconds a refused shopper waits before it tries again
AFTER_RESERVE = ("commit", "release", "walk away")
SAMPLE = 0.25  # seconds between two drift samples
STABLE = 1.0  # seconds drift must stay 0 before the run ends
DEADLINE = {"kill": 20.0, "partition": 30.0}  # seconds after the fault, at most
WATCH_EVERY = 0.01  # seconds between two reads of the partitioned old primary
COLUMNS = ("RedisUnavailable", "LockNotReplicated", "StaleFencingToken", "other")

_ctx = multiprocessing.get_context("spawn")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = support.parser("failover", __doc__)
    parser.add_argument("--runs", type=int, help="runs per cell (3; quick 1)")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="comma-separated: kill, partition (both)",
    )
    parser.add_argument(
        "--settings",
        default="off/0,on/0,off/1,on/1",
        help="comma-separated WAIT/min-replicas cells: off/0, on/0, off/1, on/1 (all)",
    )
    parser.add_argument("--stock", type=int, default=250, help="units per SKU (250; 16 SKUs)")
    parser.add_argument(
        "--warm", type=float, default=0.5, help="seconds of sale before a fault (0.5)"
    )
    parser.add_argument(
        "--hold", type=float, help="kill: seconds the replica hears nothing before (4; quick 3)"
    )
    parser.add_argument(
        "--split-brain",
        type=float,
        default=1.0,
        help="partition: seconds from the promotion to the heal (1)",
    )
    parser.add_argument(
        "--max-lag", type=int, default=2, help="the servers' min-replicas-max-lag, seconds (2)"
    )
    parser.add_argument("--database-url", help="PostgreSQL (default: DATABASE_URL, else ours)")
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    args.hold = args.hold or (3.0 if args.quick else 4.0)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown or not args.scenarios:
        parser.error(f"--scenarios: choose among {', '.join(SCENARIOS)}")
    chosen = [c.strip() for c in args.settings.split(",") if c.strip()]
    known = {"/".join(label(*cell)): cell for cell in SETTINGS}
    if not chosen or set(chosen) - set(known):
        parser.error(f"--settings: choose among {', '.join(known)}")
    args.settings = [cell for name, cell in known.items() if name in chosen]
    if args.runs < 1 or args.stock < 1:
        parser.error("--runs and --stock must be >= 1")
    return args


def skus() -> list[str]:
    return [f"{SKU_PREFIX}{k}" for k in range(1, SKUS + 1)]


def rows() -> list[str]:
    return [f"{ROW_PREFIX}{k}" for k in range(1, HOLDERS + 1)]


def label(replicas: int, min_replicas: int) -> tuple[str, str]:
    return ("on" if replicas else "off", str(min_replicas))


# -- the buyers (spawned processes, one per entry of BUYERS, for the whole benchmark) ----


class Clerk:
    """What one buyer saw in one run: outcomes by call and name, units paid, its longest
    call, the (start, end) monotonic times of its successful reserves."""

    def __init__(self) -> None:
        self.tally: Counter[str] = Counter()
        self.paid = 0
        self.longest = 0.0
        self.slowest = ""
        self.served: list[float] = []  # start, end, start, end, ...
        self.samples: list[str] = []

    def _seen(self, what: str, started: float, exc: BaseException | None) -> bool:
        ended = time.monotonic()
        if ended - started > self.longest:
            self.longest, self.slowest = ended - started, what
        if exc is None:
            self.tally[f"{what} ok"] += 1
            if what == "reserve":
                self.served += [started, ended]
            return True
        name = outcome_name(exc)
        self.tally[f"{what} {name}"] += 1
        if name.startswith("unexpected") and len(self.samples) < 3:
            self.samples.append(f"{what}: {type(exc).__name__}: {exc}")
        return False

    def call(self, what: str, func: Callable[[], Any]) -> tuple[bool, Any]:
        started = time.monotonic()
        try:
            value = func()
        except Exception as exc:  # every outcome is counted; the report judges them
            return self._seen(what, started, exc), None
        return self._seen(what, started, None), value

    async def acall(self, what: str, pending: Any) -> tuple[bool, Any]:
        started = time.monotonic()
        try:
            value = await pending
        except Exception as exc:  # every outcome is counted; the report judges them
            return self._seen(what, started, exc), None
        return self._seen(what, started, None), value

    def report(self) -> dict[str, Any]:
        return {
            "tally": dict(self.tally),
            "paid": self.paid,
            "longest": self.longest,
            "slowest": self.slowest,
            "served": self.served,
            "samples": self.samples,
        }


def outcome_name(exc: BaseException) -> str:
    from stock_locks.exceptions import StockLocksError

    if isinstance(exc, StockLocksError):
        return type(exc).__name__
    return f"unexpected {type(exc).__name__}"


def _hold_open(client: Any, count: int) -> None:
    """Open ``count`` connections in ``client``'s pool now; they stay there, idle. (A
    process on the old primary's side of a partition cannot open one later: the
    sentinels it would ask first are out of reach.)"""
    pool = client.connection_pool
    opened = [pool.get_connection() for _ in range(count)]
    for connection in opened:
        pool.release(connection)


def _strategies() -> list[Any]:
    from stock_locks.stock import get_strategy

    return [get_strategy(name) for name in STRATEGIES]


def _warmed_up(plan: dict[str, Any]) -> list[Any]:
    """The strategies, warmed up in this process (connections, the sold-out listener,
    scripts): nothing a first timed call should pay for."""
    from stock_locks.backends.redis.client import get_redis

    chosen = _strategies()
    for strategy in chosen:
        strategy.warm_up()
        for sku in plan["skus"]:
            strategy.available(sku)
    if plan["hold_open"]:
        _hold_open(get_redis(), plan["hold_open"])
    return chosen


def _wait_go(flags: dict[str, Any], group: int) -> bool:
    """Until this buyer's group may sell (True) or the run is stopped first (False)."""
    while not flags["go"][group].wait(0.05):
        if flags["stop"].is_set():
            return False
    return not flags["stop"].is_set()


def _sync_run(index: int, plan: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """Reserve one unit at a time (the strategies in turn, a random SKU), then pay,
    release or walk away, from the go of this buyer's group until the stop."""
    clerk = Clerk()
    chosen = _warmed_up(plan) if plan["warm"] else None
    flags["ready"][index].set()
    if not _wait_go(flags, plan["group"]):
        return clerk.report()
    if chosen is None:  # (the majority's buyers meet Redis only now: their first call finds it)
        chosen = _strategies()
    stop, last_ok = flags["stop"], flags["last_ok"][index]
    rng = random.Random(f"{plan['prefix']}{index}")
    for n in itertools.count():
        if stop.is_set():
            break
        strategy = chosen[(index + n) % len(chosen)]
        ref = f"{plan['prefix']}b{index}-{n}"
        cart = {rng.choice(plan["skus"]): 1}
        ok, _ = clerk.call("reserve", partial(strategy.reserve, ref, cart, ttl=TTL))
        if not ok:
            time.sleep(RETRY_AFTER)
            continue
        last_ok.value = time.monotonic()
        step = AFTER_RESERVE[n % len(AFTER_RESERVE)]
        if step == "commit":
            _, paid = clerk.call("commit", partial(strategy.commit, ref))
            clerk.paid += bool(paid)
        elif step == "release":
            clerk.call("release", partial(strategy.release, ref))
    return clerk.report()


def _async_run(index: int, plan: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(_async_sale(index, plan, flags))


async def _async_sale(index: int, plan: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """:func:`_sync_run` as ``TASKS`` shoppers on one event loop, reserving with
    ``areserve`` (the ``lua`` strategy's Redis half on the loop)."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    clerk = Clerk()
    chosen = await sync_to_async(_warmed_up)(plan) if plan["warm"] else None
    flags["ready"][index].set()
    if not await asyncio.to_thread(_wait_go, flags, plan["group"]):
        return clerk.report()
    if chosen is None:
        chosen = await sync_to_async(_strategies)()
    stop, last_ok = flags["stop"], flags["last_ok"][index]

    async def shopper(task: int) -> None:
        rng = random.Random(f"{plan['prefix']}{index}.{task}")
        for n in itertools.count():
            if stop.is_set():
                return
            strategy = chosen[(index + task + n) % len(chosen)]
            ref = f"{plan['prefix']}b{index}.{task}-{n}"
            cart = {rng.choice(plan["skus"]): 1}
            ok, _ = await clerk.acall("reserve", strategy.areserve(ref, cart, ttl=TTL))
            if not ok:
                await asyncio.sleep(RETRY_AFTER)
                continue
            last_ok.value = time.monotonic()
            step = AFTER_RESERVE[n % len(AFTER_RESERVE)]
            if step == "commit":
                _, paid = await clerk.acall("commit", sync_to_async(strategy.commit)(ref))
                clerk.paid += bool(paid)
            elif step == "release":
                await clerk.acall("release", sync_to_async(strategy.release)(ref))

    try:
        await asyncio.gather(*(shopper(task) for task in range(TASKS)))
    finally:
        await sync_to_async(connections.close_all)()
    return clerk.report()


def _buyer_process(index, mode, env, commands, results, flags) -> None:  # spawned
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connections
    from django.test import override_settings

    from stock_locks.stock import soldout

    logging.getLogger("stock_locks").setLevel(logging.WARNING)  # (one line per expiry: noise)
    results.put((index, "started", None))
    run = _async_run if mode == "async" else _sync_run
    while (plan := commands.get()) is not None:
        override = override_settings(STOCK_LOCKS=plan["shop"])
        override.enable()
        try:
            results.put((index, "report", run(index, plan, flags)))
        except BaseException:
            results.put((index, "error", traceback.format_exc()))
        finally:
            with suppress(Exception):
                override.disable()  # (drops the run's backends and their clients)
            soldout.reset()
            connections.close_all()


class Buyers:
    """The buyer processes and what they share: ``go`` (one Event per group), ``stop``,
    ``ready`` (one per buyer), ``last_ok`` (per buyer: when its last reserve succeeded,
    monotonic seconds)."""

    def __init__(self, modes: tuple[str, ...]) -> None:
        n = len(modes)
        self.flags = {
            "go": [_ctx.Event(), _ctx.Event()],
            "stop": _ctx.Event(),
            "ready": [_ctx.Event() for _ in range(n)],
            "last_ok": [_ctx.Value("d", 0.0, lock=False) for _ in range(n)],
        }
        self.results = _ctx.Queue()
        self.commands = [_ctx.Queue() for _ in range(n)]
        env = {k: os.environ[k] for k in support.ENV_PASSED if k in os.environ}
        self.procs = [
            _ctx.Process(
                target=_buyer_process,
                args=(i, mode, env, self.commands[i], self.results, self.flags),
                daemon=True,
            )
            for i, mode in enumerate(modes)
        ]
        for proc in self.procs:
            proc.start()
        started = set()
        while len(started) < n:
            index, kind, payload = self._next(support.SYNC_TIMEOUT)
            if kind != "started":
                raise RuntimeError(f"buyer {index}: {kind}: {payload}")
            started.add(index)

    def _next(self, timeout: float) -> tuple[int, str, Any]:
        """The next message of a buyer; RuntimeError when one died or none came in time."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.results.get(timeout=0.5)
            except queue.Empty:
                dead = [i for i, p in enumerate(self.procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"no word from the buyers in {timeout:g} s (dead: {dead})"
                    ) from None

    def start_run(self, plans: dict[int, dict[str, Any]]) -> None:
        """Hand each buyer of ``plans`` its plan; return once each is ready to sell."""
        flags = self.flags
        flags["stop"].clear()
        for event in [*flags["go"], *flags["ready"]]:
            event.clear()
        for value in flags["last_ok"]:
            value.value = 0.0
        for index, plan in plans.items():
            self.commands[index].put(plan)
        deadline = time.monotonic() + support.SYNC_TIMEOUT
        while not all(flags["ready"][i].is_set() for i in plans):
            with suppress(queue.Empty):
                index, kind, payload = self.results.get(timeout=0.02)
                raise RuntimeError(f"buyer {index} ended before the sale: {kind}: {payload}")
            if time.monotonic() > deadline:
                raise RuntimeError("the buyers did not get ready")

    def go(self, group: int) -> None:
        self.flags["go"][group].set()

    def served_after(self, indexes: tuple[int, ...] | range, moment: float) -> bool:
        return any(self.flags["last_ok"][i].value > moment for i in indexes)

    def stop_run(self, indexes: list[int]) -> dict[int, dict[str, Any]]:
        """Stop the sale; each buyer's report (RuntimeError with the tracebacks of those
        that failed)."""
        self.flags["stop"].set()
        reports: dict[int, dict[str, Any]] = {}
        failures: list[str] = []
        while len(reports) + len(failures) < len(indexes):
            index, kind, payload = self._next(HANG_BOUND * 3)
            if kind == "report":
                reports[index] = payload
            else:
                failures.append(f"buyer {index}: {payload}")
        if failures:
            raise RuntimeError("\n".join(failures))
        return reports

    def close(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


# -- this process: the beat, the observers, the lock holders ----------------------------


class Beat:
    """The shop's Celery beat and two workers, as threads: the delay-queue drain every
    ``DRAIN_INTERVAL`` and the stock sweeper every ``SWEEP_INTERVAL`` seconds, each in
    a thread of its own (a long drain does not delay a sweep, as on two workers).
    :meth:`pause` waits for the runs in progress."""

    def __init__(self) -> None:
        from django.conf import settings

        from stock_locks.stock.sweeper import sweep
        from stock_locks.tasks import drain_delay_queue

        self._stopped = threading.Event()
        self._busy = (threading.Lock(), threading.Lock())  # (one per thread: held by a run)
        self.paused = False
        self.failures: Counter[str] = Counter()
        self.sweeps: list[dict[str, Any]] = []
        every = settings.STOCK_LOCKS["SWEEP_INTERVAL"]
        self.threads = [
            threading.Thread(target=self._loop, args=(drain_delay_queue, DRAIN_INTERVAL, 0)),
            threading.Thread(target=self._loop, args=(sweep, every, 1)),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.daemon = True
            thread.start()

    def _loop(self, work: Callable[[], Any], every: float, which: int) -> None:
        from django.db import connections

        try:
            while True:
                began = time.monotonic()
                with self._busy[which]:
                    if not self.paused:
                        self._run(work, sweeper=which == 1)
                if self._stopped.wait(max(0.01, every - (time.monotonic() - began))):
                    return
        finally:
            connections.close_all()

    def _run(self, work: Callable[[], Any], sweeper: bool) -> None:
        try:
            done = work()
        except Exception as exc:  # counted; the next run tries again
            self.failures[type(exc).__name__] += 1
            return
        if sweeper:
            self.sweeps.append(done.as_dict())

    def pause(self) -> None:
        """No run from now on until :meth:`resume` (returns once the runs in progress
        are over)."""
        self.paused = True
        for busy in self._busy:
            with busy:
                pass

    def resume(self) -> None:
        self.paused = False

    def stop(self) -> None:
        self._stopped.set()
        for thread in self.threads:
            if thread.is_alive():
                thread.join(timeout=HANG_BOUND * 3)


def stock_on(node: Node) -> tuple[dict[str, int], dict[str, int]]:
    """The counters and move versions of the benchmark's SKUs on ``node``'s server
    (straight to it), read in one transaction."""
    from stock_locks.keys import StockKeys

    keys, names = StockKeys(), skus()
    client = node.client(decode_responses=True)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.mget([keys.counter(sku) for sku in names])
        pipe.hmget(keys.versions, names)
        counters, versions = pipe.execute()
    finally:
        client.close()
    return (
        {sku: int(v or 0) for sku, v in zip(names, counters, strict=True)},
        {sku: int(v or 0) for sku, v in zip(names, versions, strict=True)},
    )


class Watcher(threading.Thread):
    """Reads the partitioned old primary's counters every ``WATCH_EVERY`` seconds until it
    is demoted. ``final``: its values when it stopped taking writes; ``exact``: read
    after the demotion (writes refused: READONLY) while its data was still its own
    (``marker``, a key only it has, still there), else the last read before."""

    def __init__(self, node: Node, marker: str) -> None:
        super().__init__(name="failover-watcher", daemon=True)
        self.node, self.marker = node, marker
        self.final: tuple[dict[str, int], dict[str, int]] | None = None
        self.exact = False
        self.demoted_at: float | None = None
        self._stopped = threading.Event()

    def run(self) -> None:
        from stock_locks.keys import StockKeys

        keys, names = StockKeys(), skus()
        client = self.node.client(decode_responses=True, socket_timeout=1)
        last = None
        try:
            while not self._stopped.wait(WATCH_EVERY):
                try:
                    pipe = client.pipeline(transaction=True)
                    pipe.execute_command("ROLE")
                    pipe.exists(self.marker)
                    pipe.mget([keys.counter(sku) for sku in names])
                    pipe.hmget(keys.versions, names)
                    role, marked, counters, versions = pipe.execute()
                except (redis.RedisError, OSError):
                    continue
                values = (
                    {sku: int(v or 0) for sku, v in zip(names, counters, strict=True)},
                    {sku: int(v or 0) for sku, v in zip(names, versions, strict=True)},
                )
                if role[0] == "master":
                    last = values
                    continue
                self.demoted_at = time.monotonic()
                self.exact = bool(marked)
                self.final = values if marked else last
                return
        finally:
            client.close()
            if self.final is None:
                self.final = last

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=5)


@dataclass
class Grant:
    """One lock name: the first holder's grant on the old primary, then the second's."""

    name: str
    row: int
    first: Any = None  # the Lock object, once the old primary acknowledged it
    first_error: str = ""
    second: Any = None
    kept: bool = False  # the promoted replica still had the first grant: no second holder
    write: str = ""  # the first holder's fenced write after the second's: refused / PASSED


class Holders:
    """The lock holders of one run: the first takes ``HOLDERS`` names from the old
    primary (alias ``first_alias``), the second asks the promoted replica for those the
    first was granted (default backend), each tick until granted or the run ends."""

    def __init__(self, run: int, first_alias: str | None) -> None:
        from stock_locks.stock.table import StockTable

        table = StockTable()
        pks = dict(
            table.objects.filter(**{f"{table.sku}__in": rows()}).values_list(table.sku, "pk")
        )
        self.alias = first_alias
        self.grants = [
            Grant(f"{LOCK_PREFIX}{run}:{k}", pks[row]) for k, row in enumerate(rows(), start=1)
        ]
        self.errors: Counter[str] = Counter()  # the first holder's, and its write's
        self.waits: Counter[str] = Counter()  # the second holder's refusals while it asks
        self.threads: list[threading.Thread] = []

    def take_first(self, grant: Grant) -> None:
        from stock_locks import Lock

        lock = Lock(grant.name, ttl=LEASE, backend=self.alias)
        try:
            if lock.acquire(timeout=0):
                grant.first = lock
            else:
                grant.first_error = "not granted"
        except Exception as exc:  # counted: what the first holder was answered
            grant.first_error = outcome_name(exc)
            self.errors[grant.first_error] += 1

    def take_all_first(self) -> None:
        """:meth:`take_first` for every name at once, each in a thread of its own, so that
        the run goes on meanwhile: on the old primary's side of a partition a refused
        grant may take seconds (its give-back asks the sentinels first)."""
        self.threads = [
            threading.Thread(target=self.take_first, args=(grant,), daemon=True)
            for grant in self.grants
        ]
        for thread in self.threads:
            thread.start()

    def first_done(self) -> bool:
        return not any(thread.is_alive() for thread in self.threads)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=HANG_BOUND)

    def pending(self) -> list[Grant]:
        return [g for g in self.grants if g.first and g.second is None and not g.kept]

    def try_second(self) -> None:
        """The second holder asks for every name still pending; where granted, it writes
        its fenced row, then the first holder writes with its older fence."""
        from stock_locks import Lock
        from stock_locks.fencing import fenced_update_row
        from stock_locks.stock.table import StockTable

        model = StockTable().model
        for grant in self.pending():
            lock = Lock(grant.name, ttl=LEASE)
            try:
                granted = lock.acquire(timeout=0)
            except Exception as exc:  # counted apart; asked again at the next tick
                self.waits[outcome_name(exc)] += 1
                continue
            if not granted:
                grant.kept = True
                continue
            grant.second = lock
            fenced_update_row(model, grant.row, lock.fence, name="second holder")
            try:
                fenced_update_row(model, grant.row, grant.first.fence, name="first holder")
                grant.write = "PASSED"
            except Exception as exc:  # StaleFencingToken: the database refused the write
                grant.write = "refused"
                self.errors[outcome_name(exc)] += 1

    def release(self) -> None:
        for grant in self.grants:
            if grant.second is not None:
                with suppress(Exception):
                    grant.second.release()

    @property
    def acked(self) -> int:
        return sum(1 for g in self.grants if g.first)

    @property
    def lost(self) -> int:
        return sum(1 for g in self.grants if g.second is not None)

    @property
    def passed(self) -> int:
        return sum(1 for g in self.grants if g.write == "PASSED")


def drift_states() -> dict[str, bool | None]:
    """One sample of ``stock_locks.stock.reconcile.measure``: per SKU, True when its
    counter is loaded and equals the database (work in flight netted out), False when
    it drifts, None when unknown (its counter moved while measured, or Redis or the
    sentinels were out of reach)."""
    from stock_locks.stock.reconcile import measure

    try:
        report = measure(skus())
    except Exception:  # Redis or the sentinels out of reach: no sample
        return dict.fromkeys(skus())
    return {
        row.sku: None if not row.settled else (row.redis is not None and row.drift == 0)
        for row in report
    }


class DriftTrack:
    """Since when every SKU's drift is 0: a SKU's state changes only with a settled
    measure (one whose counter moved while it was measured tells nothing)."""

    def __init__(self) -> None:
        self.zero_since: dict[str, float | None] = dict.fromkeys(skus())

    def add(self, moment: float, states: dict[str, bool | None]) -> None:
        for sku, zero in states.items():
            if zero is None:
                continue
            if not zero:
                self.zero_since[sku] = None
            elif self.zero_since[sku] is None:
                self.zero_since[sku] = moment

    def since(self) -> float | None:
        """When the last SKU's drift became 0 (None: one still drifts or is unknown)."""
        values = list(self.zero_since.values())
        return None if any(v is None for v in values) else max(values)


# -- one run ---------------------------------------------------------------------------------


@dataclass
class RunResult:
    scenario: str
    replicas: int
    min_replicas: int
    round: int
    seconds: float = 0.0
    lag_bytes: int | None = None
    decrements: int | None = None  # Redis decrements lost
    give_backs: int | None = None  # Redis give-backs lost
    moves_exact: bool = True
    acked: int = 0
    grants_lost: int = 0
    stale_passed: int = 0
    stale_refused: int = 0
    promoted: float | None = None  # seconds from the fault
    served: float | None = None
    drift_zero: float | None = None
    demoted: float | None = None
    errors: Counter = field(default_factory=Counter)
    reserves_ok: int = 0
    sold: int = 0
    paid_told: int = 0
    oversold: int = 0
    lost: int = 0
    quiet: bool = True
    longest: float = 0.0
    slowest: str = ""
    unexpected: list[str] = field(default_factory=list)
    beat_failures: Counter = field(default_factory=Counter)
    corrected: int = 0  # units the sweeper added to counters (negative: took away)
    repaired: int = 0  # records the sweeper settled or adopted, reservations it expired
    failure: str = ""  # the sweeper did not settle the run
    error: str = ""  # the run did not complete (an exception): not in the medians

    @property
    def cell(self) -> tuple[str, int, int]:
        return (self.scenario, self.replicas, self.min_replicas)


def moves_lost(
    replica: tuple[dict[str, int], dict[str, int]], old: tuple[dict[str, int], dict[str, int]]
) -> tuple[int, int, bool]:
    """(decrements, give-backs, exact) the old primary made that the replica never got,
    from each SKU's counter and version (every move 1 unit, 1 version)."""
    decrements = give_backs = 0
    exact = True
    for sku in skus():
        moves = old[1][sku] - replica[1][sku]
        net = replica[0][sku] - old[0][sku]
        if (moves + net) % 2 or abs(net) > moves:
            exact = False
        decrements += max(0, (moves + net) // 2)
        give_backs += max(0, (moves - net) // 2)
    return decrements, give_backs, exact


class Bench:
    def __init__(self, args: argparse.Namespace, base: dict[str, Any]) -> None:
        self.args = args
        self.base = base  # the project's STOCK_LOCKS, without our overrides
        self.deployment = FailoverDeployment().start()
        try:
            self.buyers = Buyers(BUYERS)
        except BaseException:
            self.deployment.stop()
            raise
        self.run_number = 0

    def close(self) -> None:
        self.buyers.close()
        self.deployment.stop()

    def replace_deployment(self) -> None:
        """A fresh deployment (after a run that left this one in an unknown state)."""
        self.deployment.stop()
        self.deployment = FailoverDeployment().start()

    # -- settings ---------------------------------------------------------------------

    def shop(self, replicas: int, *, far: bool = False, **backends: dict) -> dict[str, Any]:
        return self.deployment.stock_locks_settings(
            self.base, "location", far=far, extra=SHOP, backends=backends,
            REPLICAS=replicas, **TIMEOUTS,
        )  # fmt: skip

    def plan(self, shop: dict, group: int, warm: bool, hold_open: int = 0) -> dict[str, Any]:
        return {
            "shop": shop,
            "group": group,
            "warm": warm,
            "hold_open": hold_open,
            "skus": skus(),
            "prefix": f"{REF_PREFIX}r{self.run_number}-",
        }

    # -- steps ------------------------------------------------------------------------

    def healthy(self) -> tuple[Node, Node]:
        """The primary and its replica, once the replica is in sync and every sentinel
        knows both (after the previous run's failover)."""
        d = self.deployment
        primary = d.primary()
        replica = d.other(primary)
        d.wait_rejoined(replica)
        return primary, replica

    def prepare(self, primary: Node, min_replicas: int) -> None:
        """Both servers configured, Redis emptied, the database's rows of this benchmark
        reset, the counters loaded (under this process's settings, already enabled)."""
        from stock_locks.models import Reservation
        from stock_locks.stock.reconcile import sync_counters
        from stock_locks.stock.table import StockTable

        d = self.deployment
        for node in d.nodes:
            d.config_set(node, "min-replicas-to-write", min_replicas)
            d.config_set(node, "min-replicas-max-lag", self.args.max_lag)
        primary.ask("FLUSHALL")
        Reservation.objects.filter(order_ref__startswith=REF_PREFIX).delete()
        table = StockTable()
        for sku, qty in [*((s, self.args.stock) for s in skus()), *((r, 0) for r in rows())]:
            table.objects.update_or_create(
                **{table.sku: sku}, defaults={table.qty: qty, "fence": 0, "name": sku}
            )
        sync_counters(skus())
        d.wait_in_sync()

    def cut(self, primary: Node, replica: Node, fault: Callable[[], None]) -> tuple[dict, dict]:
        """Writes paused on ``primary`` until ``replica`` has everything, then ``fault``
        (which stops replication), then the replica's counters and versions: what the
        new primary will start from. Writes resume."""
        client = primary.client(decode_responses=True)
        try:
            client.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
            try:

                def caught_up() -> bool:
                    sent = primary.replication().get("master_repl_offset")
                    return sent is not None and sent == replica.replication().get(
                        "slave_repl_offset"
                    )

                wait_for(caught_up, 3, "the replica to catch up under the pause")
                fault()
                return stock_on(replica)
            finally:
                client.execute_command("CLIENT", "UNPAUSE")
        finally:
            client.close()

    def observe(self, result: RunResult, holders: Holders, t_fault: float, done: Callable) -> None:
        """Sample drift, let the second holder ask, until ``done(now)`` and drift has
        been 0 for ``STABLE`` s, or the deadline."""
        track = DriftTrack()
        deadline = t_fault + DEADLINE[result.scenario]
        while True:
            now = time.monotonic()
            track.add(now, drift_states())
            holders.try_second()
            since = track.since()
            settled = (
                since is not None
                and now - since >= STABLE
                and holders.first_done()
                and not holders.pending()
            )
            finished = done(now)  # (every tick: it may act, e.g. heal the partition)
            if (settled and finished) or now > deadline:
                break
            time.sleep(max(0.0, SAMPLE - (time.monotonic() - now)))
        since = track.since()
        result.drift_zero = None if since is None else since - t_fault

    def finish(
        self, result: RunResult, plans: dict, holders: Holders, beat: Beat, t_fault: float
    ) -> None:
        """Stop the sale and the beat; the sweeper until quiet; the audit."""
        from tests.support.stock_audit import audit, drift, sweep_until_quiet

        reports = self.buyers.stop_run(list(plans))
        beat.stop()
        holders.join()
        holders.release()
        result.beat_failures = beat.failures
        result.unexpected += [f"beat: {name} x{n}" for name, n in beat.failures.items()]
        for done in beat.sweeps:
            result.corrected += sum(done["corrected"].values())
            result.repaired += sum(done[k] for k in ("expired", "closed", "given_back", "adopted"))
        majority = [i for i in plans if plans[i]["group"] == 1] or list(plans)
        firsts = []
        for index, report in reports.items():
            served = report["served"]
            result.reserves_ok += len(served) // 2
            result.paid_told += report["paid"]
            if report["longest"] > result.longest:
                result.longest, result.slowest = report["longest"], report["slowest"]
            result.unexpected += report["samples"]
            for key, n in report["tally"].items():
                name = key.split(" ", 1)[1]
                if name not in ("ok", "OutOfStock"):
                    result.errors[name if name in COLUMNS else "other"] += n
                    if name not in COLUMNS:
                        result.errors[f"other: {name}"] += n
            if index in majority:
                pairs = zip(served[::2], served[1::2], strict=True)
                firsts += [end for start, end in pairs if start > t_fault]
        result.served = min(firsts) - t_fault if firsts else None
        for name, n in holders.errors.items():
            result.errors[name if name in COLUMNS else "other"] += n
            if name not in COLUMNS:
                result.errors[f"other: {name}"] += n
        result.acked, result.grants_lost = holders.acked, holders.lost
        result.stale_passed = holders.passed
        result.stale_refused = sum(1 for g in holders.grants if g.write == "refused")
        try:
            sweep_until_quiet()
        except AssertionError as exc:
            result.quiet = False
            result.failure = f"not quiet after the sweeper: {exc}"
        books = [audit(sku, self.args.stock) for sku in skus()]
        result.oversold = sum(book.oversold for book in books)
        result.lost = sum(book.lost for book in books)
        result.sold = sum(book.committed for book in books)
        if drift():
            result.quiet = False

    # -- the scenarios ------------------------------------------------------------------

    def run_cell(self, scenario: str, replicas: int, min_replicas: int, r: int) -> RunResult:
        from django.db import connections
        from django.test import override_settings

        self.run_number += 1
        result = RunResult(scenario, replicas, min_replicas, r)
        began = time.monotonic()
        primary, replica = self.healthy()
        if scenario == "kill":
            shop = self.shop(replicas)
        else:
            far = self.deployment.backend_entry(far=True, REPLICAS=replicas, **TIMEOUTS)
            shop = self.shop(replicas, minority=far)
        override = override_settings(STOCK_LOCKS=shop)
        override.enable()
        try:
            self.prepare(primary, min_replicas)
            if scenario == "kill":
                self.kill(result, primary, replica, replicas)
            else:
                self.partition(result, primary, replica, replicas)
        finally:
            override.disable()
            connections.close_all()
        result.seconds = time.monotonic() - began
        return result

    def kill(self, result: RunResult, primary: Node, replica: Node, replicas: int) -> None:
        d, args = self.deployment, self.args
        shop = self.shop(replicas)
        plans = {i: self.plan(shop, 0, True) for i in range(len(BUYERS))}
        self.buyers.start_run(plans)
        holders = Holders(self.run_number, None)
        beat = Beat()
        self.buyers.go(0)
        beat.start()
        try:
            time.sleep(args.warm)
            frozen = self.cut(primary, replica, lambda: d.hold_replication(primary))
            t_hold = time.monotonic()
            for grant, at in zip(holders.grants, GRANT_AT, strict=True):
                time.sleep(max(0.0, t_hold + at * args.hold - time.monotonic()))
                holders.take_first(grant)
            time.sleep(max(0.0, t_hold + args.hold - time.monotonic()))
            client = primary.client(decode_responses=True)
            try:
                client.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
                final = stock_on(primary)
            finally:
                client.close()
            result.lag_bytes = d.kill(primary)
            t_fault = time.monotonic()
            new = d.wait_promoted(primary)
            result.promoted = d.promoted_at - t_fault
            d.restart(primary, as_replica_of=new)  # (a supervisor; empty, a replica at once)
            result.decrements, result.give_backs, result.moves_exact = moves_lost(frozen, final)
            self.observe(
                result, holders, t_fault, lambda now: self.buyers.served_after(plans, t_fault)
            )
        except BaseException:
            self.abort(plans, beat)
            raise
        self.finish(result, plans, holders, beat, t_fault)

    def partition(self, result: RunResult, primary: Node, replica: Node, replicas: int) -> None:
        from stock_locks.backends import get_backend

        d, args = self.deployment, self.args
        minority_shop = self.shop(replicas, far=True)
        majority_shop = self.shop(replicas)
        plans = {i: self.plan(minority_shop, 0, True, hold_open=2) for i in MINORITY}
        plans |= {i: self.plan(majority_shop, 1, False) for i in MAJORITY}
        self.buyers.start_run(plans)
        # This process's first holder is on the old primary's side: its connections
        # are opened now (it could not ask the stalled sentinels later).
        _hold_open(get_backend("minority").client, 3)
        holders = Holders(self.run_number, "minority")
        beat = Beat()
        watcher: Watcher | None = None
        self.buyers.go(0)
        beat.start()
        try:
            time.sleep(args.warm)
            beat.pause()  # (on the other side of the partition from now on)
            frozen = self.cut(primary, replica, lambda: d.partition(primary))
            t_fault = time.monotonic()
            marker = f"{REF_PREFIX}split-{self.run_number}"
            primary.ask("SET", marker, 1)  # (only the old primary ever has it)
            watcher = Watcher(primary, marker)
            watcher.start()
            new = d.wait_promoted(primary)
            result.promoted = d.promoted_at - t_fault
            # This process's clients of the majority side: forget the old primary.
            get_backend().client.connection_pool.disconnect()
            self.buyers.go(1)
            beat.resume()
            holders.take_all_first()  # (in threads: see Holders.take_all_first)
            heal_at = t_fault + result.promoted + args.split_brain
            healed = False

            def done(now: float) -> bool:
                nonlocal healed
                if not healed and now >= heal_at:
                    d.heal(primary)
                    healed = True
                return (
                    healed
                    and watcher.final is not None
                    and watcher.demoted_at is not None
                    and self.buyers.served_after(MAJORITY, 0.0)
                )

            # (the heal happens in done(), sampled with everything else)
            self.observe(result, holders, t_fault, done)
            if not healed:
                d.heal(primary)
            self.check_primary(new)
        except BaseException:
            self.abort(plans, beat, watcher)
            raise
        watcher.stop()
        if watcher.demoted_at is not None:
            result.demoted = watcher.demoted_at - t_fault
        if watcher.final is not None:
            result.decrements, result.give_backs, exact = moves_lost(frozen, watcher.final)
            result.moves_exact = exact and watcher.exact
        self.finish(result, plans, holders, beat, t_fault)

    def abort(self, plans: dict, beat: Beat, watcher: Watcher | None = None) -> None:
        """After a failed run: the sale, the beat and the watcher stopped, the buyers'
        reports drained (the next run must not read them)."""
        beat.stop()
        if watcher is not None:
            watcher.stop()
        with suppress(Exception):
            self.buyers.stop_run(list(plans))

    def check_primary(self, new: Node) -> None:
        """This process's default client is on the promoted replica (not on the old
        primary through a connection kept from before the partition)."""
        from stock_locks.backends.redis.client import get_redis

        seen = get_redis().info("server")["run_id"]
        expected = new.ask("INFO", "server")
        if isinstance(expected, dict) and seen != expected.get("run_id"):
            raise RuntimeError("this process's default client is not on the promoted replica")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    from tests.support.waiting import wait_until

    wait_until(predicate, timeout=timeout, interval=0.005, what=what)


# -- the report ------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if digits else f"{value:.0f}"
    return str(value)


def series(values: list[Any], digits: int = 0, suffix: str = "") -> str:
    """``values`` side by side, then their median in brackets ("-": not reached)."""
    shown = " ".join(fmt(v, digits) + suffix for v in values)
    known = [v for v in values if v is not None]
    if not known:
        return f"{shown} (-)"
    middle = support.median(known)
    more = "" if len(known) == len(values) else "+"
    return f"{shown} ({fmt(middle, digits)}{suffix}{more})"


def tables(results: list[RunResult], args: argparse.Namespace) -> list[str]:
    cells: dict[tuple, list[RunResult]] = {}
    for res in results:
        if not res.error:
            cells.setdefault(res.cell, []).append(res)
    main, errors = [], []
    for scenario in args.scenarios:
        for replicas, min_replicas in args.settings:
            runs = sorted(cells.get((scenario, replicas, min_replicas), []), key=lambda x: x.round)
            if not runs:
                continue
            wait, minimum = label(replicas, min_replicas)
            decrements = [
                None if r.decrements is None else f"{r.decrements}{'' if r.moves_exact else '~'}"
                for r in runs
            ]
            main.append(
                [
                    scenario,
                    wait,
                    minimum,
                    series_text(decrements, [r.decrements for r in runs]),
                    series([r.oversold for r in runs]),
                    series([r.stale_passed for r in runs]),
                    series_text(
                        [f"{r.grants_lost}/{r.acked}" for r in runs], [r.grants_lost for r in runs]
                    ),
                    series([r.served for r in runs], 1),
                    series([r.drift_zero for r in runs], 1),
                ]
            )
            errors.append(
                [scenario, wait, minimum]
                + [series([r.errors.get(name, 0) for r in runs]) for name in COLUMNS]
            )
    return [
        support.table(
            [
                "scenario",
                "WAIT",
                "min-replicas",
                "Redis decrements lost",
                "oversold",
                "stale writes passed",
                "grants lost/acked",
                "served again s",
                "drift 0 s",
            ],
            main,
        ),
        "",
        "Errors by type (buyers' and lock holders' calls; OutOfStock is an answer, not counted):",
        "",
        support.table(["scenario", "WAIT", "min-replicas", *COLUMNS], errors),
    ]


def series_text(shown: list[Any], values: list[int | None]) -> str:
    """Like :func:`series`, with ``shown`` as the per-run text of ``values``."""
    known = [v for v in values if v is not None]
    middle = fmt(support.median(known)) if known else "-"
    return " ".join(fmt(s) for s in shown) + f" ({middle})"


def detail(results: list[RunResult]) -> str:
    rows_ = []
    for n, r in enumerate(results, start=1):
        wait, minimum = label(r.replicas, r.min_replicas)
        if r.error:
            rows_.append(
                [n, r.scenario, f"{wait}/{minimum}", *["-"] * 16, f"did not complete: {r.error}"]
            )
            continue
        other = ", ".join(
            f"{k.split(': ', 1)[1]} {v}" for k, v in sorted(r.errors.items()) if ": " in k
        )
        rows_.append(
            [
                n,
                r.scenario,
                f"{wait}/{minimum}",
                fmt(r.lag_bytes),
                f"{fmt(r.decrements)}/{fmt(r.give_backs)}{'' if r.moves_exact else '~'}",
                f"{r.grants_lost}/{r.acked}",
                r.stale_refused,
                fmt(r.promoted, 1),
                fmt(r.demoted, 1),
                fmt(r.served, 1),
                fmt(r.drift_zero, 1),
                f"{r.corrected:+d}",
                r.repaired,
                r.reserves_ok,
                r.sold,
                r.oversold,
                r.lost,
                f"{r.longest:.1f} {r.slowest}",
                f"{r.seconds:.0f}",
                other or "-",
            ]
        )
    return support.table(
        [
            "run",
            "scenario",
            "WAIT/min",
            "lag bytes",
            "decr/give-backs lost",
            "grants lost/acked",
            "stale refused",
            "promoted s",
            "demoted s",
            "served s",
            "drift 0 s",
            "sweeper corrected",
            "sweeper repaired",
            "reserves ok",
            "sold",
            "oversold",
            "lost",
            "longest call",
            "run s",
            "other errors",
        ],
        rows_,
    )


def checks(results: list[RunResult]) -> list[str]:
    oversold = sum(r.oversold for r in results)
    passed = sum(r.stale_passed for r in results)
    lost = sum(r.lost for r in results)
    longest = max((r.longest for r in results), default=0.0)
    unexpected = [s for r in results for s in r.unexpected]
    failed = [r for r in results if r.failure or not r.quiet or r.error]
    told = [r for r in results if r.sold != r.paid_told and not r.error]
    lines = [
        "Checks:",
        f"  units oversold, every run: {oversold} == 0: {support.verdict(oversold == 0)}",
        f"  stale holders' writes the database accepted, every run: {passed} == 0: "
        f"{support.verdict(passed == 0)}",
        f"  units lost after the sweeper, every run: {lost} == 0: {support.verdict(lost == 0)}",
        f"  longest call {longest:.1f} s < hang bound {HANG_BOUND:g} s: "
        f"{support.verdict(longest < HANG_BOUND)}",
        f"  unexpected exceptions (not stock_locks errors): {len(unexpected)} == 0: "
        f"{support.verdict(not unexpected)}",
        f"  every run completed and settled (sweeper quiet, drift 0): "
        f"{support.verdict(not failed)}",
    ]
    lines += [f"    {s}" for s in unexpected[:5]]
    lines += [
        f"    run {results.index(r) + 1}: {r.error or r.failure or 'drift after the sweeper'}"
        for r in failed
    ]
    if told:
        lines.append(
            "  (units the database sold vs units buyers were told paid differ in "
            + ", ".join(f"run {results.index(r) + 1}: {r.sold} vs {r.paid_told}" for r in told)
            + ": a payment whose reply was lost)"
        )
    return lines


def header(db_url: str, own_db: bool, created: bool, args: argparse.Namespace) -> list[str]:
    import redis as redis_py
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        database = f"PostgreSQL {cursor.fetchone()[0]}"
    source = "DATABASE_URL" if own_db else ("created now" if created else "dedicated")
    parser = "hiredis" if redis_py.utils.HIREDIS_AVAILABLE else "Python"
    return [
        f"Redis Sentinel failover benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"{database} at {stock.redacted(db_url)} ({source}); Python "
        f"{platform.python_version()} on {platform.machine()}; {os.cpu_count()} CPUs; "
        f"redis-py {support.dist_version('redis')} ({parser} parser), "
        f"Django {support.dist_version('Django')}",
        f"{len(BUYERS)} buyer processes ({BUYERS.count('sync')} sync, "
        f"{BUYERS.count('async')} asyncio x {TASKS} shoppers), strategies "
        f"{'/'.join(STRATEGIES)} in turn, {SKUS} SKUs x {args.stock} units, reservation TTL "
        f"{TTL} s; beat: drain every {DRAIN_INTERVAL:g} s, sweep every "
        f"{SHOP['SWEEP_INTERVAL']} s; sockets {SOCKET_TIMEOUT:g} s (connect "
        f"{CONNECT_TIMEOUT:g} s), REPLICA_TIMEOUT {REPLICA_TIMEOUT:g} s, "
        f"min-replicas-max-lag {args.max_lag} s",
        f"kill: {args.warm:g} s of sale, replication held {args.hold:g} s, SIGKILL; "
        f"partition: {args.warm:g} s of sale, split, healed {args.split_brain:g} s after the "
        f"promotion; {args.runs} run(s) per cell, interleaved",
    ]


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    load_before = support.load_average()
    began = time.monotonic()
    db_url = args.database_url or stock.database_url()[0]
    own_db = bool(args.database_url or os.environ.get("DATABASE_URL"))
    created = support.ensure_database(db_url)
    with support.private_redis() as cache_server:  # (Django's caches: never the system Redis)
        support.setup_django(cache_server.url, db_url)
        logging.getLogger("stock_locks").setLevel(logging.WARNING)  # (one line per expiry)
        from django.conf import settings
        from django.core.management import call_command

        support.progress(f"migrating {stock.redacted(db_url)}")
        call_command("migrate", verbosity=0, interactive=False)
        lines = header(db_url, own_db, created, args)
        base = dict(settings.STOCK_LOCKS)
        support.progress("starting the deployment and the buyers")
        bench = Bench(args, base)
        results: list[RunResult] = []
        try:
            with bench.deployment.nodes[0].client(decode_responses=True) as client:
                lines[1] += f"; redis-server {support.redis_version(client)}"
            cells = [(s, rep, mn) for s in args.scenarios for rep, mn in args.settings]
            total = len(cells) * args.runs
            for r in range(args.runs):
                for scenario, replicas, min_replicas in support.rotated(cells, r):
                    wait, minimum = label(replicas, min_replicas)
                    support.progress(
                        f"run {len(results) + 1}/{total}: {scenario}, WAIT {wait}, "
                        f"min-replicas {minimum} ({time.monotonic() - began:.0f} s)"
                    )
                    try:
                        result = bench.run_cell(scenario, replicas, min_replicas, r)
                    except Exception as exc:  # reported; a fresh deployment for the next
                        result = RunResult(scenario, replicas, min_replicas, r)
                        result.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                        support.progress(f"run failed: {traceback.format_exc()}")
                        bench.replace_deployment()
                    results.append(result)
        finally:
            bench.close()
            cleanup()
        lines += ["", *tables(results, args), "", "Every run:", "", detail(results), ""]
        lines += legend() + [""] + checks(results)
        lines += [
            "",
            f"Whole run: {time.monotonic() - began:.0f} s.",
            support.load_line(load_before),
        ]
    return "\n".join(lines)


def legend() -> list[str]:
    text = (
        "Per cell: each run's figure, then the median in brackets ('-': not reached "
        "before the run's deadline; '+': median of the runs that reached it). WAIT: the "
        "backend's OPTIONS['REPLICAS'] 0/1; min-replicas: the servers' "
        "min-replicas-to-write 0/1. Redis decrements lost: counted on the servers (see the "
        "module doc), '~' where a count is a bound, not exact. grants lost/acked: first "
        "grants the old primary acknowledged / of those, granted again by the promoted "
        "replica. served again, drift 0, promoted, demoted: seconds from the SIGKILL or "
        "the partition. decr/give-backs lost: the old primary's counter moves the promoted "
        "replica never had. sweeper corrected: units its counter corrections added (negative: "
        "took away); repaired: records it settled or adopted, reservations it expired."
    )
    return textwrap.wrap(text, 100)


def cleanup() -> None:
    """Delete this benchmark's rows (its products and reservations)."""
    from stock_locks.models import Reservation
    from stock_locks.stock.table import StockTable

    with suppress(Exception):
        Reservation.objects.filter(order_ref__startswith=REF_PREFIX).delete()
        table = StockTable()
        table.objects.filter(**{f"{table.sku}__startswith": SKU_PREFIX}).delete()


if __name__ == "__main__":
    print(main(sys.argv[1:]))
