"""The admin dashboard: permissions, what it shows, and its audited operator actions."""

from __future__ import annotations

import asyncio
import logging
import os
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse

from stock_locks import DelayQueue, Lock, Semaphore, aio, scripts
from stock_locks.backends.redis import registry
from stock_locks.backends.redis.protocol import acquire_argv, acquire_keys, holder_argv
from stock_locks.dashboard import delay_queues, semaphores
from stock_locks.exceptions import LockNotOwned, StaleFencingToken
from stock_locks.fencing import fenced_update
from stock_locks.keys import DELAY_QUEUES, SEMAPHORES, StockKeys, lock_keys, registry_key
from stock_locks.models import AuditEntry
from tests.inventory.models import Item
from tests.support import csp
from tests.support.lock_state import last_fence
from tests.support.processes import event, start_process
from tests.support.redis_stats import commandstats, redis_ms
from tests.support.served_page import ServedPage
from tests.support.waiting import TIMEOUT, wait_until

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
        Item.objects.create(code="TEA", title="Tea", on_hand=5)
        redis_client.set(StockKeys().counter("TEA"), 9)  # changed behind the app's back
        client = client_for(User.objects.create_superuser("root", password="pw"))
        data = client.get(reverse(JSON)).json()
        [lock] = data["locks"]["rows"]
        assert (lock["name"], lock["pid"], lock["watchdog"]) == ("order:77", str(holder.pid), True)
        assert lock["fence"] == last_fence(redis_client, lock_keys("order:77").lock)
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
            "in_flight": 0,
            "drift": 4,
            "settled": True,
            "sold": 0,
            "of": 5,
            "taken": 0.0,
            "capped": 0,
        }
        page = client.get(reverse(PAGE)).content
        assert b"order:77" in page and b"exports" in page
    finally:
        release.set()
        holder.join(TIMEOUT)


def seed_locks(redis_client, names, ttl_ms=300_000) -> None:
    """Grant each lock of ``names`` to a token of its own, as Lock.acquire would."""
    pipe = redis_client.pipeline(transaction=False)
    holder = holder_argv("tests.seed", False)
    for n, name in enumerate(names):
        keys = acquire_keys(lock_keys(name))
        argv = acquire_argv(f"{n:032x}", ttl_ms, 0, holder, False)
        pipe.evalsha(scripts.LOCK_ACQUIRE.sha, len(keys), *keys, *argv)
    redis_client.script_load(scripts.LOCK_ACQUIRE.script)
    pipe.execute()


def test_ten_thousand_locks_are_listed_one_page_at_a_time(redis_client):
    seed_locks(redis_client, [f"cart:{n:05d}" for n in range(10_000)])
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
    assert "cmdstat_keys" not in stats
    assert client.get(reverse(PAGE)).status_code == 200


def test_the_lock_list_reads_the_held_locks_not_the_keyspace(redis_client):
    from stock_locks.dashboard import lock_page

    pipe = redis_client.pipeline(transaction=False)
    for n in range(50_000):  # unrelated keys, some looking like lock keys
        pipe.set(f"sl:lock:{{other:{n}}}:fence" if n % 2 else f"app:{n}", 1)
    pipe.execute()
    seed_locks(redis_client, ["order:1", "order:2", "}hostile{", "100%"])
    redis_client.config_resetstat()
    page = lock_page()
    assert page["total"] == 4
    assert [row["name"] for row in page["rows"]] == ["100%", "order:1", "order:2", "}hostile{"]
    stats = {k: v for k, v in commandstats(redis_client).items() if "config" not in k}
    assert "cmdstat_scan" not in stats and "cmdstat_keys" not in stats
    # One round trip for the names in use (index + clock), one for their records (a
    # released lock stays in the index a while), one for the rows shown.
    assert stats == {
        "cmdstat_time": 1, "cmdstat_zrange": 1, "cmdstat_get": 8, "cmdstat_pttl": 4,
    }  # fmt: skip


def _hold_permit_and_schedule(acquired, release) -> None:
    DelayQueue("invoices").schedule("tests.send_invoice", {"order": 1}, delay=600)
    with Semaphore("exports", limit=2, ttl=120):
        acquired.set()
        release.wait(TIMEOUT)


def test_semaphores_and_queues_of_another_process_are_listed_without_a_scan(redis_client):
    pipe = redis_client.pipeline(transaction=False)
    for n in range(30_000):  # unrelated keys, some looking like semaphore and queue keys
        kind = n % 3
        pipe.set(f"sl:sem:{{other:{n}}}" if kind == 0 else
                 f"sl:dq:{{other:{n}}}:items" if kind == 1 else f"app:{n}", 1)  # fmt: skip
    pipe.execute()
    acquired, release = event(), event()
    holder = start_process(_hold_permit_and_schedule, acquired, release)
    try:
        assert acquired.wait(TIMEOUT)
        redis_client.config_resetstat()
        [row] = semaphores()
        assert (row["name"], row["limit"], row["waiting"]) == ("exports", 2, 0)
        assert [h["pid"] for h in row["holders"]] == [str(holder.pid)]
        queues = {queue["name"]: queue for queue in delay_queues()}
        assert sorted(queues) == ["default", "invoices"]  # DELAY_QUEUES, and the one used
        assert queues["invoices"]["scheduled"] == 1
        stats = commandstats(redis_client)
        assert "cmdstat_scan" not in stats and "cmdstat_keys" not in stats
    finally:
        release.set()
        holder.join(TIMEOUT)
    assert semaphores() == []  # used lately, idle now: left out


def test_a_name_unused_for_longer_than_the_retention_is_no_longer_listed(redis_client):
    permit = Semaphore("nightly", limit=1, ttl=60)
    permit.acquire()
    queue = DelayQueue("reports")
    queue.schedule("tests.report", delay=600)
    assert [row["name"] for row in semaphores()] == ["nightly"]
    assert [row["name"] for row in delay_queues()] == ["default", "reports"]
    # Their last use a retention ago (staged on the Redis clock: past scores).
    long_ago = redis_ms(redis_client) - registry.REGISTRY_RETENTION * 1000 - 1
    for kind, name in ((SEMAPHORES, "nightly"), (DELAY_QUEUES, "reports")):
        redis_client.zadd(registry_key(kind), {name: long_ago, f"{name}:gone": long_ago})
    assert semaphores() == []
    assert [row["name"] for row in delay_queues()] == ["default"]
    # Their next use after a period lists them again (staged: this process forgets
    # when it registered them), and drops what is older than the retention.
    registry.forget()
    permit.refresh()
    queue.schedule("tests.report", delay=600)
    assert [row["name"] for row in semaphores()] == ["nightly"]
    assert [row["name"] for row in delay_queues()] == ["default", "reports"]
    for kind, name in ((SEMAPHORES, "nightly"), (DELAY_QUEUES, "reports")):
        assert redis_client.zrange(registry_key(kind), 0, -1) == [name.encode()]
        assert 0 < redis_client.ttl(registry_key(kind)) <= registry.REGISTRY_RETENTION


def test_a_process_registers_a_name_once_a_period(redis_client):
    redis_client.config_resetstat()
    for _ in range(20):
        with Semaphore("exports", limit=1, ttl=60):
            pass
        DelayQueue("reports").schedule("tests.report", delay=600)
    # 20 grants, releases and schedules; one registration of each name.
    assert commandstats(redis_client)["cmdstat_evalsha"] == 60 + 2
    assert redis_client.zrange(registry_key(SEMAPHORES), 0, -1) == [b"exports"]


def test_a_registry_that_cannot_be_written_fails_no_grant_and_no_schedule(redis_client, caplog):
    for kind in (SEMAPHORES, DELAY_QUEUES):
        redis_client.set(registry_key(kind), "not a sorted set")  # every ZADD on it fails

    async def acquire_async() -> None:
        async with aio.Semaphore("aio-exports", limit=1, ttl=60) as permit:
            assert [h["identifier"] for h in await permit.holders()] == [permit.id]

    with caplog.at_level(logging.DEBUG, logger="stock_locks.registry"):
        with Semaphore("exports", limit=1, ttl=60) as permit:
            assert [h["identifier"] for h in permit.holders()] == [permit.id]
        asyncio.run(acquire_async())
        queue = DelayQueue("reports")
        queue.schedule("tests.report", id="r1")
        assert [item.id for item in queue.claim()] == ["r1"]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "sem 'exports'", "sem 'aio-exports'", "dq 'reports'",
    ]  # fmt: skip
    assert all("WRONGTYPE" in r.getMessage() for r in caplog.records)


def test_a_lapsed_or_released_lock_drops_out_of_the_list(redis_client):
    from stock_locks.dashboard import lock_page
    from stock_locks.keys import lock_index_key

    held, released = Lock("held", ttl=60), Lock("released", ttl=60)
    held.acquire()
    released.acquire()
    released.release()
    seed_locks(redis_client, ["crashed"])
    assert [row["name"] for row in lock_page()["rows"]] == ["crashed", "held"]
    # The crashed holder's lease ends (stage it on the Redis clock: a past score).
    redis_client.zadd(lock_index_key(), {"sl:lock:{crashed}": 1})
    redis_client.pexpire(lock_keys("crashed").lock, 1)
    page = lock_page()
    assert page["total"] == 1 and [row["name"] for row in page["rows"]] == ["held"]
    # Grants now and then prune lapsed entries: the index does not keep them.
    another = Lock("another", ttl=60)

    def pruned() -> bool:
        with another:
            return redis_client.zscore(lock_index_key(), "sl:lock:{crashed}") is None

    wait_until(pruned, what="the lapsed entry pruned by a grant")
    assert [row["name"] for row in lock_page()["rows"]] == ["held"]
    held.release()
    assert lock_page()["total"] == 0


# -- the served page: complete without JavaScript, nothing inline ----------------------


def seed_every_section(redis_client) -> dict:
    """A held lock, a semaphore holder, a delay queue with a dead letter, a drifting SKU."""
    lock = Lock("order:9", ttl=60, caller="tests.checkout")
    lock.acquire()
    permit = Semaphore("exports", limit=3, ttl=60, caller="tests.export")
    permit.acquire()
    queue = DelayQueue("default", max_attempts=1)  # a missing handler: dead at once
    queue.schedule("no.such.task", {"n": 1}, id="lost & found")
    queue.schedule("no.such.task", {"n": 2}, id="later", delay=600)
    queue.drain()
    Item.objects.create(code="TEA", title="Tea", on_hand=5)
    redis_client.set(StockKeys().counter("TEA"), 9)
    return {"lock": lock, "permit": permit}


def links(row) -> dict[str, str]:
    """A table row's links: text -> href."""
    return {link["text"]: link["attrs"]["href"] for cell in row["cells"] for link in cell["links"]}


def test_the_served_page_renders_every_table_and_links_each_action(redis_client):
    seeded = seed_every_section(redis_client)
    lock, permit = seeded["lock"], seeded["permit"]
    client = client_for(User.objects.create_superuser("root", password="pw"))
    page = ServedPage(client.get(reverse(PAGE)).content.decode())

    [row] = page.rows("sl-locks")
    cells = [cell["text"] for cell in row["cells"]]
    assert row["attrs"]["data-lock"] == "order:9"
    assert cells[0] == "order:9" and f" / {os.getpid()} / " in cells[1]
    assert cells[2:6] == ["tests.checkout", f"{lock.token[:8]}…", str(lock.fence), "1"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells[6])  # acquired, UTC
    assert 50 < float(cells[7]) <= 60 and cells[8] == "off"
    assert page.text("sl-lock-total") == "1" and page.text("sl-lock-pages") == ""
    release = links(row)["Force release"]

    [row] = page.rows("sl-semaphores")
    assert row["attrs"]["data-semaphore"] == "exports"
    assert [cell["text"] for cell in row["cells"]][:2] == ["exports", "3"]
    evict = links(row)["Evict"]

    [row] = page.rows("sl-queues")
    assert [cell["text"] for cell in row["cells"]][:5] == ["default", "0", "1", "0", "1"]
    [row] = page.rows("sl-dead")
    assert row["attrs"]["data-dead"] == "lost & found"
    assert [cell["text"] for cell in row["cells"]][1:4] == ["lost & found", "no.such.task", "1"]
    requeue, discard = links(row)["Requeue"], links(row)["Discard"]

    [row] = page.rows("sl-stock")
    assert row["attrs"] == {"data-sku": "TEA", "class": "sl-drift"}
    assert [cell["text"] for cell in row["cells"]] == [
        "TEA", "0 of 5 sold, 0 reserved", "5", "9", "0", "0", "4", "0"
    ]  # fmt: skip
    assert page.text("sl-drifting") == "1"
    reconcile = page.by_id["sl-reconcile"]["attrs"]["href"]

    # Each link opens its confirm page, ready to act on exactly what the row showed.
    expected = {
        release: ("release_lock", {"name": "order:9", "token": lock.token}),
        evict: ("evict_holder", {"name": "exports", "holder": permit.id}),
        requeue: ("requeue", {"queue": "default", "id": "lost & found"}),
        discard: ("discard", {"queue": "default", "id": "lost & found"}),
        reconcile: ("reconcile", {}),
    }
    for href, (action, params) in expected.items():
        assert href.startswith(action_url(action))
        confirm = client.get(href)
        assert confirm.status_code == 200 and b"Yes, I" in confirm.content, href
        for name, value in params.items():
            assert re.search(
                rf'name="{name}" value="{re.escape(value)}"'.encode(),
                confirm.content.replace(b"&amp;", b"&"),
            )
    lock.release()
    permit.release()


def test_the_served_page_has_nothing_inline_under_a_strict_policy(redis_client, settings):
    seed_every_section(redis_client)
    settings.MIDDLEWARE = csp.with_strict_csp(settings.MIDDLEWARE)
    client = client_for(User.objects.create_superuser("root", password="pw"))
    response = client.get(reverse(PAGE))
    assert response["Content-Security-Policy"] == csp.POLICY
    page = ServedPage(response.content.decode())
    assert page.inline == []
    assert (static("stock_locks/dashboard.js"), True) in page.scripts  # deferred
    assert static("stock_locks/dashboard.css") in page.stylesheets
    assert finders.find("stock_locks/dashboard.js") and finders.find("stock_locks/dashboard.css")
    for action, params in [
        ("release_lock", {"name": "order:9"}),
        ("evict_holder", {"name": "exports", "holder": "x"}),
        ("requeue", {"queue": "default", "id": "lost & found"}),
        ("reconcile", {}),
    ]:
        assert ServedPage(client.get(action_url(action), params).content.decode()).inline == []


def test_the_held_locks_pages_are_links_on_the_served_page(redis_client):
    seed_locks(redis_client, [f"cart:{n:03d}" for n in range(205)])
    client = client_for(User.objects.create_superuser("root", password="pw"))
    first = ServedPage(client.get(reverse(PAGE)).content.decode())
    assert first.text("sl-lock-pages") == "page 1 of 3 next ›"
    assert [link["attrs"]["href"] for link in first.by_id["sl-lock-pages"]["links"]] == ["?page=2"]
    assert [row["attrs"]["data-lock"] for row in first.rows("sl-locks")][::99] == [
        "cart:000", "cart:099",
    ]  # fmt: skip
    last = ServedPage(client.get(reverse(PAGE), {"page": 3}).content.decode())
    assert last.text("sl-lock-pages") == "page 3 of 3 ‹ previous"
    assert [row["attrs"]["data-lock"] for row in last.rows("sl-locks")] == [
        "cart:200", "cart:201", "cart:202", "cart:203", "cart:204",
    ]  # fmt: skip
    found = ServedPage(client.get(reverse(PAGE), {"q": "cart:", "page": 2}).content.decode())
    assert found.text("sl-lock-pages") == "page 2 of 3 ‹ previous next ›"
    assert [link["attrs"]["href"] for link in found.by_id["sl-lock-pages"]["links"]] == [
        "?q=cart%3A&page=1", "?q=cart%3A&page=3",
    ]  # fmt: skip
    none = ServedPage(client.get(reverse(PAGE), {"q": "no such lock"}).content.decode())
    assert [row["cells"][0]["text"] for row in none.rows("sl-locks")] == [
        "No held lock matches the search."
    ]


# -- actions and what they displace ------------------------------------------------------


def test_force_released_holder_cannot_write_through_a_fenced_update(redis_client):
    item = Item.objects.create(code="KETTLE", title="Kettle", on_hand=5)
    stuck = Lock("inventory.item:KETTLE", ttl=300)
    stuck.acquire()
    client = client_for(User.objects.create_superuser("root", password="pw"))
    client.post(
        action_url("release_lock"),
        {"name": "inventory.item:KETTLE", "token": stuck.token, "confirm": "yes"},
    )
    with Lock("inventory.item:KETTLE", ttl=30, timeout=0) as newer:
        assert newer.fence > stuck.fence
        fenced_update(Item.objects.filter(pk=item.pk), newer.fence, on_hand=4)
    # The old holder wakes up and writes with its (older) fence: refused.
    with pytest.raises(StaleFencingToken):
        fenced_update(Item.objects.filter(pk=item.pk), stuck.fence, on_hand=0)
    assert Item.objects.get(pk=item.pk).on_hand == 4
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

    queue = DelayQueue("default", max_attempts=1)  # a missing handler: dead at once
    queue.schedule("no.such.task", {"n": 1}, id="lost-1")
    queue.schedule("no.such.task", {"n": 2}, id="lost-2")
    queue.drain()
    client.post(action_url("requeue"), {"queue": "default", "id": "lost-1", "confirm": "yes"})
    client.post(action_url("discard"), {"queue": "default", "id": "lost-2", "confirm": "yes"})
    stats = queue.stats()
    assert (stats["due_now"], stats["dead"]) == (1, 0)

    Item.objects.create(code="TEA", title="Tea", on_hand=5)
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


def test_the_lock_list_on_a_cluster_shows_hostile_names(redis_factory):
    from redis.cluster import RedisCluster

    from stock_locks.dashboard import lock_page

    server = redis_factory("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    server.client().execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    wait_until(lambda: server.client().cluster("info")["cluster_state"] == "ok", what="cluster")
    cluster = RedisCluster(host="127.0.0.1", port=server.port)
    locks = [Lock(name, ttl=60, redis=cluster) for name in ("}x", "{a}b", "order:42", "gone")]
    for lock in locks:
        lock.acquire()
    locks[-1].release()
    page = lock_page(client=cluster)
    assert page["total"] == 3
    assert [(row["name"], row["fence"]) for row in page["rows"]] == [
        ("order:42", locks[2].fence), ("{a}b", locks[1].fence), ("}x", locks[0].fence),
    ]  # fmt: skip
    cluster.close()
