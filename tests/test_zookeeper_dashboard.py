"""The admin dashboard lists ZooKeeper locks beside the Redis locks, one table per
backend alias, with the holder's metadata read from its znode."""

from __future__ import annotations

import socket

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from stock_locks import Lock
from tests.contract.support import backends_configured, backends_setting
from tests.support.processes import event, start_process
from tests.support.redis_servers import free_port
from tests.support.waiting import TIMEOUT
from tests.support.zookeeper_servers import zookeeper_backend
from tests.support.zookeeper_servers import zookeeper_server as zookeeper_server
from tests.test_dashboard import JSON, PAGE, client_for

pytestmark = pytest.mark.django_db


def _hold_on(backends: dict, alias: str, name: str, acquired, release) -> None:
    """Child: hold ``name`` on ``alias`` until told to release."""
    with backends_configured(backends), Lock(name, backend=alias, caller="shop.views.pay"):
        acquired.set()
        release.wait(TIMEOUT)


def test_zookeeper_locks_are_listed_beside_the_redis_locks(zookeeper_server):
    with backends_configured({"zk": zookeeper_backend(zookeeper_server.hosts)}):
        acquired, release = event(), event()
        holder = start_process(_hold_on, backends_setting(), "zk", "order:5", acquired, release)
        try:
            assert acquired.wait(TIMEOUT)
            redis_lock = Lock("order:6", ttl=60)
            assert redis_lock.acquire()
            client = client_for(User.objects.create_superuser("root", password="pw"))
            data = client.get(reverse(JSON)).json()
            assert [row["name"] for row in data["locks"]["rows"]] == ["order:6"]
            [zk] = data["backend_locks"]
            assert (zk["alias"], zk["total"], zk["error"]) == ("zk", 1, None)
            [row] = zk["rows"]
            assert (row["name"], row["host"], row["pid"], row["caller"]) == (
                "order:5", socket.gethostname(), str(holder.pid), "shop.views.pay",
            )  # fmt: skip
            assert row["fence"] > 0 and row["count"] == 1 and row["acquired_at"]
            assert row["lease_remaining"] is None  # session-bound: no lease
            page = client.get(reverse(PAGE)).content
            assert b'id="sl-locks-zk"' in page and b"order:5" in page and b"order:6" in page
            searched = client.get(reverse(JSON), {"q": "order:6"}).json()
            assert searched["backend_locks"][0]["rows"] == []
        finally:
            release.set()
            holder.join(TIMEOUT)
        redis_lock.release()
        assert client.get(reverse(JSON)).json()["backend_locks"][0]["total"] == 0


def test_an_unreachable_zookeeper_does_not_take_the_page_down():
    backend = zookeeper_backend(f"127.0.0.1:{free_port()}")
    backend["OPTIONS"]["CONNECT_TIMEOUT"] = 0.3
    with backends_configured({"zk": backend}):
        client = client_for(User.objects.create_superuser("root", password="pw"))
        page = client.get(reverse(PAGE))
        assert page.status_code == 200
        [zk] = client.get(reverse(JSON)).json()["backend_locks"]
        assert "no connection" in zk["error"] and zk["rows"] == []
