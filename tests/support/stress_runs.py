"""``oversell_stress`` runs, and what they leave, for the tests of the command.

The command leaves nothing behind, so what it did is read back independently
of its own tally by a receiver of ``stress_cleanup`` (sent after the figures,
before the clean-up):

    with watching_cleanup() as seen:                 # a fixture in the test module
        (result,) = stress("--strategy", "lua", fields=("--field", "title=Stress"))
    seen["lua"]["sold"]                              # {sku: units} before the clean-up

Stock rows are read through the configured stock model (``StockTable``), so
these work for the library's tests (tests/inventory) and the demo's alike.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO

from django.core.management import call_command

from stock_locks.models import Reservation
from stock_locks.stock.stress import stress_cleanup
from stock_locks.stock.table import StockTable

RESULT_KEYS = {
    "strategy",
    "attempts",
    "sold",
    "refused",
    "errors",
    "oversold",
    "final_stock",
    "drift",
    "throughput_per_s",
    "p50_ms",
    "p99_ms",
    "retries",
    "skus",
}
# (and the metrics timeline: what the run did is recorded, by design, not data of a run)
KEPT = (
    "sl:lock:", "sl:locks", "sl:stock:{stock}:loaded", "sl:dq:{default}:signal", "sl:metrics:",
    "sl:registry:",
)  # fmt: skip


def run(*args: str) -> tuple[str, str]:
    """``call_command(*args)``: what it wrote to stdout and stderr."""
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def stress(*args: str, fields: tuple[str, ...]) -> list[dict]:
    """``oversell_stress --json`` with ``fields`` (``--field NAME=VALUE`` options) and ``args``."""
    out, _ = run("oversell_stress", "--json", *fields, *args)
    results = [json.loads(line) for line in out.splitlines() if line.strip()]
    for result in results:
        assert set(result) >= RESULT_KEYS, RESULT_KEYS - set(result)
    return results


def redis_state(client) -> dict:
    """Every key with its value, but the lock keys, the loaded marker, the delay
    queue's wake-up list, the metrics and the registries of names in use (kept by the
    library, not data of a run)."""
    state = {}
    for raw in client.scan_iter():
        key = raw.decode()
        if key.startswith(KEPT):
            continue
        kind = client.type(key).decode()
        if kind == "string":
            state[key] = client.get(key)
        elif kind == "hash":
            state[key] = client.hgetall(key)
        elif kind == "zset":
            state[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            state[key] = client.lrange(key, 0, -1)
        else:
            state[key] = client.smembers(key)
    return state


class Seen(dict):
    """{strategy: what its run left just before the clean-up}; ``then(func)`` adds a step
    run after the read, with (strategy, order_refs, skus)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list = []

    def then(self, func) -> None:
        self.steps.append(func)


@contextmanager
def watching_cleanup() -> Iterator[Seen]:
    """What each run left before its clean-up, read from the database by a receiver of
    stress_cleanup (sent after the figures, before anything is removed)."""
    seen = Seen()

    def receiver(sender, strategy, order_refs, skus, created, **kwargs):
        rows = Reservation.objects.filter(order_ref__in=order_refs)
        sold: Counter[str] = Counter()
        for lines in rows.values_list("lines", flat=True):
            sold.update(lines)
        seen[strategy] = {
            "refs": order_refs,
            "skus": skus,
            "created": created,
            "sold": sold,
            "stock": StockTable().levels(skus),
            "reservations": rows.count(),
        }
        for step in seen.steps:
            step(strategy, order_refs, skus)

    stress_cleanup.connect(receiver)
    try:
        yield seen
    finally:
        stress_cleanup.disconnect(receiver)


def stress_rows():
    """The stock model's rows a run created (SKUs ``STRESS-...``)."""
    stock = StockTable()
    return stock.objects.filter(**{f"{stock.sku}__startswith": "STRESS-"})


def assert_left_nothing() -> None:
    assert not stress_rows().exists()
    assert not Reservation.objects.exists()
