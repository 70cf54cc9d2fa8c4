"""Redis restarted empty mid-sale, the sale going through the demo shop's HTTP API.

The sale and its fault are tests/faults/test_stock_redis_loss.py's; here the
buyers place, pay and cancel orders over HTTP (every strategy, by the
demo-only switch), and afterwards every order agrees with its reservation.
"""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest

from demo_shop.shop.models import Order, Product
from stock_locks.models import Reservation
from tests.faults.test_stock_redis_loss import (
    INITIAL,
    MAX_ATTEMPTS,
    SKU,
    STRATEGIES,
    TTL,
    assert_quiet_and_whole,
    kill_and_restart_empty,
    sale_with,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]


def rush_product() -> None:
    Product.objects.create(sku=SKU, name="Rush", stock=INITIAL)


def _http_buyer(index: int, stop, outage) -> dict[str, int]:
    from django.conf import settings
    from django.test import Client

    logging.getLogger("django.request").setLevel(logging.CRITICAL)  # 409s and 503s expected
    settings.ORDER_TTL = TTL
    settings.SHOP_STRATEGY_FROM_REQUEST = True  # demo-only: every strategy over HTTP
    client = Client(raise_request_exception=False)
    tally: Counter[str] = Counter()
    for n in range(MAX_ATTEMPTS):
        if stop.is_set():
            break
        name = STRATEGIES[(index + n) % len(STRATEGIES)]
        body = {"items": [{"sku": SKU, "qty": 1}], "strategy": name}
        placed = client.post("/api/orders/", json.dumps(body), content_type="application/json")
        if placed.status_code != 201:
            if placed.status_code == 503:
                outage.set()
            tally[f"order {placed.status_code}"] += 1
            continue
        tally["reserved"] += 1
        order = placed.json()["order"]
        if n % 3 < 2:
            action = "pay" if n % 3 == 0 else "cancel"
            done = client.post(f"/api/orders/{order}/{action}/")
            if done.status_code == 503:
                outage.set()
            tally[f"{action} {done.status_code}"] += 1
    return dict(tally)


def test_redis_restarted_empty_mid_sale_over_http_strands_no_order(redis):
    tallies = sale_with(_http_buyer, kill_and_restart_empty(redis), rush_product)
    met = sum(v for t in tallies for k, v in t.items() if k.endswith(" 503"))
    assert met, f"no buyer met the outage: {tallies}"
    errors = {k: v for t in tallies for k, v in t.items() if k.endswith("500")}
    assert errors == {}, tallies
    assert_quiet_and_whole(tallies)
    assert_orders_match_reservations()


def assert_orders_match_reservations() -> None:
    """An order is paid iff its reservation is committed, and no order is left pending."""
    statuses = dict(Reservation.objects.values_list("order_ref", "status"))
    expected = {
        Order.Status.PAID: Reservation.Status.COMMITTED,
        Order.Status.CANCELLED: Reservation.Status.RELEASED,
        Order.Status.EXPIRED: Reservation.Status.RELEASED,
    }
    mismatched = [
        (ref, status, statuses.get(ref))
        for ref, status in Order.objects.values_list("ref", "status")
        if expected.get(status) != statuses.get(ref)
    ]
    assert mismatched == [], f"{len(mismatched)} orders disagree with their reservation"
