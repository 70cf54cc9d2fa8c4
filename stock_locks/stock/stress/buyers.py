"""A stress run's buyers: forked worker processes buying through the ORM or HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import signal
import time
from collections import Counter
from urllib.parse import urlsplit

from ...exceptions import OutOfStock
from ..registry import get_strategy
from .plan import PROGRESS_EVERY, StressConfig, _StrategyNotAccepted


def _worker(
    index, attempts, config, strategy, skus, run_id, ready, start, stop, done, results
) -> None:
    # A terminal's Ctrl-C reaches every process of the group: the parent stops the
    # workers after their attempt (the stop flag) and cleans up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rng = random.Random(config.seed * 1000 + index)
    buy = _http_buyer(config.url) if config.via == "http" else _orm_buyer(strategy)
    tally: Counter[str] = Counter()
    latencies: list[float] = []
    samples: list[str] = []
    fatal = None
    _connect(strategy, config)
    ready.release()
    start.wait()
    every_sku = len(skus) == config.cart_size  # the same cart each time (a flash sale's)
    for n in range(attempts):
        if stop.value:
            break
        chosen = skus if every_sku else sorted(rng.sample(skus, config.cart_size))
        cart = {sku: config.qty for sku in chosen}
        began = time.perf_counter()
        try:
            outcome, retries = buy(f"{run_id}-{index}-{n}", cart, strategy)
        except _StrategyNotAccepted as exc:
            fatal = str(exc)
            stop.value = 1
            break
        except Exception as exc:  # every failure is counted and sampled, never fatal
            outcome, retries = "errors", 0
            if len(samples) < 3:
                samples.append(f"{type(exc).__name__}: {exc}")
        latencies.append(time.perf_counter() - began)
        tally[outcome] += 1
        tally["retries"] += retries
        if n % PROGRESS_EVERY == PROGRESS_EVERY - 1:
            done[index] = n + 1
    results.put({"tally": dict(tally), "latencies": latencies, "samples": samples, "fatal": fatal})


def _connect(strategy: str, config: StressConfig) -> None:
    """Open this buyer's connections before the start, as a web worker has them before
    a sale (a failure shows in its attempts)."""
    if config.via == "http":
        return
    with contextlib.suppress(Exception):
        get_strategy(strategy).warm_up()


def _orm_buyer(strategy_name: str):
    strategy = get_strategy(strategy_name)

    def buy(ref: str, cart: dict[str, int], _: str) -> tuple[str, int]:
        try:
            return "sold", strategy.reserve(ref, cart, fresh_ref=True).retries
        except OutOfStock:
            return "refused", 0

    return buy


def _http_buyer(url: str):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=60)

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
        message = str(payload.get("message", payload))
        if response.status == 400 and 'remove "strategy"' in message:
            raise _StrategyNotAccepted(
                f"the shop at {url} chooses the stock strategy itself and refuses one in the "
                f"order body ({message}): start the shop with SHOP_STRATEGY_FROM_REQUEST=1 "
                "(the demo's switch that lets the body pick), or use --via orm"
            )
        raise RuntimeError(f"HTTP {response.status}: {message}")

    return buy
