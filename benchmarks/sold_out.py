"""How long a unit that came back stays unsellable in a process that remembers its SKU sold out.

The ``lua`` strategy answers carts for a SKU it saw sold out without asking
Redis, until units of it are announced (stock_locks.stock.soldout). Here one
process remembers a SKU sold out; another process gives a unit back (the
correction script that restocks and announces) and reports when it sent the
call and when the reply came back. The first process spins until it would ask
Redis again. Per round:

- script round trip: the giver's call, sent to reply (one Redis round trip);
- unsellable window: from the giver's send to the moment the remembering
  process stops answering sold-out itself; and the part of it after the
  giver had its reply (the announcement's own delay).

Both are read from CLOCK_MONOTONIC, which all processes of one host share.
The target: the announcement's own delay is at most about one round trip,
far below ``SOLD_OUT_TTL`` (the bound when an announcement is lost).
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

from . import support

SKU = "BENCH-SOLDOUT"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks sold_out", description=__doc__)
    parser.add_argument("--rounds", type=int, default=300, help="units given back (300)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 30
    return args


def _giver(orders, replies) -> None:  # another process (forked: Django is set up)
    from stock_locks import scripts
    from stock_locks.backends.redis import get_redis
    from stock_locks.keys import StockKeys

    client, keys = get_redis(), StockKeys()
    while orders.recv():
        sent = time.monotonic()
        scripts.STOCK_CORRECT([keys.versions, keys.counter(SKU)], [SKU, "", 1], client=client)
        replies.send((sent, time.monotonic()))


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    with support.private_redis() as server:
        support.setup_django(server.url)
        from stock_locks.backends.redis import get_redis
        from stock_locks.keys import StockKeys
        from stock_locks.stock import soldout

        client, keys = get_redis(), StockKeys()
        client.set(keys.counter(SKU), 0)
        cache = soldout.cache_for(client, keys.versions)
        assert cache is not None, "SOLD_OUT_TTL is 0 in the demo settings"
        while cache.ticket() is None:  # the listener subscribes
            time.sleep(0.001)
        ctx = multiprocessing.get_context("fork")
        orders, giver_end = ctx.Pipe()
        giver_replies, replies = ctx.Pipe()
        giver = ctx.Process(target=_giver, args=(giver_end, giver_replies))
        giver.start()
        trips, windows, after = [], [], []
        try:
            for _ in range(args.rounds):
                version = int(client.hget(keys.versions, SKU) or 0)
                cache.refused(cache.ticket(), SKU, 0, version)
                assert cache.short_line({SKU: 1}) is not None
                orders.send(True)
                while cache.short_line({SKU: 1}) is not None:
                    time.sleep(0)  # let the listener thread take the GIL
                seen = time.monotonic()
                sent, replied = replies.recv()
                trips.append((replied - sent) * 1000)
                windows.append((seen - sent) * 1000)
                after.append((seen - replied) * 1000)
        finally:
            orders.send(False)
            giver.join()
            soldout.reset()

    def row(name: str, values: list[float]) -> list[str]:
        return [name] + [f"{support.percentile(values, p):.3f}" for p in (50, 90, 99)]

    window_p50, trip_p50 = support.percentile(windows, 50), support.percentile(trips, 50)
    return "\n".join(
        [
            f"Sold-out cache: a unit given back by another process, {args.rounds} rounds "
            f"(private redis-server; ms, CLOCK_MONOTONIC)",
            "",
            support.table(
                ["", "p50 ms", "p90 ms", "p99 ms"],
                [
                    row("script round trip", trips),
                    row("unsellable window", windows),
                    row("  of which after the reply", after),
                ],
            ),
            "",
            f"unsellable window / round trip (p50): {window_p50 / trip_p50:.2f}x "
            f"(SOLD_OUT_TTL, the bound when an announcement is lost: 1 s)",
        ]
    )
