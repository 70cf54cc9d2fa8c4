"""The demo: several processes contend for one lock, each grant printed with its fence."""

from __future__ import annotations

import multiprocessing
import os
import time

from django.core.management.base import BaseCommand
from django.db import connections

from stock_locks import Lock

LOCK_NAME = "demo:last-item"


def _buyer(index: int, rounds: int, hold: float, start, results) -> None:
    start.wait()
    grants = []
    for _ in range(rounds):
        asked = time.monotonic()
        with Lock(LOCK_NAME, ttl=10, timeout=60) as lock:
            got = time.monotonic()
            time.sleep(hold)  # the "work" done while holding the lock
            held = time.monotonic() - got
            print(
                f"  buyer {index} (pid {os.getpid()}) got the lock: fence {lock.fence:>3}, "
                f"waited {(got - asked) * 1000:6.1f} ms, held {held * 1000:5.1f} ms",
                flush=True,
            )
            grants.append((lock.fence, got, got + held))
        time.sleep(hold / 2)  # between purchases, so others get their turn
    results.put(grants)


class Command(BaseCommand):
    help = "Run the stock_locks demo: processes contending for one Redis lock."

    def add_arguments(self, parser):
        parser.add_argument("--processes", type=int, default=4, help="contending processes")
        parser.add_argument("--rounds", type=int, default=3, help="grants per process")
        parser.add_argument("--hold-ms", type=float, default=50, help="work inside the lock, ms")

    def handle(self, *args, processes: int, rounds: int, hold_ms: float, **options):
        self.stdout.write(
            f"{processes} processes x {rounds} rounds contend for lock {LOCK_NAME!r} "
            f"(each holds it {hold_ms:g} ms; waiters sleep in BLPOP until a release wakes them)"
        )
        connections.close_all()  # the children must not share our database connection
        ctx = multiprocessing.get_context("fork")
        start, results = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_buyer, args=(i, rounds, hold_ms / 1000, start, results))
            for i in range(processes)
        ]
        for proc in procs:
            proc.start()
        start.set()
        grants = sorted(g for _ in procs for g in results.get(timeout=120))
        for proc in procs:
            proc.join()
        fences = [fence for fence, _, _ in grants]
        overlaps = sum(1 for a, b in zip(grants, grants[1:], strict=False) if b[1] < a[2])
        increasing = all(a < b for a, b in zip(fences, fences[1:], strict=False))
        self.stdout.write(
            f"{len(grants)} grants, fences {fences[0]}..{fences[-1]}, strictly increasing: "
            f"{increasing}; overlapping holds: {overlaps}"
        )
        if overlaps:
            raise SystemExit(1)
