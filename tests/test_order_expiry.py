"""Unpaid orders expire through the delay queue, with a real Celery worker and beat."""

from __future__ import annotations

import subprocess
import sys

import pytest

from demo_shop.shop.models import Order, Product
from demo_shop.shop.services import pay_order, place_order
from stock_locks import DelayQueue
from stock_locks.stock.reconcile import stock_report
from tests.support.celery_handlers import SLOW_DELIVERIES, SLOW_STARTED
from tests.support.celery_processes import ROOT, CeleryProcess, celery_environment
from tests.support.processes import child_environment
from tests.support.waiting import TIMEOUT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def celery():
    """Start a worker and a beat draining every 0.2 s, with a 2 s visibility timeout."""
    env = celery_environment(DELAY_QUEUE_INTERVAL="0.2", DELAY_QUEUE_VISIBILITY="2")
    started: list[CeleryProcess] = []

    def start(kind: str, name: str) -> CeleryProcess:
        started.append(CeleryProcess(kind, name, env).start())
        return started[-1]

    yield start
    for process in started:
        process.stop()


def status(order: Order) -> str:
    return Order.objects.get(pk=order.pk).status


def stock() -> int:
    return Product.objects.get(sku="TEA").stock


def assert_quiet_and_consistent() -> None:
    stats = DelayQueue("default").stats()
    assert (stats["in_flight"], stats["dead"]) == (0, 0)
    assert [row.drift for row in stock_report()] == [0]


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
    # Even an expiry item that fires for the paid order (its cancel lost) changes nothing.
    DelayQueue("default").schedule("shop.expire_order", {"order": paid.pk}, id="late")
    wait_until(lambda: DelayQueue("default").stats()["scheduled"] == 0, what="the late item")
    wait_until(lambda: DelayQueue("default").stats()["in_flight"] == 0, what="its ack")
    assert status(paid) == "paid" and stock() == 7
    assert_quiet_and_consistent()


def test_worker_killed_mid_handler_leads_to_redelivery_and_one_restock(celery, redis_client):
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    order, _ = place_order({"TEA": 4}, "watch", ttl=3600)
    worker = celery("worker", "w1")
    celery("beat", "beat")
    DelayQueue("default").schedule("tests.expire_order_slowly", {"order": order.pk}, id="slow")
    wait_until(lambda: redis_client.get(SLOW_STARTED), what="the first delivery to start")
    worker.kill()  # SIGKILL while the handler runs: no ack, no fail
    assert status(order) == "pending" and stock() == 6
    celery("worker", "w2")  # the item is delivered again once its visibility runs out
    wait_until(lambda: status(order) == "expired", what="the redelivered expiry")
    assert int(redis_client.get(SLOW_DELIVERIES)) == 2
    assert stock() == 10  # restored exactly once
    wait_until(lambda: DelayQueue("default").stats()["in_flight"] == 0, what="the ack")
    assert_quiet_and_consistent()


def test_run_delay_queue_command_expires_an_order_as_it_falls_due():
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    order, _ = place_order({"TEA": 1}, "db_conditional", ttl=0.5)
    result = subprocess.run(
        [sys.executable, "manage.py", "run_delay_queue", "--exit-when-idle"],
        cwd=ROOT,
        env={
            **celery_environment(),
            **child_environment(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        },
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    assert status(order) == "expired" and stock() == 10
    assert "handled 1" in result.stdout
