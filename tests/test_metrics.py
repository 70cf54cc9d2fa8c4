"""Metrics: recorded where things are decided, served to Prometheus behind a token,
summed across processes (gunicorn workers, and the per-second timeline in Redis),
and the signals a project hooks its alerting to."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from stock_locks import Lock, metrics
from stock_locks.dashboard import timeline
from stock_locks.exceptions import LockNotOwned, OutOfStock
from stock_locks.signals import lock_lost, stock_refused
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.processes import run_in_processes
from tests.support.redis_servers import listening_socket
from tests.support.waiting import TIMEOUT, wait_until

ROOT = Path(__file__).resolve().parent.parent
TOKEN = settings.STOCK_LOCKS["METRICS_TOKEN"]


@pytest.fixture(autouse=True)
def fresh_figures() -> Iterator[None]:
    metrics.reset()
    yield
    metrics.reset()


def counter(name: str, labels: str) -> float:
    return metrics.snapshot()["counters"].get(name, {}).get(labels, 0)


def test_acquires_are_counted_by_outcome_and_a_lost_lease_is_signalled(redis_client):
    lost: list[dict] = []

    def on_lost(sender, signal, **kwargs):
        lost.append(kwargs)

    holder = Lock("metrics:a", ttl=30)
    assert holder.acquire()
    assert not Lock("metrics:a", timeout=0).acquire()
    assert counter("lock_acquisitions", "lock,default,granted") == 1
    assert counter("lock_acquisitions", "lock,default,timeout") == 1
    waits = metrics.snapshot()["histograms"]["lock_wait"]["lock,default"]
    assert waits["count"] == 2

    redis_client.delete(holder.keys.lock)  # someone force-released it
    lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockNotOwned):
            holder.release()
    finally:
        lock_lost.disconnect(on_lost)
    assert lost == [{"primitive": "lock", "backend": "default", "name": "metrics:a"}]
    assert counter("leases_lost", "lock,default") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["lua", "db_conditional"])
def test_reservations_and_refusals_are_counted_and_a_refusal_is_signalled(strategy):
    refusals: list[dict] = []

    def on_refused(sender, signal, **kwargs):
        refusals.append(kwargs)

    Item.objects.create(code="TEA", title="tea", on_hand=1)
    chosen = get_strategy(strategy)
    chosen.reserve("one", {"TEA": 1})
    chosen.reserve("one", {"TEA": 1})  # a repeat: nothing new
    stock_refused.connect(on_refused)
    try:
        with pytest.raises(OutOfStock):
            chosen.reserve("two", {"TEA": 1})
    finally:
        stock_refused.disconnect(on_refused)
    assert counter("reservations", strategy) == 1
    assert counter("refusals", strategy) == 1
    assert refusals == [
        {"strategy": strategy, "order_ref": "two", "sku": "TEA", "requested": 1, "available": 0}
    ]


@pytest.mark.django_db
def test_the_scrape_endpoint_wants_the_token(client):
    Lock("metrics:b").acquire()
    assert client.get("/stock-locks/metrics").status_code == 401
    wrong = client.get("/stock-locks/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = client.get("/stock-locks/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert ok["Content-Type"].startswith("text/plain")
    body = ok.content.decode()
    assert re.search(
        r'stock_locks_lock_acquisitions_total\{backend="default",outcome="granted",'
        r'primitive="lock"\} [1-9]',
        body,
    ) or re.search(r'stock_locks_lock_acquisitions_total\{primitive="lock",backend="default",'
                   r'outcome="granted"\} [1-9]', body), body  # fmt: skip
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "METRICS_TOKEN": None}):
        assert client.get("/stock-locks/metrics").status_code == 404


# -- the timeline: every process's figures on the Redis clock -----------------------


def _buy_and_flush(index: int, attempts: int) -> dict[str, int]:
    chosen = get_strategy("lua")
    outcome = {"sold": 0, "refused": 0}
    for n in range(attempts):
        try:
            chosen.reserve(f"tl-{index}-{n}", {"HOT": 1})
            outcome["sold"] += 1
        except OutOfStock:
            outcome["refused"] += 1
    assert metrics.flush()
    return outcome


@pytest.mark.django_db(transaction=True)
def test_the_timeline_sums_every_processs_figures():
    Item.objects.create(code="HOT", title="hot", on_hand=30)
    outcomes = run_in_processes(_buy_and_flush, 4, 25)
    recent = timeline.recent(120)
    assert len(recent.series[timeline.DEAD_LETTERS]) == 120
    sold = sum(v or 0 for v in recent.series[timeline.RESERVATIONS + "lua"])
    refused = sum(v or 0 for v in recent.series[timeline.REFUSALS + "lua"])
    assert (
        (sold, refused)
        == (
            sum(o["sold"] for o in outcomes),
            sum(o["refused"] for o in outcomes),
        )
        == (30, 70)
    )
    assert recent.names(timeline.RESERVATIONS) == [timeline.RESERVATIONS + "lua"]


def _waits(index: int, fast: int, slow: int) -> int:
    for _ in range(fast):
        metrics.lock_acquired("lock", "default", "granted", 0.0005)
    for _ in range(slow):
        metrics.lock_acquired("lock", "default", "granted", 4.0)
    return metrics.add_to_timeline(dict(metrics._pending))  # this process's deltas, now


def test_the_p99_comes_from_the_merged_histograms_not_from_each_process():
    # One process waited 200 times ~0.5 ms, another once 4 s: over both, the p99 is
    # fast (the slow wait is 1 in 201); each process's own p99 would say 1 ms and 5 s.
    seconds = run_in_processes(_waits, 2, 0, 0)  # (warm up the children's imports)
    fast_second, slow_second = (
        run_in_processes(_waits, 1, 200, 0)[0],
        run_in_processes(_waits, 1, 0, 1)[0],
    )
    assert seconds
    recent = timeline.recent(60)
    p99 = recent.series[timeline.LOCK_WAIT_P99_MS]
    at = {second: p99[second - recent.start] for second in (fast_second, slow_second)}
    if fast_second == slow_second:  # both in one bucket: merged
        assert at[fast_second] == 1
    else:  # one second apart: each bucket has its own
        assert (at[fast_second], at[slow_second]) == (1, 5000)


# -- prometheus-client under gunicorn: every worker's figures in one scrape ---------


class Gunicorn:
    """``gunicorn --workers 2`` on the suite's settings, prometheus-client in multiprocess mode."""

    def __init__(self, redis_url: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="sl-gunicorn-")
        self.metrics_dir = Path(self.dir) / "prometheus"
        self.metrics_dir.mkdir()
        self.log = Path(self.dir) / "log"
        listener = listening_socket()
        self.port = listener.getsockname()[1]
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "REDIS_URL": redis_url,
            "PYTHONPATH": str(ROOT),
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
        }
        with listener, open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "gunicorn", "--workers", "2",
                    "--bind", f"fd://{listener.fileno()}",
                    "django.core.wsgi:get_wsgi_application()",
                ],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=[listener.fileno()],
            )  # fmt: skip
        wait_until(
            lambda: self.output().count("Booting worker") >= 2 or self.process.poll() is not None,
            what="gunicorn's workers to boot",
        )
        assert self.process.poll() is None, self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def get(self, path: str, headers: dict[str, str] | None = None) -> bytes:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers=headers or {}
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT) as reply:
            return reply.read()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _answering(server: Gunicorn) -> bool:
    try:
        server.get("/stock-locks/metrics", {"Authorization": f"Bearer {TOKEN}"})
        return True
    except (urllib.error.URLError, ConnectionError):
        return False


def _pid(body: bytes) -> int:
    found = re.search(rb'"pid": (\d+)', body)
    assert found, body
    return int(found.group(1))


def test_a_scrape_under_gunicorn_counts_every_workers_acquires(redis_server):
    pytest.importorskip("prometheus_client")
    pytest.importorskip("gunicorn")
    server = Gunicorn(redis_server.url)
    try:
        wait_until(lambda: _answering(server), what="gunicorn to answer")
        client = redis.Redis.from_url(redis_server.url)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(server.get, "/whoami/?hold=w")  # one worker answers and stays busy
            assert client.blpop(["w:busy"], timeout=TIMEOUT), "no worker took the held request"
            other = server.get("/whoami/")  # so the other worker must answer this one
            client.rpush("w:go", 1)
            pids = {_pid(held.result(timeout=TIMEOUT)), _pid(other)}
        requests = 2
        assert len(pids) == 2, pids
        body = server.get("/stock-locks/metrics", {"Authorization": f"Bearer {TOKEN}"}).decode()
    finally:
        server.stop()
    granted = re.search(
        r'stock_locks_lock_acquisitions_total\{[^}]*outcome="granted"[^}]*\} ([0-9.e+]+)', body
    )
    assert granted, body
    assert float(granted.group(1)) == requests
