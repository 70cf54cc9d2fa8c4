"""What ``make demo`` serves and draws: the shop on gunicorn (several workers, the
admin's static files included, connections kept alive as in production) and the
flash sale's plot."""

from __future__ import annotations

import http.client
import json
import runpy
import time

import pytest

from demo_shop.shop.models import Product
from demo_shop.shop.plot import flash_sale_png
from stock_locks.stock.stress import StressResult
from tests.support.demo_server import get, gunicorn_demo
from tests.support.waiting import TIMEOUT


def test_the_plot_is_a_png_of_every_strategy(tmp_path):
    pytest.importorskip("matplotlib")
    results = [
        StressResult(
            strategy=name,
            attempts=1000,
            sold=100,
            refused=900,
            errors=0,
            oversold=0,
            final_stock=0,
            drift=0,
            throughput_per_s=rate,
            p50_ms=5,
            p99_ms=p99,
            retries=0,
        )  # fmt: skip
        for name, rate, p99 in [("lua", 900.0, 40.0), ("db_row_lock", 300.0, 120.0)]
    ]
    path = flash_sale_png(results, tmp_path / "sale" / "flash.png", "a test sale")
    assert path == tmp_path / "sale" / "flash.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.django_db(transaction=True)
def test_gunicorn_serves_the_shop_and_the_admins_static_files():
    pytest.importorskip("gunicorn")
    with gunicorn_demo(workers=2, threads=2) as shop:
        assert shop.log.read_text().count("Booting worker") == 2
        status, css = get(f"{shop.url}/static/admin/css/base.css")
        assert status == 200 and b"body" in css
        assert get(f"{shop.url}/admin/login/")[0] == 200


IDLE = 3  # seconds a pooled connection sits idle: longer than gunicorn's 2 s default


@pytest.mark.django_db(transaction=True)
def test_a_pooled_connection_idle_past_gunicorns_default_keep_alive_carries_the_next_post():
    """A client pool's connection (requests.Session, a load balancer's upstream) idle
    for a while is still open: the POST sent on it is answered on that connection.
    With gunicorn's 2 s default the server had closed it; the POST then failed
    (RemoteDisconnected, or a reset as the close crossed the request). The wait is
    the behaviour under test (idleness), not a synchronisation."""
    pytest.importorskip("gunicorn")
    Product.objects.create(sku="KETTLE", name="Kettle", stock=3)
    with gunicorn_demo(workers=1, threads=2) as shop:
        pooled = http.client.HTTPConnection("127.0.0.1", shop.port, timeout=TIMEOUT)
        try:
            pooled.request("GET", "/api/products/")
            reply = pooled.getresponse()
            assert reply.status == 200 and reply.getheader("Connection") != "close"
            reply.read()
            local_port = pooled.sock.getsockname()[1]
            time.sleep(IDLE)  # idle, as a pooled connection between two customers' requests
            body = json.dumps({"items": [{"sku": "KETTLE", "qty": 1}]})
            pooled.request("POST", "/api/orders/", body, {"Content-Type": "application/json"})
            reply = pooled.getresponse()
            assert reply.status == 201, reply.read()
            reply.read()
            assert pooled.sock.getsockname()[1] == local_port, "a new connection was opened"
        finally:
            pooled.close()
    assert Product.objects.get(sku="KETTLE").stock == 2


def test_the_demo_runs_gunicorn_with_a_production_keep_alive():
    """What ``manage.py demo`` passes (``-c``), read by gunicorn's own config loader."""
    pytest.importorskip("gunicorn")
    from gunicorn.config import Config

    from demo_shop.shop.management.commands.demo import GUNICORN_CONF

    config = Config()
    namespace = runpy.run_path(GUNICORN_CONF)
    for name, value in namespace.items():
        if name in config.settings:
            config.set(name, value)
    assert config.keepalive == 75  # seconds: longer than a balancer's 60 s idle timeout
    assert config.worker_class_str == "gthread"  # keep-alive applies (sync ignores it)
