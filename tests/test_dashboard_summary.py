"""The dashboard's first screen: the summary strip, the sale's progress per SKU, the
processes' heartbeats, the history window, and the same figures as Prometheus gauges.

Figures come from what real processes did: reservations and refusals through
the strategies, a reserve against a stopped Redis, a stale fenced write, a
Celery worker and beat started as subprocesses, a web request served in
another OS process.
"""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from stock_locks import DelayQueue, Lock, Semaphore, metrics
from stock_locks.exceptions import OutOfStock, RedisUnavailable, StaleFencingToken
from stock_locks.fencing import fenced_update
from stock_locks.keys import StockKeys, heartbeats_key
from stock_locks.stock import get_strategy
from stock_locks.stock.reconcile import sync_counters
from tests.conftest import _default_cache_at as default_cache_at
from tests.inventory.models import Item
from tests.support.celery_processes import CeleryProcess, celery_environment
from tests.support.processes import event, start_process
from tests.support.waiting import TIMEOUT, wait_until
from tests.test_dashboard import client_for

pytestmark = pytest.mark.django_db(transaction=True)  # subprocesses read what we write

PAGE = "admin:stock_locks_dashboard"
JSON = "admin:stock_locks_dashboard_json"
TOKEN = "scrape-me"


@pytest.fixture
def root() -> Client:
    return client_for(User.objects.create_superuser("root", password="pw"))


@pytest.fixture(autouse=True)
def fresh_metrics():
    metrics.reset()
    yield
    metrics.reset()


def summary_of(client: Client, **query: str) -> dict:
    return client.get(reverse(JSON), query).json()


def test_the_strip_counts_sales_refusals_and_errors_by_type(root, redis_client, redis_factory):
    Item.objects.create(code="KETTLE", title="Kettle", on_hand=3)
    lua = get_strategy("lua")
    sold = refused = 0
    for n, qty in enumerate([2, 1, 1, 1]):
        try:
            lua.reserve(f"order-{n}", {"KETTLE": qty})
            sold += 1
        except OutOfStock:
            refused += 1
    assert (sold, refused) == (2, 2)
    # A stale fenced write: a newer grant wrote first.
    with Lock("inventory.item:KETTLE", ttl=30) as older:
        pass
    with Lock("inventory.item:KETTLE", ttl=30) as newer:
        fenced_update(Item.objects.filter(code="KETTLE"), newer.fence, title="Kettle 2")
    with pytest.raises(StaleFencingToken):
        fenced_update(Item.objects.filter(code="KETTLE"), older.fence, title="stale")
    # A reserve with Redis gone: 'unavailable', nothing written.
    gone = redis_factory()
    # Everything so far to our Redis now: this process's flusher thread must have
    # nothing to write to the other server while the test points at it.
    assert metrics.flush()
    with default_cache_at(gone.url):
        gone.stop()
        with pytest.raises(RedisUnavailable):
            get_strategy("lua").reserve("order-down", {"KETTLE": 1})
    assert Item.objects.get(code="KETTLE").on_hand == 0  # 3 sold of 3; nothing else moved
    assert metrics.flush()

    figures = summary_of(root)["summary"]
    assert (figures["units"], figures["reservations"], figures["refused"]) == (3, 2, 2)
    assert figures["errors"] == {
        "unavailable": 1, "database": 0, "deadlock": 0, "stale_fence": 1, "cap": 0
    }  # fmt: skip
    assert figures["window"] == 300
    page = root.get(reverse(PAGE)).content.decode()
    strip = re.search(r'<div class="sl-summary" id="sl-summary">(.*?)\n  </div>', page, re.S)
    assert strip, "the summary strip is at the top of the page"
    assert page.index('id="sl-summary"') < page.index('id="sl-stock"') < page.index("sl-charts")
    assert re.search(r'id="sl-sum-units">3<', strip.group(1))
    assert re.search(r'class="sl-error">unavailable <b>1</b>', strip.group(1))
    assert re.search(r'class="sl-error">stale fence <b>1</b>', strip.group(1))


def test_the_strip_shows_locks_permits_the_oldest_due_item_and_drift(root, redis_client):
    Item.objects.create(code="MUG", title="Mug", on_hand=4)
    sync_counters(["MUG"])
    redis_client.incrby(StockKeys().counter("MUG"), 2)  # drift, behind the app's back
    queue = DelayQueue("default")
    queue.schedule("shop.expire_order", {"order": 1}, delay=0)
    with Lock("order:1", ttl=30), Semaphore("exports", limit=3, ttl=30):
        wait_until(lambda: queue.stats()["oldest_due_age"], what="the item to be overdue")
        figures = summary_of(root)["summary"]
    assert figures["held_locks"] == 1
    assert figures["semaphores"] == {"held": 1, "limit": 3, "waiting": 0}
    assert figures["delay"]["due"] == 1 and figures["delay"]["oldest_due_age"] > 0
    assert figures["drifting"] == 1


def test_progress_per_sku_counts_paid_open_and_left_and_sorts(root):
    for code, on_hand in [("A-TEAPOT", 10), ("B-MUG", 10), ("C-CUP", 10)]:
        Item.objects.create(code=code, title=code, on_hand=on_hand)
    lua = get_strategy("lua")
    sync_counters()
    for n in range(6):
        lua.reserve(f"mug-{n}", {"B-MUG": 1})
    for n in range(4):
        lua.commit(f"mug-{n}")
    lua.reserve("cup-0", {"C-CUP": 3})
    lua.commit("cup-0")

    rows = summary_of(root, order="sold")["stock"]["rows"]
    assert [(r["sku"], r["sold"], r["reserved"], r["db"], r["of"]) for r in rows] == [
        ("B-MUG", 4, 2, 4, 10),
        ("C-CUP", 3, 0, 7, 10),
        ("A-TEAPOT", 0, 0, 10, 10),
    ]
    assert [r["sku"] for r in summary_of(root, order="sku")["stock"]["rows"]] == [
        "A-TEAPOT", "B-MUG", "C-CUP"
    ]  # fmt: skip
    assert summary_of(root, order="nonsense")["stock"]["order"] == "drift"
    page = root.get(reverse(PAGE), {"order": "sold"}).content.decode()
    assert "4 of 10 sold, 2 reserved" in page
    assert re.search(r'<progress max="10" value="6"></progress>', page)
    # The header links keep the other choices (JavaScript off: sorting is a link).
    assert (
        'href="?window=1h&amp;order=sku"'
        in root.get(reverse(PAGE), {"order": "sold", "window": "1h"}).content.decode()
    )


def test_an_hour_of_history_reads_ten_second_buckets(root, redis_client):
    metrics.reserved("lua", True, 0)
    assert metrics.flush(redis_client)
    data = summary_of(root, window="1h")
    assert data["summary"]["window"] == 3600 and data["summary"]["reservations"] == 1
    assert "-50 min" in {c["id"]: c for c in data["charts"]}["reservations"]["svg"]
    assert summary_of(root, window="2y")["summary"]["window"] == 300  # unknown: the default


def serve_one_request(served, done) -> None:  # runs in another OS process
    """Answer one request as a web process does (Django's handler), then wait."""
    Client().get("/no-such-page/")
    served.set()
    done.wait(TIMEOUT)


def test_heartbeats_of_web_worker_beat_and_drainer_processes(root, redis_client, redis_server):
    served, done = event(), event()
    web = start_process(serve_one_request, served, done)
    env = celery_environment(DELAY_QUEUE_INTERVAL="0.2")
    worker = CeleryProcess("worker", "hb-worker", env).start()
    beat = CeleryProcess("beat", "hb-beat", env).start()
    try:
        assert served.wait(TIMEOUT)
        pids = {"web": web.pid, "worker": worker.process.pid, "beat": beat.process.pid}

        def roles_alive() -> dict[str, set[str]] | None:
            seen: dict[str, set[str]] = {}
            for process in summary_of(root)["processes"]:
                if process["alive"]:
                    seen.setdefault(process["role"], set()).add(process["pid"])
            wanted = {role: str(pid) for role, pid in pids.items()}
            found = all(pid in seen.get(role, ()) for role, pid in wanted.items())
            return seen if found and str(worker.process.pid) in seen.get("drainer", ()) else None

        wait_until(roles_alive, what="web, worker, beat and drainer heartbeats")
        counts = summary_of(root)["summary"]["processes"]
        assert all(counts[role]["alive"] >= 1 for role in ("web", "worker", "beat", "drainer"))
    finally:
        done.set()
        worker.stop()
        beat.stop()
        web.join(TIMEOUT)

    # A process not seen for a while is shown silent; after an hour it is forgotten.
    now_ms = int(redis_client.time()[0]) * 1000
    redis_client.hset(heartbeats_key(), "web|gone-host|1", now_ms - 60_000)
    redis_client.hset(heartbeats_key(), "web|long-gone|2", now_ms - 7_200_000)
    processes = {p["host"]: p for p in summary_of(root)["processes"]}
    assert processes["gone-host"]["alive"] is False and processes["gone-host"]["age"] >= 60
    assert "long-gone" not in processes
    assert not redis_client.hexists(heartbeats_key(), "web|long-gone|2")
    page = root.get(reverse(PAGE)).content.decode()
    assert re.search(r'class="sl-silent" data-process="web\|gone-host\|1"', page)


def test_prometheus_serves_the_same_figures_as_gauges(root, client, redis_client):
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    redis_client.set(StockKeys().counter("TEA"), 9)
    metrics.announce("web")
    assert metrics.flush(redis_client)
    with Lock("order:9", ttl=30), Semaphore("exports", limit=2, ttl=30):
        with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "METRICS_TOKEN": TOKEN}):
            body = client.get(
                "/stock-locks/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
            ).content.decode()
        figures = summary_of(root)["summary"]
    gauges = dict(re.findall(r"^(stock_locks_[a-z_]+) ([0-9.e+-]+)$", body, re.M))
    assert float(gauges["stock_locks_held_locks"]) == figures["held_locks"] == 1
    assert float(gauges["stock_locks_semaphore_permits_held"]) == figures["semaphores"]["held"]
    assert float(gauges["stock_locks_stock_drifting_skus"]) == figures["drifting"] == 1
    assert float(gauges["stock_locks_delay_due"]) == figures["delay"]["due"] == 0
    assert re.search(
        r'^stock_locks_heartbeat_age_seconds\{role="web",host="[^"]+",pid="\d+"\} [0-9.]+$',
        body,
        re.M,
    )
