"""Unpaid orders expire with their stock reservation (the library's expiry), end to end.

``place_order`` reserves with ``ttl``; the reservation's due time comes from
the Redis clock and its expiry item is the library's
(``stock_locks.expire_reservation``); the shop's receiver of
``reservation_expired`` marks the order EXPIRED. Real Celery worker and beat
where the scenario needs them.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
from django.test import Client

from demo_shop.shop import services
from demo_shop.shop.models import Order, Product
from demo_shop.shop.services import pay_order, place_order
from stock_locks import DelayQueue
from stock_locks.conf import settings as stock_settings
from stock_locks.models import Reservation
from stock_locks.signals import reservation_expired
from stock_locks.stock import get_strategy
from stock_locks.stock.expiry import EXPIRE_TASK, expire_reservation
from stock_locks.stock.reconcile import stock_report
from tests.support.celery_handlers import SLOW_DELIVERIES, SLOW_STARTED
from tests.support.celery_processes import ROOT, CeleryProcess, celery_environment
from tests.support.processes import child_environment
from tests.support.waiting import TIMEOUT, wait_until


@pytest.fixture
def celery():
    """Start a worker and a beat draining every 0.2 s, with a 2 s visibility timeout."""
    env = celery_environment(DELAY_QUEUE_INTERVAL="0.2", DELAY_QUEUE_VISIBILITY="2")
    started: list[CeleryProcess] = []

    def start(kind: str, name: str) -> CeleryProcess:
        started.append(CeleryProcess(kind, name, env, app="demo_shop").start())
        return started[-1]

    yield start
    for process in started:
        process.stop()


def status(order: Order) -> str:
    return Order.objects.get(pk=order.pk).status


def stock() -> int:
    return Product.objects.get(sku="TEA").stock


def queue() -> DelayQueue:
    return DelayQueue(stock_settings.RESERVATION_QUEUE)


def redis_now(redis_client) -> dt.datetime:
    seconds, micros = redis_client.time()
    return dt.datetime.fromtimestamp(seconds + micros / 1e6, tz=dt.UTC)


def make_due(order: Order, redis_client) -> None:
    """The reservation falls due now (Redis clock), by writing its row: no sleeping."""
    queue().cancel(f"reservation:{order.ref}")  # the scenario delivers its own item
    due = redis_now(redis_client) - dt.timedelta(seconds=1)
    Reservation.objects.filter(order_ref=order.ref).update(expires_at=due)


def assert_quiet_and_consistent() -> None:
    stats = queue().stats()
    assert (stats["in_flight"], stats["dead"]) == (0, 0)
    assert [row.drift for row in stock_report()] == [0]


# -- the due time is the reservation's, from the Redis clock ----------------------------


@pytest.mark.django_db
def test_expires_at_is_the_reservations_due_time_from_redis_not_the_web_hosts_clock(
    monkeypatch, redis_client
):
    class HostClock400DaysAhead:
        @staticmethod
        def now() -> dt.datetime:
            return dt.datetime.now(dt.UTC) + dt.timedelta(days=400)

    monkeypatch.setattr(services, "timezone", HostClock400DaysAhead)
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    before = redis_now(redis_client)
    order, _ = place_order({"TEA": 1}, "lua", ttl=60)
    after = redis_now(redis_client)

    reservation = Reservation.objects.get(order_ref=order.ref)
    assert order.expires_at == reservation.expires_at
    assert Order.objects.get(pk=order.pk).expires_at == reservation.expires_at
    span = (before + dt.timedelta(seconds=60), after + dt.timedelta(seconds=60))
    assert span[0] - dt.timedelta(seconds=1) <= order.expires_at <= span[1]
    # The library's expiry item is due when the order says (no demo item of its own).
    assert queue().stats()["scheduled"] == 1
    detail = Client().get(f"/api/orders/{order.pk}/").json()
    assert dt.datetime.fromisoformat(detail["expires_at"]) == reservation.expires_at


# -- the expiry marks the order, once ------------------------------------------------------


@pytest.mark.django_db
def test_reservation_expiry_marks_the_order_expired_once_and_never_a_paid_one(redis_client):
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    unpaid, _ = place_order({"TEA": 2}, "lua", ttl=3600)
    paid, _ = place_order({"TEA": 3}, "db_conditional", ttl=3600)
    pay_order(paid)
    make_due(unpaid, redis_client)
    make_due(paid, redis_client)

    assert expire_reservation(unpaid.ref) is True
    assert status(unpaid) == "expired" and stock() == 7
    stamped = Order.objects.get(pk=unpaid.pk).cancelled_at
    assert expire_reservation(unpaid.ref) is False  # delivered twice: nothing moves
    assert expire_reservation(paid.ref) is False  # paid: not released
    # A second report of the same expiry (the signal may come twice) changes nothing.
    reservation_expired.send(sender=Reservation, order_ref=unpaid.ref, lines={"TEA": 2})
    reservation_expired.send(sender=Reservation, order_ref=paid.ref, lines={"TEA": 3})
    assert Order.objects.get(pk=unpaid.pk).cancelled_at == stamped
    assert (status(unpaid), status(paid), stock()) == ("expired", "paid", 7)


@pytest.mark.django_db
def test_paying_an_order_whose_reservation_expired_is_409_and_marks_it_expired(redis_client):
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    late, _ = place_order({"TEA": 2}, "lua", ttl=3600)
    looked_at, _ = place_order({"TEA": 1}, "lua", ttl=3600)
    # Expired without the shop hearing of it (a worker killed between the release
    # and the signal): the reservation is released, the orders still say pending.
    reservation_expired.disconnect(dispatch_uid="demo_shop.shop.order_expired")
    try:
        for order in (late, looked_at):
            make_due(order, redis_client)
            assert expire_reservation(order.ref) is True
    finally:
        from demo_shop.shop.expiry import order_expired

        reservation_expired.connect(order_expired, dispatch_uid="demo_shop.shop.order_expired")
    assert (status(late), status(looked_at), stock()) == ("pending", "pending", 10)

    response = Client().post(f"/api/orders/{late.pk}/pay/")
    assert response.status_code == 409
    assert response.json()["error"] == "conflict" and response.json()["status"] == "expired"
    assert status(late) == "expired"
    assert Reservation.objects.get(order_ref=late.ref).status == "released"
    again = Client().post(f"/api/orders/{late.pk}/pay/")
    assert again.status_code == 409 and again.json()["status"] == "expired"

    assert Client().get(f"/api/orders/{looked_at.pk}/").json()["status"] == "expired"
    assert status(looked_at) == "expired" and stock() == 10


@pytest.mark.django_db
def test_an_order_written_after_its_reservation_expired_is_expired(monkeypatch, redis_client):
    """The reservation expires between reserve and the order's insert: the order says so."""
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    strategy = get_strategy("lua")
    reserve = strategy.reserve

    def reserve_then_expire(ref, cart, **options):
        reservation = reserve(ref, cart, **options)
        due = redis_now(redis_client) - dt.timedelta(seconds=1)
        Reservation.objects.filter(order_ref=ref).update(expires_at=due)
        assert expire_reservation(ref) is True  # no order yet: the receiver finds none
        return reservation

    monkeypatch.setattr(strategy, "reserve", reserve_then_expire)
    monkeypatch.setattr(services, "get_strategy", lambda name=None: strategy)
    order, created = place_order({"TEA": 2}, "lua", ttl=3600)
    assert created and order.status == "expired" and status(order) == "expired"
    assert stock() == 10


# -- end to end: real Celery worker and beat -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_unpaid_order_expires_and_its_stock_returns_paid_one_is_kept(celery):
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    celery("worker", "w1")
    celery("beat", "beat")
    unpaid, _ = place_order({"TEA": 2}, "lua", ttl=1)
    paid, _ = place_order({"TEA": 3}, "lua", ttl=1)
    pay_order(paid)
    assert stock() == 5
    wait_until(lambda: status(unpaid) == "expired", what="the unpaid order to expire")
    assert stock() == 7  # the unpaid order's 2 are back, the paid order's 3 stay sold
    assert status(paid) == "paid"
    assert Reservation.objects.get(order_ref=unpaid.ref).status == "released"
    # Even an expiry item that fires for the paid order (its cancel lost) changes nothing.
    queue().schedule(EXPIRE_TASK, {"order_ref": paid.ref}, id="late")
    wait_until(lambda: queue().stats()["scheduled"] == 0, what="the late item")
    wait_until(lambda: queue().stats()["in_flight"] == 0, what="its ack")
    assert status(paid) == "paid" and stock() == 7
    assert_quiet_and_consistent()


@pytest.mark.django_db(transaction=True)
def test_worker_killed_mid_handler_leads_to_redelivery_and_one_restock(celery, redis_client):
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    order, _ = place_order({"TEA": 4}, "watch", ttl=3600)
    make_due(order, redis_client)  # due now, but within the sweeper's grace
    worker = celery("worker", "w1")
    celery("beat", "beat")
    queue().schedule("tests.expire_order_slowly", {"order_ref": order.ref}, id="slow")
    wait_until(lambda: redis_client.get(SLOW_STARTED), what="the first delivery to start")
    worker.kill()  # SIGKILL while the handler runs: no ack, no fail
    assert status(order) == "pending" and stock() == 6
    celery("worker", "w2")  # the item is delivered again once its visibility runs out
    wait_until(lambda: status(order) == "expired", what="the redelivered expiry")
    assert int(redis_client.get(SLOW_DELIVERIES)) == 2
    assert stock() == 10  # restored exactly once
    wait_until(lambda: queue().stats()["in_flight"] == 0, what="the ack")
    assert_quiet_and_consistent()


@pytest.mark.django_db(transaction=True)
def test_run_delay_queue_command_expires_an_order_as_it_falls_due():
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    order, _ = place_order({"TEA": 1}, "db_conditional", ttl=0.5)
    result = subprocess.run(
        [sys.executable, "manage.py", "run_delay_queue", "--exit-when-idle"],
        cwd=ROOT,
        env={**celery_environment(), **child_environment()},  # the demo's settings
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    assert status(order) == "expired" and stock() == 10
    assert "handled 1" in result.stdout
