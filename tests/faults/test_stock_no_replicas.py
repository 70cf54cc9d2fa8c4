"""A primary that refuses writes for lack of replicas (issue 22): ``NOREPLICAS``.

With ``min-replicas-to-write 1`` a Sentinel-managed primary cut off from its replica
refuses every write (``-NOREPLICAS Not enough good replicas to write``) until one is
back in sync: what a shop configures so that a primary partitioned away from the
others stops taking sales that a failover would lose. For stock_locks that is Redis
unavailable, as a connection refused is: every Redis stock strategy (``lua``,
``watch``, ``lock``; ``reserve`` and ``areserve``) and a lock acquire (sync and
asyncio) raise :class:`~stock_locks.exceptions.RedisUnavailable` (HTTP 503), never a
bare ``ResponseError`` (HTTP 500), and nothing changes, in Redis or in the database:
no half-done reservation. (Every writing script declares it, ``#!lua``, so the
primary refuses it before it runs.)

One deployment (:class:`~tests.support.sentinel_failover.FailoverDeployment`) serves
the module; each test loads what it needs, then the replica is SIGKILLed, and
restarted afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.test import override_settings

from stock_locks import Lock, aio
from stock_locks.backends.redis.errors import NoReplicasError
from stock_locks.exceptions import RedisUnavailable
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.sentinel_failover import FailoverDeployment, Node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

T = TypeVar("T")

SKU = "LONELY"
TIMEOUTS = {"SOCKET_TIMEOUT": 2.0, "SOCKET_CONNECT_TIMEOUT": 1.0}
SETTLED_TTL_MS = 10_000  # keys expiring sooner are left out of a snapshot


@pytest.fixture(scope="module")
def deployment() -> Iterator[FailoverDeployment]:
    with FailoverDeployment() as started:
        yield started


@pytest.fixture
def shop(deployment: FailoverDeployment) -> Iterator[FailoverDeployment]:
    """The project on ``deployment``'s Sentinel-managed primary (flushed), its replica
    in sync; afterwards the replica runs and is in sync again, and the primary takes
    writes without one."""
    primary = deployment.primary()
    primary.ask("FLUSHALL")
    stock_locks = deployment.stock_locks_settings(settings.STOCK_LOCKS, "location", **TIMEOUTS)
    try:
        with override_settings(STOCK_LOCKS=stock_locks):
            yield deployment
    finally:
        replica = deployment.other(primary)
        deployment.config_set(primary, "min-replicas-to-write", 0)
        if not replica.running:
            deployment.restart(replica, as_replica_of=primary)
        deployment.wait_rejoined(replica)


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coroutine)``; then the database connections of Django's thread for
    sync code are closed, as at a request's end."""

    async def main() -> T:
        try:
            return await coroutine
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def refuses_writes(primary: Node) -> bool:
    """Whether ``primary`` answers a write with NOREPLICAS now (asked directly)."""
    client = primary.client()
    try:
        client.execute_command("SET", "probe:noreplicas", 1, "PX", 1)
    except redis.ResponseError as exc:
        return "good replicas" in str(exc)
    finally:
        client.close()
    return False


def lose_the_replica(deployment: FailoverDeployment) -> Node:
    """``min-replicas-to-write 1`` on the primary, its replica SIGKILLed; returns the
    primary once it refuses writes."""
    primary = deployment.primary()
    deployment.config_set(primary, "min-replicas-to-write", 1)
    deployment.kill(deployment.other(primary))
    wait_until(lambda: refuses_writes(primary), what="the primary to refuse writes (NOREPLICAS)")
    return primary


def snapshot(primary: Node) -> dict[str, Any]:
    """Every key of the primary and its serialized value (DUMP), read directly; keys
    about to expire left out (they may go between two snapshots)."""
    client = primary.client()
    try:
        keys = [
            key
            for key in client.scan_iter(count=1000)
            if key != b"probe:noreplicas" and not 0 <= client.pttl(key) < SETTLED_TTL_MS
        ]
        return {key: client.dump(key) for key in keys}
    finally:
        client.close()


def database() -> tuple[int, list[tuple[str, str]]]:
    """The SKU's stock column and every reservation (order ref, status)."""
    stock = Item.objects.get(code=SKU).on_hand
    return stock, sorted(Reservation.objects.values_list("order_ref", "status"))


def refused_for_lack_of_replicas(exc: BaseException) -> bool:
    """Whether ``exc`` was caused (down its chain) by the primary's NOREPLICAS."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, NoReplicasError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("strategy", ["lua", "watch", "lock"])
def test_a_reservation_on_a_primary_without_replicas_is_unavailable_and_changes_nothing(
    shop, strategy, mode
):
    Item.objects.create(code=SKU, title="Lonely kettle", on_hand=5)
    chosen = get_strategy(strategy)
    # Loaded while the replica is there: counters, scripts, the connection.
    chosen.reserve("before", {SKU: 1})
    chosen.release("before")
    primary = lose_the_replica(shop)
    redis_before, database_before = snapshot(primary), database()

    with pytest.raises(RedisUnavailable) as refused:
        if mode == "sync":
            chosen.reserve("refused", {SKU: 2})
        else:
            run_async(chosen.areserve("refused", {SKU: 2}))

    assert refused_for_lack_of_replicas(refused.value), repr(refused.value)
    assert database() == database_before == (5, [("before", Reservation.Status.RELEASED)])
    assert snapshot(primary) == redis_before


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_lock_on_a_primary_without_replicas_is_unavailable_and_grants_nothing(shop, mode):
    with Lock("noreplicas:warm-up", ttl=30):
        pass
    primary = lose_the_replica(shop)
    before = snapshot(primary)

    async def acquire_async() -> bool:
        return await aio.Lock("noreplicas:lock", ttl=30).acquire(timeout=5)

    with pytest.raises(RedisUnavailable) as refused:
        if mode == "sync":
            Lock("noreplicas:lock", ttl=30).acquire(timeout=5)
        else:
            run_async(acquire_async())

    assert refused_for_lack_of_replicas(refused.value), repr(refused.value)
    assert snapshot(primary) == before
