"""Reservation expiry, the sweeper and the drift measurement, on a real Redis and PostgreSQL.

The fault suite (tests/faults/) kills and cuts real servers; these tests stage
the states those faults leave (a lost delay-queue item, a flushed Redis, a
record without its row) by writing them, and check what the library does next.
"""

from __future__ import annotations

import datetime as dt

import pytest

from stock_locks import DelayQueue
from stock_locks.exceptions import InvalidQuantity, ReservationError
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.signals import reservation_expired
from stock_locks.stock import get_strategy
from stock_locks.stock.expiry import EXPIRE_TASK, expire_reservation, item_id
from stock_locks.stock.reconcile import measure, repair
from stock_locks.stock.sweeper import sweep
from tests.inventory.models import Item
from tests.support.redis_stats import redis_ms

pytestmark = pytest.mark.django_db(transaction=True)

STRATEGIES = ["lua", "watch", "lock", "db_row_lock", "db_conditional"]


def stock_of(sku: str) -> int:
    return Item.objects.get(code=sku).on_hand


def due_now(order_ref: str) -> None:
    """Make a reservation due by writing its state (no waiting)."""
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    Reservation.objects.filter(order_ref=order_ref).update(expires_at=past)


@pytest.fixture
def expired_signals():
    seen: list[str] = []

    def receiver(sender, order_ref, lines, **kwargs):
        seen.append(order_ref)

    reservation_expired.connect(receiver)
    yield seen
    reservation_expired.disconnect(receiver)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_reservation_with_a_ttl_is_due_by_the_redis_clock_and_queued(strategy, redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    before = redis_ms(redis_client)
    reservation = get_strategy(strategy).reserve("o-1", {"TEA": 2}, ttl=90)
    after = redis_ms(redis_client)
    row = Reservation.objects.get(order_ref="o-1")
    due_ms = int(row.expires_at.timestamp() * 1000)
    assert before + 90_000 <= due_ms <= after + 90_000
    assert reservation.expires_at == row.expires_at
    queue = DelayQueue("default")
    score = redis_client.zscore(queue.keys.due, item_id("o-1"))
    assert score == pytest.approx(due_ms, abs=1)


@pytest.mark.parametrize("ttl", [0, -1, "60", True, float("nan"), float("inf")])
def test_a_bad_ttl_is_refused_and_reserves_nothing(ttl):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    with pytest.raises(InvalidQuantity, match="ttl"):
        get_strategy("lua").reserve("o-1", {"TEA": 1}, ttl=ttl)
    assert stock_of("TEA") == 5 and not Reservation.objects.exists()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_expiry_releases_once_signals_once_and_spares_a_paid_one(
    strategy, redis_client, expired_signals
):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    chosen = get_strategy(strategy)
    chosen.reserve("unpaid", {"TEA": 2}, ttl=60)
    chosen.reserve("paid", {"TEA": 1}, ttl=60)
    chosen.commit("paid")
    assert not redis_client.zscore(DelayQueue("default").keys.due, item_id("paid"))
    assert expire_reservation("unpaid") is False  # not due yet
    due_now("unpaid")
    due_now("paid")
    assert expire_reservation("unpaid") is True
    assert expire_reservation("unpaid") is False  # delivered twice: nothing more
    assert expire_reservation("paid") is False
    assert expired_signals == ["unpaid"]
    assert stock_of("TEA") == 4
    assert [(r.sku, r.drift) for r in measure() if r.drift] == []


def test_the_delay_queue_handler_expires_the_reservation(redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    get_strategy("lua").reserve("o-1", {"TEA": 2}, ttl=0.001)
    get_strategy("lua").reserve("o-2", {"TEA": 1}, ttl=3600)
    queue = DelayQueue("default")
    [item] = queue.claim()  # only o-1 is due
    assert item.task == EXPIRE_TASK and item.payload == {"order_ref": "o-1"}
    queue.fail(item.id, "staged", delay=0)  # hand it back, due now
    assert queue.drain().handled == 1
    assert Reservation.objects.get(order_ref="o-1").status == "released"
    assert Reservation.objects.get(order_ref="o-2").status == "reserved"
    assert stock_of("TEA") == 4


def test_the_sweeper_expires_what_the_delay_queue_lost(redis_client, expired_signals):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    for ref in ("a", "b"):
        get_strategy("lua").reserve(ref, {"TEA": 1}, ttl=60)
    get_strategy("db_conditional").reserve("c", {"TEA": 1}, ttl=60)
    redis_client.delete(*DelayQueue("default").keys)  # the queue lost every item
    assert sweep().expired == []  # not due yet
    for ref in ("a", "c"):
        due_now(ref)
    result = sweep(grace=0)
    assert sorted(result.expired) == ["a", "c"]
    assert sorted(expired_signals) == ["a", "c"]
    assert stock_of("TEA") == 4
    assert [(r.sku, r.drift) for r in measure() if r.drift] == []


@pytest.mark.parametrize("strategy", ["lua", "watch"])
def test_redis_losing_its_data_strands_nothing(strategy, redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=10)
    chosen = get_strategy(strategy)
    chosen.reserve("held", {"TEA": 3})
    chosen.reserve("paid", {"TEA": 2})
    chosen.commit("paid")
    redis_client.flushall()  # a restart without persistence
    again = get_strategy(strategy)
    again.reserve("after", {"TEA": 1})  # notices, restores, sells on
    assert redis_client.exists(StockKeys().record("held"))  # the open one got its record back
    assert again.release("held") is True  # and its units go back in Redis too
    assert again.available("TEA") == stock_of("TEA") == 7
    assert [(r.sku, r.drift) for r in measure() if r.drift] == []


def test_a_record_whose_row_never_came_is_given_back_once_and_a_late_row_is_refused(
    redis_client,
):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    lua = get_strategy("lua")
    lua.reserve("fine", {"TEA": 1})
    lua.reserve_in_redis("ghost", {"TEA": 2})  # the process died before the database step
    assert lua.available("TEA") == 2
    report = {r.sku: r for r in measure()}["TEA"]
    assert (report.in_flight, report.drift) == (2, 0)  # in flight, not drift
    assert repair().orphans == []  # younger than the grace: its request may still come
    assert repair(orphan_grace=0).orphans == ["ghost"]
    assert repair(orphan_grace=0).orphans == []  # once
    assert lua.available("TEA") == 4 == stock_of("TEA")
    with pytest.raises(ReservationError, match="released"):
        lua.reserve("ghost", {"TEA": 2})  # the late retry is told, and takes nothing
    assert lua.available("TEA") == 4 == stock_of("TEA")


def test_an_open_row_without_its_record_is_adopted(redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    lua = get_strategy("lua")
    lua.reserve("a", {"TEA": 2})
    redis_client.delete(StockKeys().record("a"))  # lost between the script and the row
    redis_client.zrem(StockKeys().index, "a")
    redis_client.incrby(StockKeys().counter("TEA"), 2)
    report = {r.sku: r for r in measure()}["TEA"]
    assert (report.in_flight, report.drift) == (-2, 0)
    assert repair().adopted == ["a"]
    assert lua.available("TEA") == 3 == stock_of("TEA")
    lua.release("a")
    assert lua.available("TEA") == 5 == stock_of("TEA")


def test_drift_from_outside_the_strategies_is_corrected_relatively(redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    lua = get_strategy("lua")
    lua.reserve("a", {"TEA": 1})
    Item.objects.filter(code="TEA").update(on_hand=14)  # an admin restock of 10
    assert {r.sku: r.drift for r in measure()} == {"TEA": -10}
    assert repair().corrected == {"TEA": 10}
    assert lua.available("TEA") == 14
    lua.release("a")
    assert lua.available("TEA") == stock_of("TEA") == 15
    assert [(r.sku, r.drift) for r in measure() if r.drift] == []


def test_a_release_by_another_strategy_is_done_by_the_one_that_reserved(redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    get_strategy("lua").reserve("a", {"TEA": 2})
    assert get_strategy("db_conditional").release("a") is True
    assert get_strategy("lua").available("TEA") == 5 == stock_of("TEA")
    assert not redis_client.exists(StockKeys().record("a"))
