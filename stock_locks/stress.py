"""The oversell stress test: many processes buy the same stock at once, then we count.

Each strategy gets its own SKUs (``<prefix>-<strategy>-<n>``), reset to the
same stock. ``processes`` forked workers share ``buyers`` attempts, each a
random cart of ``cart_size`` SKUs of ``qty`` units, either through the ORM
(``strategy.reserve``) or over HTTP against a running shop (``POST`` the
order API: 201/200 sold, 409 refused). What was sold is then read back from
the database, not trusted from the workers: oversold (must be 0), final stock
(must equal initial minus sold, never below 0), and Redis-vs-database drift.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import queue
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

from django.db import connections

from .exceptions import OutOfStock
from .models import Reservation
from .stock import get_strategy
from .stock.base import StockModel
from .stock.counters import RedisStockStrategy
from .stock.reconcile import stock_report, sync_counters

PROGRESS_EVERY = 25  # attempts between a worker's progress updates


@dataclass
class StressConfig:
    stock: int = 100
    buyers: int = 1000
    processes: int = 8
    qty: int = 1
    cart_size: int = 1
    skus: int = 0  # SKUs per strategy; 0: cart_size (one hot SKU for single-item carts)
    via: str = "orm"
    url: str = "http://127.0.0.1:8000/api/orders/"
    prefix: str = "STRESS"
    seed: int = 0

    @property
    def pool(self) -> int:
        return max(self.skus, self.cart_size)


@dataclass
class StressResult:
    strategy: str
    attempts: int
    sold: int  # units, read back from the database
    refused: int
    errors: int
    oversold: int
    final_stock: int
    drift: int
    throughput_per_s: float
    p50_ms: float
    p99_ms: float
    retries: int
    orders: int = 0  # attempts that reserved
    initial_stock: int = 0
    conserved: bool = True
    seconds: float = 0.0
    error_samples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing oversold, lost or drifted, and every attempt answered (sold or refused)."""
        return (
            self.oversold == 0
            and self.drift == 0
            and self.conserved
            and self.final_stock >= 0
            and self.errors == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_stress(config: StressConfig, strategy: str, progress: TextIO | None = None) -> StressResult:
    """Prepare the strategy's SKUs, fire the buyers, and check what happened."""
    skus = prepare(config, strategy)
    run_id = f"{config.prefix}-{strategy}-{uuid.uuid4().hex[:10]}"
    connections.close_all()  # forked workers must open their own
    ctx = multiprocessing.get_context("fork")
    start, done, results = ctx.Event(), ctx.Value("i", 0), ctx.Queue()
    share, extra = divmod(config.buyers, config.processes)
    workers = [
        ctx.Process(
            target=_worker,
            args=(i, share + (i < extra), config, strategy, skus, run_id, start, done, results),
        )
        for i in range(config.processes)
    ]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    start.set()
    outcomes = []
    while len(outcomes) < len(workers):
        try:
            outcomes.append(results.get(timeout=0.2))
        except queue.Empty:
            if not any(w.is_alive() for w in workers) and results.empty():
                break
        _draw(progress, strategy, done.value, config.buyers)
    seconds = time.perf_counter() - began
    _draw(progress, strategy, config.buyers, config.buyers, end=True)
    for worker in workers:
        worker.join()
    return _tally(config, strategy, skus, run_id, outcomes, seconds)


def prepare(config: StressConfig, strategy: str) -> list[str]:
    """Reset this strategy's SKUs to ``config.stock``.

    Reservations still open from earlier runs are released first, through the
    strategy (so Redis, the database and any order that refers to them stay
    consistent), then the stock is set.
    """
    stock = StockModel()
    chosen = get_strategy(strategy)
    skus = [f"{config.prefix}-{strategy}-{n}" for n in range(config.pool)]
    stale = Reservation.objects.filter(
        order_ref__contains=f"{config.prefix}-{strategy}-", status=Reservation.Status.RESERVED
    )
    for ref in stale.values_list("order_ref", flat=True):
        chosen.release(ref)
    has_fence = "fence" in {f.name for f in stock.model._meta.get_fields()}
    for sku in skus:
        defaults = {stock.qty: config.stock, **({"fence": 0} if has_fence else {})}
        stock.objects.update_or_create(**{stock.sku: sku}, defaults=defaults)
    if isinstance(chosen, RedisStockStrategy):
        sync_counters(skus)
    return skus


def _worker(index, attempts, config, strategy, skus, run_id, start, done, results) -> None:
    rng = random.Random(config.seed * 1000 + index)
    buy = _http_buyer(config.url) if config.via == "http" else _orm_buyer(strategy)
    tally: Counter[str] = Counter()
    latencies: list[float] = []
    samples: list[str] = []
    start.wait()
    for n in range(attempts):
        cart = {sku: config.qty for sku in sorted(rng.sample(skus, config.cart_size))}
        began = time.perf_counter()
        try:
            outcome, retries = buy(f"{run_id}-{index}-{n}", cart, strategy)
        except Exception as exc:  # every failure is counted and sampled, never fatal
            outcome, retries = "errors", 0
            if len(samples) < 3:
                samples.append(f"{type(exc).__name__}: {exc}")
        latencies.append(time.perf_counter() - began)
        tally[outcome] += 1
        tally["retries"] += retries
        if n % PROGRESS_EVERY == PROGRESS_EVERY - 1:
            with done.get_lock():
                done.value += PROGRESS_EVERY
    results.put({"tally": dict(tally), "latencies": latencies, "samples": samples})


def _orm_buyer(strategy_name: str):
    strategy = get_strategy(strategy_name)

    def buy(ref: str, cart: dict[str, int], _: str) -> tuple[str, int]:
        try:
            return "sold", strategy.reserve(ref, cart).retries
        except OutOfStock:
            return "refused", 0

    return buy


def _http_buyer(url: str):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=60)

    def buy(ref: str, cart: dict[str, int], strategy: str) -> tuple[str, int]:
        body = json.dumps(
            {"items": [{"sku": s, "qty": q} for s, q in cart.items()], "strategy": strategy}
        )
        headers = {"Content-Type": "application/json", "Idempotency-Key": ref}
        try:
            conn.request("POST", parts.path or "/", body, headers)
            response = conn.getresponse()
            payload = json.loads(response.read() or b"{}")
        except (OSError, http.client.HTTPException):
            conn.close()  # reconnect on the next request
            raise
        if response.status in (200, 201):
            return "sold", int(payload.get("retries", 0))
        if response.status == 409 and payload.get("error") == "out_of_stock":
            return "refused", 0
        raise RuntimeError(f"HTTP {response.status}: {payload.get('message', payload)}")

    return buy


def _tally(config, strategy, skus, run_id, outcomes, seconds) -> StressResult:
    totals: Counter[str] = Counter()
    latencies: list[float] = []
    samples: list[str] = []
    for outcome in outcomes:
        totals.update(outcome["tally"])
        latencies.extend(outcome["latencies"])
        samples.extend(outcome["samples"])
    sold: Counter[str] = Counter()
    for lines in Reservation.objects.filter(order_ref__contains=run_id).values_list(
        "lines", flat=True
    ):
        sold.update(lines)
    report = {row.sku: row for row in stock_report(skus)}
    initial = config.stock
    oversold = sum(max(0, sold[s] - initial) + max(0, -report[s].db) for s in skus)
    conserved = all(report[s].db == initial - sold[s] for s in skus)
    attempts = sum(totals[k] for k in ("sold", "refused", "errors"))
    latencies.sort()
    return StressResult(
        strategy=strategy,
        attempts=attempts,
        sold=sum(sold.values()),
        refused=totals["refused"],
        errors=totals["errors"] + (config.buyers - attempts),
        oversold=oversold,
        final_stock=sum(report[s].db for s in skus),
        drift=sum(abs(report[s].drift) for s in skus),
        throughput_per_s=round(attempts / seconds, 1) if seconds else 0.0,
        p50_ms=round(_percentile(latencies, 50) * 1000, 2),
        p99_ms=round(_percentile(latencies, 99) * 1000, 2),
        retries=totals["retries"],
        orders=totals["sold"],
        initial_stock=initial * len(skus),
        conserved=conserved,
        seconds=round(seconds, 3),
        error_samples=samples[:5],
    )


def _percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return 0.0
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(pct) - 1]


def _draw(out: TextIO | None, strategy: str, done: int, total: int, end: bool = False) -> None:
    if out is None:
        return
    width = 30
    filled = int(width * min(done, total) / max(total, 1))
    out.write(
        f"\r  {strategy:<15} [{'#' * filled}{'.' * (width - filled)}] {min(done, total)}/{total}"
    )
    if end:
        out.write("\n")
    out.flush()


COLUMNS = [
    ("strategy", "strategy"), ("attempts", "attempts"), ("orders", "orders"),
    ("units sold", "sold"), ("refused", "refused"),
    ("errors", "errors"), ("oversold", "oversold"), ("final", "final_stock"), ("drift", "drift"),
    ("attempts/s", "throughput_per_s"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
    ("retries", "retries"),
]  # fmt: skip


def render_table(results: list[StressResult]) -> str:
    rows = [[title for title, _ in COLUMNS]]
    rows += [[str(getattr(r, attr)) for _, attr in COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def stderr_if_tty() -> TextIO | None:
    return sys.stderr if sys.stderr.isatty() else None
