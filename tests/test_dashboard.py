"""The admin dashboard: permissions, what it shows, and its audited operator actions."""

from __future__ import annotations

import os
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from demo_shop.shop.models import Product
from stock_locks import DelayQueue, Lock, Semaphore, scripts
from stock_locks.exceptions import LockNotOwned, StaleFencingToken
from stock_locks.fencing import fenced_update
from stock_locks.keys import StockKeys, lock_keys
from stock_locks.locks import acquire_argv, holder_argv
from stock_locks.models import AuditEntry
from tests.support.processes import event, start_process
from tests.support.waiting import TIMEOUT

pytestmark = pytest.mark.django_db

PAGE = "admin:stock_locks_dashboard"
JSON = "admin:stock_locks_dashboard_json"


def action_url(action: str) -> str:
    return reverse("admin:stock_locks_dashboard_action", args=[action])


def user(name: str, *permissions: str, staff: bool = True) -> User:
    account = User.objects.create_user(name, password="pw", is_staff=staff)
    for codename in permissions:
        account.user_permissions.add(Permission.objects.get(codename=codename))
    return account


def client_for(account: User, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(account)
    return client


def csrf_token_of(response) -> str:
    return (
        re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', response.content)
        .group(1)
        .decode()
    )


# -- who may see and do what ---------------------------------------------------------


def test_anonymous_is_sent_to_the_login_page():
    client = Client()
    for url in (reverse(PAGE), reverse(JSON), action_url("release_lock")):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_staff_without_permission_gets_403_and_non_staff_the_login_page():
    client = client_for(user("clerk"))
    for url in (reverse(PAGE), reverse(JSON), action_url("release_lock")):
        assert client.get(url).status_code == 403
    assert client.post(action_url("reconcile"), {"confirm": "yes"}).status_code == 403
    outsider = client_for(user("customer", "view_dashboard", "force_release", staff=False))
    assert outsider.get(reverse(PAGE)).status_code == 302


def test_view_permission_shows_the_page_without_action_buttons():
    Lock("order:1", ttl=60).acquire()
    client = client_for(user("watcher", "view_dashboard"))
    page = client.get(reverse(PAGE))
    assert page.status_code == 200
    assert b"order:1" in page.content
    assert b"data-action-url" not in page.content and b"/actions/" not in page.content
    assert client.get(reverse(JSON)).json()["locks"]["total"] == 1
    assert client.get(action_url("release_lock"), {"name": "order:1"}).status_code == 403
    assert client.post(action_url("release_lock"), {"name": "order:1"}).status_code == 403
    assert Lock("order:1").locked()
    index = client.get(reverse("admin:index"))
    assert reverse(PAGE).encode() in index.content  # linked from the admin index


def test_force_permission_acts_after_confirmation_and_post_needs_csrf(redis_client):
    held = Lock("order:2", ttl=60)
    held.acquire()
    operator = user("operator", "view_dashboard", "force_release")
    client = client_for(operator, csrf=True)
    assert b"data-action-url" in client.get(reverse(PAGE)).content
    confirm = client.get(action_url("release_lock"), {"name": "order:2"})
    assert confirm.status_code == 200 and b"Yes, I" in confirm.content
    assert held.locked()  # a GET never acts
    form = {"name": "order:2", "token": held.token, "confirm": "yes"}
    assert client.post(action_url("release_lock"), form).status_code == 403  # no CSRF token
    assert held.locked()
    form["csrfmiddlewaretoken"] = csrf_token_of(confirm)
    response = client.post(action_url("release_lock"), form)
    assert response.status_code == 302 and response["Location"] == reverse(PAGE)
    assert not held.locked()
    entry = AuditEntry.objects.get()
    assert (entry.user, entry.action, entry.target) == (operator, "release_lock", "order:2")
    assert entry.displaced["token"] == held.token[:8]  # a prefix: the token is a credential
    assert entry.displaced["fence"] == str(held.fence)
    assert "force-released" in entry.outcome


# -- what it shows -------------------------------------------------------------------


def _hold(name: str, acquired, release) -> None:
    with Lock(name, ttl=120, watchdog=True):
        acquired.set()
        release.wait(TIMEOUT)


def test_shows_a_lock_held_by_another_process_a_semaphore_holder_and_drift(redis_client):
    acquired, release = event(), event()
    holder = start_process(_hold, "order:77", acquired, release)
    try:
        assert acquired.wait(TIMEOUT)
        permit = Semaphore("exports", limit=3, ttl=60)
        permit.acquire()
        Product.objects.create(sku="TEA", name="Tea", stock=5)
        redis_client.set(StockKeys().counter("TEA"), 9)  # changed behind the app's back
        client = client_for(User.objects.create_superuser("root", password="pw"))
        data = client.get(reverse(JSON)).json()
        [lock] = data["locks"]["rows"]
        assert (lock["name"], lock["pid"], lock["watchdog"]) == ("order:77", str(holder.pid), True)
        assert lock["fence"] == int(redis_client.get(lock_keys("order:77").fence))
        assert 100 < lock["lease_remaining"] <= 120 and lock["acquired_at"]
        [sem] = data["semaphores"]
        assert (sem["name"], sem["limit"]) == ("exports", 3)
        assert sem["holders"][0]["pid"] == str(os.getpid()) and sem["holders"][0]["remaining"] > 50
        assert data["stock"]["drifting"] == 1
        assert data["stock"]["rows"][0] == {
            "sku": "TEA",
            "db": 5,
            "redis": 9,
            "reserved": 0,
            "drift": 4,
        }
        page = client.get(reverse(PAGE)).content
        assert b"order:77" in page and b"exports" in page
    finally:
        release.set()
        holder.join(TIMEOUT)


def test_ten_thousand_locks_are_listed_with_scan_one_page_at_a_time(redis_client):
    keys = [lock_keys(f"cart:{n:05d}") for n in range(10_000)]
    pipe = redis_client.pipeline(transaction=False)
    holder = holder_argv("tests.seed", False)
    for n, k in enumerate(keys):
        argv = acquire_argv(f"{n:032x}", 300_000, 0, holder, False)
        pipe.evalsha(scripts.LOCK_ACQUIRE.sha, 3, k.lock, k.fence, k.holder, *argv)
    redis_client.script_load(scripts.LOCK_ACQUIRE.script)
    pipe.execute()
    client = client_for(User.objects.create_superuser("root", password="pw"))
    redis_client.config_resetstat()
    first = client.get(reverse(JSON)).json()["locks"]
    assert first["total"] == 10_000 and len(first["rows"]) == first["page_size"] == 100
    assert first["rows"][0]["name"] == "cart:00000"
    last = client.get(reverse(JSON), {"page": 100}).json()["locks"]
    assert last["rows"][-1]["name"] == "cart:09999"
    found = client.get(reverse(JSON), {"q": "cart:0042"}).json()["locks"]
    assert [row["name"] for row in found["rows"]] == [f"cart:0042{d}" for d in range(10)]
    stats = redis_client.info("commandstats")
    assert "cmdstat_keys" not in stats and stats["cmdstat_scan"]["calls"] > 10
    assert client.get(reverse(PAGE)).status_code == 200


# -- actions and what they displace ------------------------------------------------------


def test_force_released_holder_cannot_write_through_a_fenced_update(redis_client):
    product = Product.objects.create(sku="KETTLE", name="Kettle", stock=5)
    stuck = Lock("shop.product:KETTLE", ttl=300)
    stuck.acquire()
    client = client_for(User.objects.create_superuser("root", password="pw"))
    client.post(
        action_url("release_lock"),
        {"name": "shop.product:KETTLE", "token": stuck.token, "confirm": "yes"},
    )
    with Lock("shop.product:KETTLE", ttl=30, timeout=0) as newer:
        assert newer.fence > stuck.fence
        fenced_update(Product.objects.filter(pk=product.pk), newer.fence, stock=4)
    # The old holder wakes up and writes with its (older) fence: refused.
    with pytest.raises(StaleFencingToken):
        fenced_update(Product.objects.filter(pk=product.pk), stuck.fence, stock=0)
    assert Product.objects.get(pk=product.pk).stock == 4
    with pytest.raises(LockNotOwned):
        stuck.release()


def test_a_lock_that_changed_hands_after_confirmation_is_left_alone():
    first = Lock("order:5", ttl=60)
    first.acquire()
    seen_token = first.token
    first.release()
    second = Lock("order:5", ttl=60)
    second.acquire()  # a new holder took it after the operator confirmed
    client = client_for(User.objects.create_superuser("root", password="pw"))
    client.post(
        action_url("release_lock"), {"name": "order:5", "token": seen_token, "confirm": "yes"}
    )
    assert second.owned()
    assert "nothing released" in AuditEntry.objects.get().outcome


def test_evict_requeue_discard_and_reconcile_are_audited(redis_client):
    client = client_for(User.objects.create_superuser("root", password="pw"))
    permit = Semaphore("exports", limit=1, ttl=60)
    permit.acquire()
    client.post(
        action_url("evict_holder"), {"name": "exports", "holder": permit.id, "confirm": "yes"}
    )
    assert Semaphore("exports", limit=1, ttl=60, timeout=0).acquire()  # the permit is free
    with pytest.raises(LockNotOwned):
        permit.refresh()

    queue = DelayQueue("default")
    queue.schedule("no.such.task", {"n": 1}, id="lost-1")
    queue.schedule("no.such.task", {"n": 2}, id="lost-2")
    queue.drain()
    client.post(action_url("requeue"), {"queue": "default", "id": "lost-1", "confirm": "yes"})
    client.post(action_url("discard"), {"queue": "default", "id": "lost-2", "confirm": "yes"})
    stats = queue.stats()
    assert (stats["due_now"], stats["dead"]) == (1, 0)

    Product.objects.create(sku="TEA", name="Tea", stock=5)
    redis_client.set(StockKeys().counter("TEA"), 2)
    client.post(action_url("reconcile"), {"confirm": "yes"})
    assert redis_client.get(StockKeys().counter("TEA")) == b"5"

    entries = {entry.action: entry for entry in AuditEntry.objects.all()}
    assert set(entries) == {"evict_holder", "requeue", "discard", "reconcile"}
    assert entries["evict_holder"].displaced["identifier"] == permit.id
    assert entries["discard"].displaced["task"] == "no.such.task"
    assert entries["reconcile"].displaced["drifting"][0]["sku"] == "TEA"


def test_audit_log_is_read_only_in_the_admin():
    client = client_for(User.objects.create_superuser("root", password="pw"))
    AuditEntry.objects.create(username="x", action="reconcile", target="all SKUs", outcome="ok")
    changelist = client.get(reverse("admin:stock_locks_auditentry_changelist"))
    assert changelist.status_code == 200 and b"reconcile" in changelist.content
    assert client.get(reverse("admin:stock_locks_auditentry_add")).status_code == 403
