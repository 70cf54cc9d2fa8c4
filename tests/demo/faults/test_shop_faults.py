"""The shop's pay and cancel when a Redis reply is lost after the work was done.

The Django test client in this process talks to stock_locks through a
:class:`FaultProxy` in front of the suite's redis-server. The proxy lets the
chosen EVALSHA (picked by its script's SHA) run on the server and drops its
reply. With django-redis's defaults the caller gets a ConnectionError; with
redis-py retries configured (``retried``) the request runs again on a new
connection, so a release or commit arrives twice (a lock release then finds
its lock gone: LockNotOwned). What must hold,
counted from the database: a paid order answers 200 and is paid once; a
cancelled order answers 200 and its units are back exactly once; a retry of
either changes nothing.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client, override_settings

from demo_shop.shop.models import Order, Product
from stock_locks import scripts
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from tests.support.fault_proxy import FaultProxy
from tests.support.lock_state import held

ORDERS = "/api/orders/"


def place(strategy: str, qty: int = 2) -> dict:
    body = {"items": [{"sku": "TEA", "qty": qty}]}
    with override_settings(SHOP_STRATEGY=strategy):
        response = Client().post(ORDERS, json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


def stock() -> int:
    return Product.objects.get(sku="TEA").stock


def arm(proxy: FaultProxy, redis_client, script) -> None:
    """Lose the reply of the next EVALSHA of ``script``, which must run.

    The script is loaded first: an EVALSHA answered NOSCRIPT did not run, and
    losing that answer would stage nothing.
    """
    redis_client.script_load(script.script)
    proxy.lose_reply(script.sha.encode())


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("strategy", "script", "retries"),
    [
        ("lua", scripts.LOCK_RELEASE, 0),  # the view's order lock: ConnectionError
        ("db_conditional", scripts.LOCK_RELEASE, 3),  # the retry finds it gone: LockNotOwned
        ("lua", scripts.STOCK_COMMIT, 0),
        ("lua", scripts.STOCK_COMMIT, 3),
    ],
    ids=[
        "order-lock-release",
        "order-lock-release-retried",
        "stock-commit",
        "stock-commit-retried",
    ],
)
def test_pay_whose_reply_is_lost_answers_200_and_pays_once(
    redis_through_proxy, redis_client, caplog, strategy, script, retries
):
    proxy = redis_through_proxy(retries)
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    placed = place(strategy)
    caplog.set_level(logging.WARNING, logger="stock_locks")

    arm(proxy, redis_client, script)
    response = Client().post(f"{ORDERS}{placed['order']}/pay/")
    assert proxy.lost == 1  # the fault fired

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "paid"
    retried = Client().post(f"{ORDERS}{placed['order']}/pay/")
    assert retried.status_code == 200 and retried.json()["status"] == "paid"

    assert Order.objects.get().status == "paid"
    assert Reservation.objects.get().status == "committed"
    assert stock() == 8  # sold once, not twice, nothing given back
    if script is scripts.LOCK_RELEASE:  # the repeated release knew it had worked: no warning
        assert [r.getMessage() for r in caplog.records if r.name.endswith(".release")] == []
    assert not held(redis_client, f"sl:lock:{{order:{placed['order']}}}")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("strategy", "script", "retries"),
    [
        ("lua", scripts.STOCK_RELEASE, 0),  # the database released; Redis "unreachable"
        ("lua", scripts.STOCK_RELEASE, 3),  # the retry finds its record gone: no double
        ("lock", scripts.LOCK_RELEASE, 0),  # the SKU lock around the release's database step
        ("lock", scripts.LOCK_RELEASE, 3),
        ("db_row_lock", scripts.LOCK_RELEASE, 0),  # the view's order lock
        ("db_row_lock", scripts.LOCK_RELEASE, 3),
    ],
    ids=[
        "lua-stock-release",
        "lua-stock-release-retried",
        "lock-sku-lock-release",
        "lock-sku-lock-release-retried",
        "db_row_lock-order-lock-release",
        "db_row_lock-order-lock-release-retried",
    ],
)
def test_cancel_whose_reply_is_lost_answers_200_and_restocks_once(
    redis_through_proxy, redis_client, strategy, script, retries
):
    proxy = redis_through_proxy(retries)
    Product.objects.create(sku="TEA", name="Tea", stock=10)
    placed = place(strategy)
    assert stock() == 8

    arm(proxy, redis_client, script)
    response = Client().post(f"{ORDERS}{placed['order']}/cancel/")
    assert proxy.lost == 1

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert Order.objects.get().status == "cancelled"
    assert Reservation.objects.get().status == "released"
    assert stock() == 10  # back exactly once

    retried = Client().post(f"{ORDERS}{placed['order']}/cancel/")
    assert retried.status_code == 200 and retried.json()["status"] == "cancelled"
    assert stock() == 10
    if strategy == "lua":  # the release script ran once on the server: Redis agrees
        assert redis_client.get(StockKeys().counter("TEA")) == b"10"
