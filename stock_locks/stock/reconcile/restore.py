"""Building counters from the database: the missing counters of a sale, and everything
after Redis lost its data.

When Redis lost its data (the ``loaded`` marker is gone: a restart without
persistence, a flushed database), :func:`restore_after_data_loss` gives every
open reservation of a counter strategy its record back and sets the marker;
counters then load from the database one by one as they are needed
(:func:`load_missing_counters`). The hot path calls both.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from typing import Any

from ... import scripts
from ...backends.redis.client import get_redis
from ...backends.redis.cluster import on_node
from ...backends.redis.protocol import decoded
from ...keys import StockKeys
from ...locks import Lock
from ...models import Reservation
from ..caps import held_under_caps
from ..cart import unknown_sku
from ..registry import counter_strategies
from ..soldout import units_back
from ..table import StockTable

log = logging.getLogger("stock_locks.stock.reconcile")

LOAD_ATTEMPTS = 10
RESTORE_LOCK = "stock_locks:restore-counters"


def load_missing_counters(skus: list[str], client: Any = None) -> dict[str, int]:
    """Create the missing counters of ``skus`` from the database; every counter's value.

    A counter is set only if nothing moved that SKU's stock between reading its
    version and reading the database (a restock, a release, a database strategy's
    sale bump the version even while the counter is missing), else read again:
    a level read before a relative change is never stored after it. Raises
    :class:`InvalidQuantity` for a SKU the database does not have.
    """
    client = client or get_redis()
    keys, stock = StockKeys(), StockTable()
    pending = list(skus)
    for _ in range(LOAD_ATTEMPTS):
        seen = client.hmget(keys.versions, pending)
        levels = stock.levels(pending)
        for sku in pending:
            if sku not in levels:
                raise unknown_sku(sku)
        args = [v for sku, ver in zip(pending, seen, strict=True)
                for v in (sku, decoded(ver) if ver is not None else "0", levels[sku])]  # fmt: skip
        done = scripts.STOCK_LOAD([keys.versions, *map(keys.counter, pending)], args, client=client)
        units_back(pending)
        pending = [sku for sku, outcome in zip(pending, done, strict=True) if outcome == -1]
        if not pending:
            break
    values = client.mget([keys.counter(sku) for sku in skus])
    return {sku: int(v) for sku, v in zip(skus, values, strict=True) if v is not None}


def restore_after_data_loss(client: Any = None) -> bool:
    """If Redis lost its data (no ``loaded`` marker), give every open reservation of a
    counter strategy its record back, every capped customer their usage (the
    reservations holding stock in each cap's window, whatever their strategy), and
    set the marker. True when this call did.

    Counters are not written here: a missing counter loads from the database
    (which already excludes open reservations) when first needed. One process
    restores while the others wait for it (a lock), then go on.
    """
    client = client or get_redis()
    keys = StockKeys()
    if client.exists(keys.loaded):
        return False
    with Lock(RESTORE_LOCK, ttl=60, timeout=60, redis=client):
        if client.exists(keys.loaded):
            return False  # another process restored while this one waited
        open_rows = list(
            Reservation.objects.filter(
                status=Reservation.Status.RESERVED, strategy__in=counter_strategies()
            ).values_list("order_ref", "lines", "created_at")
        )
        usage = cap_usage_rows(keys)
        marker = _marker(client)

        def restore(node: Any) -> None:
            # One MULTI/EXEC; every stock key shares one hash tag, so on a cluster it is
            # one node's transaction (cluster pipelines of redis-py 5 have none).
            pipe = node.pipeline(transaction=True)
            for ref, lines, created_at in open_rows:
                pipe.delete(keys.record(ref))
                pipe.hset(keys.record(ref), mapping=lines)
                pipe.zadd(keys.index, {ref: int(created_at.timestamp() * 1000)})
            for key, ref, value, is_open in usage:
                pipe.hset(key, ref, value)
                if is_open:
                    pipe.hset(f"{keys.record(ref)}:caps", key, value.partition(":")[0])
            pipe.hset(keys.loaded, mapping=marker)
            pipe.execute()

        on_node(client, keys.loaded, restore)
        restored = len(open_rows)
    if restored:
        log.warning(
            "Redis had lost the stock data; gave %d open reservation(s) their records back",
            restored,
        )
    else:
        log.info("stock data marked as loaded in Redis")
    return True


def cap_usage_rows(keys: StockKeys) -> list[tuple[str, str, str, bool]]:
    """What Redis holds of the customers' usage under every cap, from the database:
    (usage key, order ref, ``units:ms``, whether the reservation is open and has a
    Redis record)."""
    with_records = counter_strategies()
    return [
        (
            keys.cap_usage(held.cap.name, held.customer), held.ref, held.entry,
            held.status == Reservation.Status.RESERVED and held.strategy in with_records,
        )
        for held in held_under_caps()
    ]  # fmt: skip


def _marker(client: Any) -> dict[str, Any]:
    seconds, _ = client.time()
    return {
        "epoch": secrets.token_hex(8),
        "run_id": run_id(client),
        "loaded_at": dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat(),
    }


def run_id(client: Any) -> str:
    """The run id of the Redis server holding the stock keys (on a cluster, the master
    serving their hash tag: a failover changes it, as a restart does)."""
    keys = StockKeys()
    return decoded(on_node(client, keys.loaded, lambda node: node.info("server")).get("run_id", ""))
