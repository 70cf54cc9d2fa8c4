"""What ``make demo`` serves and draws: the shop on gunicorn (several workers, the
admin's static files included) and the flash sale's plot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from demo_shop.shop.plot import flash_sale_png
from stock_locks.stock.stress import StressResult
from tests.support.processes import child_environment
from tests.support.redis_servers import free_port
from tests.support.waiting import TIMEOUT, wait_until

ROOT = Path(__file__).resolve().parents[2]


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


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as reply:
        return reply.code, reply.read()


@pytest.mark.django_db(transaction=True)
def test_gunicorn_serves_the_shop_and_the_admins_static_files():
    pytest.importorskip("gunicorn")
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="sl-demo-")) / "gunicorn.log"
    env = {**os.environ, **child_environment(), "PYTHONPATH": str(ROOT)}  # the test's db
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "demo_shop.wsgi:application", "--workers", "2",
             "--threads", "2", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                return _get(f"{base}/api/products/")[0] == 200
            except OSError:
                return False

        wait_until(up, what="gunicorn to serve the shop")
        assert log.read_text().count("Booting worker") == 2
        status, css = _get(f"{base}/static/admin/css/base.css")
        assert status == 200 and b"body" in css
        assert _get(f"{base}/admin/login/")[0] == 200
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=TIMEOUT)
