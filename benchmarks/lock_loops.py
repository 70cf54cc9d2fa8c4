"""The two loops every lock benchmark (``locks``, ``redlock``, ``zookeeper``) runs, and
their tables.

* Uncontended: one process, one reused lock object per contender, acquire+release
  cycles in interleaved rounds (order rotated each round) -> cycles/s per round,
  client CPU per cycle, and whether the fences (when the lock has them) rose.
* Contended: P spawned processes loop on one lock name, one contender per phase,
  phases in interleaved rounds. Per section: acquire() called, granted, release()
  called and returned, how many processes were waiting, the fence. Mutual exclusion
  is checked with an INCR/DECR "inside" counter on a counter server (never above 1).
  From the merged CLOCK_MONOTONIC timeline of every process: sections/s per round,
  waits, the share of grants to the process that held the lock just before, the
  handoff gap (release() called -> next grant while someone waited) and the fences
  in grant order.
"""

from __future__ import annotations

import socket
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any
from urllib.parse import urlparse

import redis

from . import support

INSIDE = "bench:inside"  # processes inside a critical section right now
WAITING = "bench:waiting"  # processes between acquire() and its grant
BATCH = 10  # uncontended cycles between clock reads
BATON = b"{bench:baton}"  # the baton list of :class:`BatonLock` (its marker: + ":made")


def paired(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Same-round ratios ``a[i] / b[i]`` (a round where ``b`` is 0 is left out)."""
    return [x / y for x, y in zip(a, b, strict=True) if y]


def same_round(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of same-round ratios: the machine's drift cancels within a round."""
    return support.median(paired(a, b))


# -- uncontended ------------------------------------------------------------------------


def timed_cycles(lock: Any, seconds: float) -> tuple[float, float, bool]:
    """Acquire+release cycles of ``lock`` for ``seconds``: cycles/s, this process's CPU
    per cycle in microseconds (every thread's), and whether the fences rose strictly
    (True for a lock without fences)."""
    acquire, release = lock.acquire, lock.release
    fenced = hasattr(lock, "fence")
    fences = {"last": -1, "rising": True}

    def cycle() -> None:
        if not acquire():
            raise RuntimeError("an uncontended acquire was refused")
        if fenced:
            fences["rising"] &= lock.fence > fences["last"]
            fences["last"] = lock.fence
        release()

    rate, cpu = support.timed_calls(cycle, seconds, BATCH)
    return rate, cpu, bool(fences["rising"])


def uncontended(
    locks: dict[str, Any],
    segments: int,
    seconds: float,
    warmup: float,
    before_each: Callable[[], Any] = lambda: None,
    what: str = "uncontended",
) -> dict[str, dict]:
    """Warm-up, then ``segments`` interleaved rounds sharing ``seconds`` per contender;
    ``before_each()`` runs before every timed run (e.g. FLUSHALL). Per contender:
    "rates" and "cpu" (one per round) and "rising" (fences, over every round)."""
    kinds = list(locks)
    support.progress(f"{what}: warm-up")
    for kind in kinds:
        before_each()
        timed_cycles(locks[kind], warmup)
    out = {kind: {"rates": [], "cpu": [], "rising": True} for kind in kinds}
    support.progress(f"{what}: {segments} rounds of {len(kinds)} contenders")
    for r in range(segments):
        for kind in support.rotated(kinds, r):
            before_each()
            rate, cpu, rising = timed_cycles(locks[kind], seconds / segments)
            out[kind]["rates"].append(rate)
            out[kind]["cpu"].append(cpu)
            out[kind]["rising"] &= rising
    before_each()
    return out


# -- contended --------------------------------------------------------------------------


def _worker(team, make_lock, lock_args, backends, counter_url, flush_urls, plan, options):
    """One process: every phase of ``plan`` in step with the others (runs in the child)."""
    from stock_locks.exceptions import StockLocksError

    if backends is not None:
        support.configure_stock_locks(BACKENDS=backends)
    counter = redis.Redis.from_url(counter_url)
    pipe = counter.pipeline(transaction=False)  # reused: execute() resets it
    work = time.sleep if options["sleep_inside"] else support.busy
    work_s, outside_s = options["work_ms"] / 1000, options["outside_ms"] / 1000
    phases = []
    for kind, seconds in plan:
        lock = make_lock(kind, *lock_args)
        team.sync()
        if team.index == 0:
            for url in {counter_url, *flush_urls}:
                with redis.Redis.from_url(url) as client:
                    client.flushall()
        team.sync()
        measure_from = time.monotonic() + options["warmup"]
        stop = measure_from + seconds
        samples, violations, errors, error_sample = [], 0, 0, ""
        while time.monotonic() < stop:
            counter.incr(WAITING)
            t0 = time.monotonic()
            try:
                if not lock.acquire():
                    raise RuntimeError(f"{kind}: a blocking acquire returned False")
            except (StockLocksError, redis.RedisError) as exc:
                counter.decr(WAITING)
                errors += 1
                error_sample = error_sample or f"{type(exc).__name__}: {exc}"
                continue
            t1 = time.monotonic()
            if pipe.decr(WAITING).incr(INSIDE).execute()[1] != 1:
                violations += 1
            work(work_s)
            # Read while still holding the lock: nobody counted can have been granted yet.
            waiting = int(pipe.decr(INSIDE).get(WAITING).execute()[1] or 0)
            fence = getattr(lock, "fence", None)
            r0 = time.monotonic()
            try:
                lock.release()
            except (StockLocksError, redis.RedisError) as exc:
                errors += 1
                error_sample = error_sample or f"{type(exc).__name__}: {exc}"
            samples.append((t0, t1, r0, time.monotonic(), waiting, fence))
            time.sleep(outside_s)
        phases.append(
            {"measure_from": measure_from, "stop": stop, "samples": samples,
             "violations": violations, "errors": errors, "error_sample": error_sample}
        )  # fmt: skip
    counter.close()
    return phases


def contended(
    kinds: Sequence[str],
    make_lock: Callable[..., Any],
    lock_args: tuple = (),
    *,
    processes: int,
    seconds: float,
    rounds: int,
    warmup: float,
    counter_url: str,
    flush_urls: Sequence[str] = (),
    backends: dict | None = None,
    work_ms: float = 1.0,
    outside_ms: float = 1.0,
    sleep_inside: bool = False,
) -> dict[str, dict]:
    """Run the contended loop in ``processes`` spawned processes: ``rounds`` interleaved
    rounds of every kind, ``seconds`` per kind in all, each phase after ``warmup``.

    ``make_lock(kind, *lock_args)`` (module level: it runs in the children) returns a
    lock with blocking ``acquire()`` and ``release()``, and ``fence`` when it has
    fences; with ``backends`` the children set ``STOCK_LOCKS["BACKENDS"]`` first. The
    counter server and ``flush_urls`` are flushed before every phase.

    Per kind: "rates" (sections/s per round), "waits", "sections" (per process),
    "again", "violations", "errors", "error_sample", "gaps" (handoff gaps while
    someone waited), "gaps_other" (those handed to another process),
    "release_calls", "fences" (grants with a fence) and "fence_ok".
    """
    per_phase = seconds / rounds
    plan = [(kind, per_phase) for r in range(rounds) for kind in support.rotated(kinds, r)]
    support.progress(
        f"contended: {processes} processes, {len(plan)} phases of {warmup:g} s warm-up + "
        f"{per_phase:.2f} s"
    )
    options = {"work_ms": work_ms, "outside_ms": outside_ms, "sleep_inside": sleep_inside,
               "warmup": warmup}  # fmt: skip
    results = support.run_workers(
        _worker, processes, make_lock, lock_args, backends, counter_url, list(flush_urls), plan,
        options,
    )  # fmt: skip
    stats = {
        kind: {"rates": [], "waits": [], "sections": Counter(), "again": 0, "violations": 0,
               "errors": 0, "error_sample": "", "gaps": [], "gaps_other": [],
               "release_calls": [], "fences": 0, "fence_ok": True}
        for kind in kinds
    }  # fmt: skip
    for p, (kind, _) in enumerate(plan):
        _add_phase(stats[kind], [worker[p] for worker in results])
    return stats


def _add_phase(entry: dict, phase: list[dict]) -> None:
    # The window every worker was measuring in (each read its own monotonic clock).
    lo = max(w["measure_from"] for w in phase)
    hi = min(w["stop"] for w in phase)
    grants = []  # (granted at, process, fence), the whole phase
    in_window = []  # (granted at, process)
    releases = []  # (release called at, process, processes waiting then)
    for index, w in enumerate(phase):
        entry["violations"] += w["violations"]
        entry["errors"] += w["errors"]
        entry["error_sample"] = entry["error_sample"] or w["error_sample"]
        for t0, t1, r0, r1, waiting, fence in w["samples"]:
            grants.append((t1, index, fence))
            if lo <= t1 < hi:
                in_window.append((t1, index))
                entry["sections"][index] += 1
            if lo <= t0 < hi:
                entry["waits"].append(t1 - t0)
            if lo <= r0 < hi:
                entry["release_calls"].append(r1 - r0)
                releases.append((r0, index, waiting))
    grants.sort(key=lambda grant: grant[0])
    in_window.sort()
    entry["again"] += sum(a[1] == b[1] for a, b in pairwise(in_window))
    entry["rates"].append(len(in_window) / (hi - lo))
    fences = [fence for _, _, fence in grants if fence is not None]
    entry["fences"] += len(fences)
    entry["fence_ok"] &= all(a < b for a, b in pairwise(fences))
    grant_times = [t for t, _, _ in grants]
    for r0, index, waiting in releases:
        n = bisect_right(grant_times, r0)
        if waiting < 1 or n == len(grants):
            continue  # nobody else waited (an idle lock is no slow handoff), or phase over
        granted, to, _ = grants[n]
        entry["gaps"].append(granted - r0)
        if to != index:
            entry["gaps_other"].append(granted - r0)


# -- the baton: what no Redis lock can hand off faster than --------------------------------


def _resp(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class BatonLock:
    """The floor of a hand-off through Redis, as a contender of the contended loop: a
    list of one element (the baton), taken with ``BLPOP`` and given back with ``LPUSH``
    on a raw socket. No client library, script, lease, fence or lost-reply safety (a
    holder that dies keeps the baton for ever): not a lock to use, the yardstick of
    what one costs under the same load."""

    MAKE = b"if redis.call('SET', KEYS[2], 1, 'NX') then redis.call('LPUSH', KEYS[1], 1) end"

    def __init__(self, url: str) -> None:
        address = urlparse(url)
        self._sock = socket.create_connection((address.hostname, address.port or 6379))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._made = False

    def _call(self, command: bytes, lines: int) -> None:
        """Send ``command``; read its reply of ``lines`` CRLF-ended lines."""
        self._sock.sendall(command)
        reply = b""
        while reply.count(b"\r\n") < lines:
            reply += self._sock.recv(256)

    def acquire(self) -> bool:
        if not self._made:  # (a phase's first try: one process puts the baton in)
            self._call(_resp(b"EVAL", self.MAKE, b"2", BATON, BATON + b":made"), 1)
            self._made = True
        self._call(_resp(b"BLPOP", BATON, b"0"), 5)  # *2, then two bulk strings
        return True

    def release(self) -> None:
        self._call(_resp(b"LPUSH", BATON, b"1"), 1)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def contended_intro(letter: str, args: Any, what: str) -> str:
    """The contended section's first line (``args``: processes, work_ms, outside_ms,
    rounds, contended seconds, warmup)."""
    per_phase = args.contended_seconds / args.rounds
    inside = "sleep" if getattr(args, "sleep_inside", False) else "busy work"
    return (
        f"{letter}. Contended: {args.processes} processes on one lock name{what}; inside each "
        f"section {args.work_ms:g} ms of {inside} between INCR/DECR of the inside counter, "
        f"{args.outside_ms:g} ms sleep outside; {args.rounds} interleaved round(s) x "
        f"{per_phase:.2f} s (after {args.warmup:g} s warm-up) per contender. sections/s: "
        "median of rounds; waits (acquire() called to granted) pooled over rounds"
    )


def contended_table(
    stats: dict[str, dict], labels: dict[str, str], reference: str, processes: int
) -> list[str]:
    """The contended table (one row per kind of ``stats``), sections/s beside
    ``reference``'s in the same round, then an example of each kind's errors."""
    rows = []
    for kind, entry in stats.items():
        waits = entry["waits"]
        per_process = [entry["sections"][i] for i in range(processes)]
        fences = (
            f"{entry['fences']:,} " + ("strictly increasing" if entry["fence_ok"] else "NOT RISING")
            if entry["fences"]
            else "none"
        )
        rows.append(
            [
                labels[kind],
                f"{support.median(entry['rates']):,.0f}",
                f"{same_round(entry['rates'], stats[reference]['rates']):.2f}x",
                ms(support.percentile(waits, 50)),
                ms(support.percentile(waits, 99)),
                f"{min(per_process)}-{max(per_process)}",
                f"{100 * entry['again'] / max(1, sum(per_process)):.0f}%",
                entry["violations"],
                entry["errors"],
                fences,
            ]
        )
    headers = ["contender", "sections/s", f"vs {reference}*", "wait p50 ms",
               "wait p99 ms", "sections per process min-max", "same process again",
               "violations", "errors", "fences in grant order"]  # fmt: skip
    lines = [
        support.table(headers, rows),
        "",
        "* median over rounds of same-round ratios. same process again: share of grants "
        "to the process that held the lock just before (a poller that sleeps loses the race "
        "to the releaser). errors: acquire() or release() raising; the loop goes on.",
    ]
    for kind, entry in stats.items():
        if entry["error_sample"]:
            lines.append(f"  {labels[kind]}, e.g.: {entry['error_sample']}")
    return lines


def exclusion_targets(stats: dict[str, dict], fenced: Sequence[str]) -> list[str]:
    """Target lines: no two processes ever inside at once; ``fenced`` kinds' fences
    strictly increasing in grant order across processes."""
    violations = sum(entry["violations"] for entry in stats.values())
    lines = [
        f"  mutual-exclusion violations, all contenders: {violations} == 0: "
        f"{support.verdict(violations == 0)}"
    ]
    for kind in fenced:
        entry = stats[kind]
        ok = entry["fence_ok"] and entry["fences"] > 0
        lines.append(
            f"  {kind}: fences strictly increasing in grant order across processes "
            f"({entry['fences']:,} grants): {support.verdict(ok)}"
        )
    return lines
