"""Every strategy on one SKU at once, through the demo shop's HTTP API.

The sale and its checks are tests/faults/test_stock_mixed.py's; here buyers
place, pay and cancel orders over HTTP (the demo-only switch lets a body pick
the strategy), while an admin restocks the demo's ``Product`` mid-sale.
"""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
from django.db.models import F

from demo_shop.shop.models import Product
from tests.faults.test_stock_mixed import (
    ATTEMPTS,
    BUYERS,
    INITIAL,
    RESTOCK,
    RESTOCKS,
    SKU,
    STRATEGIES,
    _assert_sale_adds_up,
)
from tests.support.processes import run_in_processes

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]


def _restock(units: int) -> None:
    """What an admin action or a script does: a relative update outside any strategy."""
    Product.objects.filter(sku=SKU).update(stock=F("stock") + units)


def _mixed_http_buyer(index: int, attempts: int) -> dict[str, int]:
    from django.conf import settings
    from django.test import Client

    logging.getLogger("django.request").setLevel(logging.ERROR)  # 409s are expected here
    # The body may pick the strategy only under the demo-only switch (this process only).
    settings.SHOP_STRATEGY_FROM_REQUEST = True
    client = Client()
    tally: Counter[str] = Counter()
    for n in range(attempts):
        name = STRATEGIES[(index + n) % len(STRATEGIES)]
        body = {"items": [{"sku": SKU, "qty": 1}], "strategy": name}
        response = client.post("/api/orders/", json.dumps(body), content_type="application/json")
        if response.status_code == 201:
            placed = response.json()
            assert placed["strategy"] == name, "the shop did not use the strategy asked for"
            action = "cancel" if n % 3 == 0 else "pay"
            done = client.post(f"/api/orders/{placed['order']}/{action}/")
            assert done.status_code == 200, (action, done.status_code, done.content)
            tally["released" if action == "cancel" else "sold"] += 1
        elif response.status_code == 409 and response.json()["error"] == "out_of_stock":
            tally["refused"] += 1
        else:
            tally[f"http {response.status_code}"] += 1
        if index == 0 and n % 10 == 5 and tally["restocked"] < RESTOCK * RESTOCKS:
            _restock(RESTOCK)
            tally["restocked"] += RESTOCK
    return dict(tally)


def test_every_strategy_on_one_sku_over_http_sells_what_exists():
    # The strategy is the server's; the demo-only SHOP_STRATEGY_FROM_REQUEST lets the
    # body pick it, which is how this drives all five at one SKU through the views.
    Product.objects.create(sku=SKU, name="Mixed", stock=INITIAL)
    tallies = run_in_processes(_mixed_http_buyer, BUYERS, ATTEMPTS)
    _assert_sale_adds_up(tallies)
    unexpected = {k: v for t in tallies for k, v in t.items() if k.startswith("http")}
    assert unexpected == {}
