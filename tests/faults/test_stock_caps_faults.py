"""Purchase caps under faults: a lost reply, a buyer killed between Redis and the
database, Redis killed and restarted empty. The cap still holds (no customer ever
holds more than it in the database) and no allowance is lost (once the request is
retried, or the sweeper has settled what a dead process left, the customer can buy
up to the cap again), with the units adding up and Redis equal to the database."""

from __future__ import annotations

import contextlib
from contextlib import contextmanager

import pytest
from django.conf import settings
from django.test import override_settings

from stock_locks import scripts
from stock_locks.exceptions import CapExceeded, RedisUnavailable
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.sweeper import sweep
from tests.inventory.models import Item
from tests.support.fault_processes import Child, marker, wait_stopped
from tests.support.fault_strategies import pause_before_stock_write
from tests.support.stock_audit import audit, drift, stray_records
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SKU = "CAP-KETTLE"
INITIAL = 20
CAPS = {"kettles": {"skus": [SKU], "max": 2}}


@contextmanager
def capped():
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "CAPS": CAPS}):
        yield


def held_by(customer: str) -> int:
    held = (Reservation.Status.RESERVED, Reservation.Status.COMMITTED)
    rows = Reservation.objects.filter(customer=customer, status__in=held)
    return sum(row.lines.get(SKU, 0) for row in rows)


def assert_whole() -> None:
    book = audit(SKU, INITIAL)
    assert (book.oversold, book.lost) == (0, 0), book.summary()
    assert drift() == {} and stray_records() == []


def buys_up_to_the_cap(strategy, customer: str, prefix: str) -> int:
    """Reserve one unit at a time until the cap refuses; how many it got."""
    got = 0
    for n in range(5):
        try:
            strategy.reserve(f"{prefix}-{n}", {SKU: 1}, customer=customer)
            got += 1
        except CapExceeded:
            return got
    raise AssertionError(f"{customer} bought {got} units past a cap of 2")


@pytest.mark.parametrize("name, lost", [("lua", "script"), ("watch", "EXEC")])
def test_a_capped_reserve_whose_reply_was_lost_counts_once(
    redis_through_proxy, redis_client, name, lost
):
    Item.objects.create(code=SKU, title="Kettle", on_hand=INITIAL)
    proxy = redis_through_proxy(0)
    strategy = get_strategy(name)
    with capped():
        strategy.reserve("warm", {SKU: 1}, customer="someone else")
        if lost == "script":
            redis_client.script_load(scripts.STOCK_RESERVE.script)
            proxy.lose_reply(scripts.STOCK_RESERVE.sha.encode())
        else:
            proxy.lose_reply(b"\r\nEXEC\r\n")
        # "Redis may have taken its units": the client retries with the same order ref.
        with contextlib.suppress(RedisUnavailable):
            strategy.reserve("lost", {SKU: 1}, customer="ann")
        assert proxy.lost == 1
        assert strategy.reserve("lost", {SKU: 1}, customer="ann").order_ref == "lost"
        # Counted once: one more fits under the cap, then it refuses.
        assert buys_up_to_the_cap(strategy, "ann", "after") == 1
    assert held_by("ann") == 2
    assert_whole()


def _reserve_and_die(ref: str, pause) -> None:  # in a child: stops at its stock write
    with capped(), pause_before_stock_write(pause):
        get_strategy("lua").reserve(ref, {SKU: 1}, customer="bea")


def test_a_buyer_killed_between_redis_and_the_database_loses_no_allowance(redis_client):
    Item.objects.create(code=SKU, title="Kettle", on_hand=INITIAL)
    lua = get_strategy("lua")
    with capped():
        lua.available(SKU)  # counters loaded
    pause = marker()
    child = Child(_reserve_and_die, "dead-1", pause, env={"PGAPPNAME": "faults-caps"})
    wait_stopped(child, pause, "the buyer to stop at its stock write")
    child.kill()  # Redis took the unit and counted it under Bea's cap; no row
    usage = StockKeys().cap_usage("kettles", "bea")
    assert redis_client.hexists(usage, "dead-1")
    assert not Reservation.objects.filter(order_ref="dead-1").exists()
    with capped():
        # Meanwhile the cap still holds, counting the unit Redis may have sold her.
        assert buys_up_to_the_cap(lua, "bea", "meanwhile") == 1
        # The sweeper gives the dead request's unit back, and her allowance with it.
        wait_until(
            lambda: sweep(grace=0, orphan_grace=0) and not redis_client.hexists(usage, "dead-1"),
            what="the sweeper to give the dead request's unit back",
        )
        assert buys_up_to_the_cap(lua, "bea", "later") == 1
    assert held_by("bea") == 2
    assert_whole()


@pytest.mark.parametrize("name", ["lua", "watch"])
def test_redis_killed_and_restarted_empty_keeps_every_cap_and_every_allowance(redis, name):
    Item.objects.create(code=SKU, title="Kettle", on_hand=INITIAL)
    strategy = get_strategy(name)
    customers = ["cal", "dee", "eve", "fay"]
    with capped():
        strategy.reserve("cal-0", {SKU: 1}, customer="cal")
        strategy.reserve("dee-0", {SKU: 2}, customer="dee")
        strategy.commit("dee-0")
        strategy.reserve("eve-0", {SKU: 1}, customer="eve")
        strategy.release("eve-0")
        redis.kill()
        redis.restart()  # empty: no counter, no record, no usage
        bought = {c: buys_up_to_the_cap(strategy, c, f"{c}-after") for c in customers}
    assert bought == {"cal": 1, "dee": 0, "eve": 2, "fay": 2}
    assert {c: held_by(c) for c in customers} == dict.fromkeys(customers, 2)
    assert_whole()
