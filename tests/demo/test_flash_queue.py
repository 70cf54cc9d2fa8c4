"""The demo's flash sale through the waiting room, over HTTP on gunicorn: more buyers
than the shop serves at once, admitted in arrival order within each lane, nothing
oversold, and the rest told "sold out" while waiting."""

from __future__ import annotations

import pytest

from demo_shop.shop.flash_queue import run_sale
from demo_shop.shop.models import Product
from stock_locks.waitingroom import queue
from tests.support.demo_server import gunicorn_demo


@pytest.mark.django_db(transaction=True)
def test_the_flash_sale_through_the_waiting_room():
    pytest.importorskip("gunicorn")
    queue.forget_seen()  # (Redis was flushed: this process saw no room state)
    with gunicorn_demo(workers=2, threads=4) as shop:
        report = run_sale(shop.url, buyers=40, stock=10, max_active=3, admit_per_minute=6000)
    outcomes = [buyer.outcome for buyer in report.buyers]
    assert report.sold == 10 and report.oversold == 0 and report.left == 0
    assert Product.objects.get(sku="TOASTER").stock == 0
    assert outcomes.count("ordered") == 10
    # The others were told "sold out" while waiting, or admitted as the last units went
    # (the units left are read before the step, while admitted buyers order).
    assert set(outcomes) <= {"ordered", "sold_out", "out_of_stock"}
    assert outcomes.count("out_of_stock") <= 3  # at most one room-full
    assert report.in_order == {"members": True, "guests": True}
    members = [b for b in report.buyers if b.lane == "members" and b.outcome == "ordered"]
    assert members  # the first lane goes first: its 10 buyers are ahead of every guest
