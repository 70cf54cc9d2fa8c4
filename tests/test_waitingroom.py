"""The waiting room (stock_locks.waitingroom): FIFO per lane, one ticket per visitor,
passes, self-healing, sold out, the decorator and the status endpoint.

Every scenario runs on the suite's real redis-server; concurrency is real OS
processes. Time passing is staged by writing state (a poll time set in the past),
never by sleeping.
"""

from __future__ import annotations

import datetime as dt
import random
import time

import pytest
from asgiref.sync import async_to_sync
from django.core import signing
from django.test import override_settings

from stock_locks.conf import settings as sl_settings
from stock_locks.exceptions import ExpiredPass, InvalidPass
from stock_locks.keys import StockKeys
from stock_locks.models import Event
from stock_locks.waitingroom import RoomSpec, WaitingRoom, check_pass, issue_pass, queue, remaining
from stock_locks.waitingroom import events as room_events
from stock_locks.waitingroom.passes import SALT
from tests.support.processes import run_in_processes

PAST = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
FUTURE = dt.datetime(2099, 1, 1, tzinfo=dt.UTC)


def room(slug: str = "sale", **changes) -> WaitingRoom:
    values = dict(slug=slug, start=PAST, max_active=1_000, admit_per_minute=60_000)
    values.update(changes)
    return WaitingRoom(RoomSpec(**values))


@pytest.fixture(autouse=True)
def _fresh_caches():
    room_events.forget()
    remaining.forget()
    queue.forget_seen()  # (Redis is flushed before each test: no state was seen)
    yield
    room_events.forget()
    remaining.forget()


def _admit_one_by_one(slug: str, lanes: int = 2) -> list[int]:
    """Drain the room one admission at a time (max_active 1, each admitted visitor
    leaving at once); the tickets in the order they were admitted."""
    one = room(slug, max_active=1)
    order = []
    while one.admit(remaining=-1):
        (ticket,) = one.backend.client.zrange(one.keys.active, 0, -1)
        info = one.backend.client.hget(one.keys.tickets, ticket).decode()
        assert one.leave(info.split(":", 2)[2])
        order.append(int(ticket))
    return order


# -- the queue ----------------------------------------------------------------------


def _join_many(index: int, slug: str, count: int) -> list[tuple[str, int]]:  # in a child
    # Admission is closed (no unit left) while everyone joins: the lanes keep them all.
    waiting = room(slug)
    joined = []
    for i in range(count):
        lane = "members" if i % 3 == 0 else "guests"
        status = waiting.visit(f"p{index}-v{i}", lane=lane, remaining=0)
        assert status.state == "sold_out", status
        joined.append((lane, status.ticket))
    return joined


def test_fifo_per_lane_across_processes(redis_client):
    per_process = run_in_processes(_join_many, 4, "fifo", 60)
    joined = [entry for entries in per_process for entry in entries]
    for entries in per_process:  # each process's arrivals keep their order
        tickets = [ticket for _, ticket in entries]
        assert tickets == sorted(tickets)
    assert len({ticket for _, ticket in joined}) == 240
    members = sorted(t for lane, t in joined if lane == "members")
    guests = sorted(t for lane, t in joined if lane == "guests")
    keys = room("fifo").keys
    assert [int(t) for t in redis_client.lrange(keys.lanes[0], 0, -1)] == members
    assert [int(t) for t in redis_client.lrange(keys.lanes[1], 0, -1)] == guests
    # Admission: every member before any guest, each lane in arrival order.
    assert _admit_one_by_one("fifo") == members + guests
    assert room("fifo").admitted_log() == members + guests


def test_position_counts_own_lane_and_the_lanes_above():
    waiting = room("pos")
    for i in range(3):
        waiting.visit(f"g{i}", lane="guests", remaining=0)
    for i in range(2):
        waiting.visit(f"m{i}", lane="members", remaining=0)
    assert waiting.visit("g2", remaining=0).ahead == 2 + 2  # two guests before, two members
    assert waiting.visit("m1", lane="members", remaining=0).ahead == 1
    # A visitor keeps the lane it joined in.
    assert waiting.visit("g0", lane="members", remaining=0).ahead == 2


def _duplicate_joins(index: int, slug: str, visitors: list[str]) -> dict[str, int]:  # child
    order = list(visitors)
    random.Random(index).shuffle(order)
    waiting = room(slug, max_active=5)
    return {visitor: waiting.visit(visitor).ticket for visitor in order}


def test_one_ticket_per_visitor_under_concurrent_duplicate_joins(redis_client):
    visitors = [f"v{i}" for i in range(50)]
    results = run_in_processes(_duplicate_joins, 4, "dup", visitors)
    for result in results[1:]:
        assert result == results[0]
    assert sorted(results[0].values()) == list(range(1, 51))
    keys = room("dup").keys
    assert redis_client.hlen(keys.visitors) == 50
    in_lists = sum(redis_client.llen(lane) for lane in keys.lanes)
    assert in_lists + redis_client.zcard(keys.active) == 50
    assert redis_client.zcard(keys.active) == 5  # max_active, never more


def test_prequeue_is_shuffled_once_at_the_start_then_fifo(redis_client):
    before = room("pre", start=FUTURE)
    statuses = [before.visit(f"early{i}", lane="guests") for i in range(40)]
    assert {s.state for s in statuses} == {"waiting"} and all(s.prequeue for s in statuses)
    assert statuses[0].starts_in > 0
    started = room("pre")
    late = started.visit("late", lane="guests", remaining=0)  # the first visit after the start
    drawn = [int(t) for t in redis_client.lrange(started.keys.lanes[1], 0, -1)]
    early = [s.ticket for s in statuses]
    assert sorted(drawn[:40]) == early and drawn[40:] == [late.ticket]  # the late one last
    assert drawn[:40] != early  # shuffled (the arrival order by chance: 1 in 40!)
    assert started.visit("early0", remaining=0).ahead == drawn.index(statuses[0].ticket)
    started.admit(remaining=0)  # the draw is done once: nothing moves
    assert [int(t) for t in redis_client.lrange(started.keys.lanes[1], 0, -1)] == drawn


def test_not_open_before_the_prequeue_opens():
    early = room("closed", start=FUTURE, prequeue_opens=FUTURE - dt.timedelta(days=1))
    status = early.visit("v")
    assert status.state == "not_open" and status.ticket == 0 and status.starts_in > 0


# -- admission limits ---------------------------------------------------------------


def test_admission_keeps_max_active_and_the_rate(redis_client):
    limited = room("rate", max_active=3, admit_per_minute=120)  # a bucket of 2 tokens
    states = [limited.visit(f"v{i}").state for i in range(6)]
    assert states == ["admitted", "admitted", "waiting", "waiting", "waiting", "waiting"]
    assert redis_client.zcard(limited.keys.active) == 2
    # A repeated step (a lost reply, another process) admits nobody twice nor past limits.
    for _ in range(5):
        limited.admit(remaining=-1)
    assert redis_client.zcard(limited.keys.active) <= 3


def test_units_left_times_the_factor_bounds_admission(redis_client):
    limited = room("factor", max_active=100, stock_factor=1.5)
    states = [limited.visit(f"v{i}", remaining=2).state for i in range(5)]
    assert states.count("admitted") == 3  # floor(2 * 1.5)


def test_repeated_scripts_give_the_same_ticket_and_admit_once(redis_client):
    from stock_locks import scripts

    limited = room("repeat", max_active=2)
    args = ["v1", 2, 1, 0, *limited._limits(-1)]
    first = scripts.WAITINGROOM_VISIT(limited.keys.script_keys(), args, client=redis_client)
    second = scripts.WAITINGROOM_VISIT(limited.keys.script_keys(), args, client=redis_client)
    assert first[1] == second[1] == 1
    assert first[0] == second[0] == 2  # admitted, once
    assert redis_client.zcard(limited.keys.active) == 1
    assert redis_client.hget(limited.keys.state, "admitted") == b"1"


# -- self-healing -------------------------------------------------------------------


def test_abandoned_visitors_do_not_stall_the_queue(redis_client):
    flow = room("heal", max_active=10, queue_ttl=60)
    visitors = [f"v{i}" for i in range(100)]
    tickets = {v: flow.visit(v, remaining=0).ticket for v in visitors}
    gone = set(random.Random(7).sample(visitors, 30))
    for visitor in gone:  # their last poll is long past queue_ttl
        redis_client.zadd(flow.keys.polled, {tickets[visitor]: 0})
    admitted: list[str] = []
    for _round in range(100):
        for visitor in visitors:
            if visitor in gone or visitor in admitted:
                continue
            if flow.visit(visitor, remaining=1000).state == "admitted":
                admitted.append(visitor)
                flow.leave(visitor)  # paid: the slot goes to the next at once
        if len(admitted) == 70:
            break
    assert len(admitted) == 70
    assert [tickets[v] for v in admitted] == sorted(tickets[v] for v in admitted)
    stats = flow.stats()
    assert stats.abandoned_waiting == 30 and stats.admitted == 0 and stats.left == 70


def test_an_admitted_visitor_silent_past_session_ttl_frees_its_slot(redis_client):
    flow = room("session", max_active=1, session_ttl=60)
    assert flow.visit("a").state == "admitted"
    assert flow.visit("b").state == "waiting"
    redis_client.zadd(flow.keys.active, {1: 0})  # a's last request: long ago
    assert flow.visit("b").state == "admitted"
    assert flow.stats().abandoned_admitted == 1
    assert flow.visit("a").ticket == 3  # it lost its place: a new ticket at the end


def test_an_admitted_visitor_back_after_session_ttl_has_lost_its_slot(redis_client):
    flow = room("late", max_active=1, session_ttl=60)
    assert flow.visit("a").state == "admitted"
    redis_client.zadd(flow.keys.active, {1: 0})  # silent for long; no step swept it yet
    again = flow.visit("a")
    assert again.ticket == 2 and again.state == "admitted"  # a new place, the free slot
    assert flow.stats().abandoned_admitted == 1


def test_a_silent_waiting_visitor_loses_its_place(redis_client):
    flow = room("place", queue_ttl=60)
    first = flow.visit("a", remaining=0)
    redis_client.zadd(flow.keys.polled, {first.ticket: 0})
    assert flow.visit("a", remaining=0).ticket != first.ticket


# -- sold out -----------------------------------------------------------------------


def test_sold_out_closes_the_room_and_reopening_keeps_the_order(redis_client):
    counters = StockKeys()
    redis_client.set(counters.counter("KETTLE"), 0)
    sale = room("soldout", skus=("KETTLE",), max_active=1)
    with override_settings(STOCK_LOCKS={**_user_settings(), "WAITING_ROOM_STOCK_INTERVAL": 0}):
        statuses = [sale.visit(f"v{i}") for i in range(5)]
        assert {s.state for s in statuses} == {"sold_out"}
        assert sale.admit() == 0 and sale.stats().sold_out
        redis_client.set(counters.counter("KETTLE"), 3)  # an expired order gave units back
        order = []
        for _ in range(5):
            assert sale.admit() == 1 or order
            for ticket in redis_client.zrange(sale.keys.active, 0, -1):
                order.append(int(ticket))
                sale.leave(f"v{int(ticket) - 1}")
        assert order == [s.ticket for s in statuses]
        assert not sale.stats().sold_out


def _user_settings() -> dict:
    from django.conf import settings

    return dict(settings.STOCK_LOCKS)


# -- passes -------------------------------------------------------------------------


def test_a_pass_is_bound_to_its_event_its_session_and_its_age():
    token = issue_pass("sale", "session-a", 7, 1234)
    admission = check_pass(token, "sale", "session-a", max_age=60)
    assert (admission.ticket, admission.born) == (7, 1234)
    with pytest.raises(InvalidPass):
        check_pass(token, "sale", "session-b", max_age=60)  # another session
    with pytest.raises(InvalidPass):
        check_pass(token, "other-sale", "session-a", max_age=60)  # another event
    forged = token.replace("7.1234", "8.1234")
    with pytest.raises(InvalidPass):
        check_pass(forged, "sale", "session-a", max_age=60)
    old = signing.Signer(salt=f"{SALT}:sale:session-a").sign(f"7.1234.{int(time.time()) - 61}")
    with pytest.raises(ExpiredPass):
        check_pass(old, "sale", "session-a", max_age=60)
    with pytest.raises(InvalidPass):
        check_pass("garbage", "sale", "session-a", max_age=60)


def test_touch_refuses_a_pass_of_a_lost_state_or_a_freed_slot(redis_client):
    flow = room("touch", max_active=1)
    status = flow.visit("a")
    assert flow.touch(status.ticket, status.born)
    assert not flow.touch(status.ticket, status.born + 1)  # another state (Redis lost it)
    flow.leave("a")
    assert not flow.touch(status.ticket, status.born)


# -- the decorator and the status endpoint -------------------------------------------


@pytest.fixture
def sale_event(db):
    return Event.objects.create(
        name="Kettles", slug="kettles", start=PAST, max_active=1, admit_per_minute=6000
    )


def test_the_first_visitor_is_admitted_and_passes_straight_through(client, sale_event):
    first = client.get("/sale/order/")
    assert first.status_code == 200 and first.json() == {"ordered": True}
    token = first.cookies[sl_settings.WAITING_ROOM_COOKIE_PREFIX + "kettles"].value
    assert token == first[sl_settings.WAITING_ROOM_PASS_HEADER]
    again = client.get("/sale/order/")
    assert again.status_code == 200


def test_a_fresh_pass_costs_no_redis_round_trip(client, sale_event, redis_client):
    assert client.get("/sale/order/").status_code == 200
    calls = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    for _ in range(5):
        assert client.get("/sale/order/").status_code == 200
    after = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert after == calls


def test_others_wait_on_a_page_or_get_a_429(client, sale_event, django_user_model):
    from django.test import Client

    assert client.get("/sale/order/").status_code == 200  # takes the one slot
    browser = Client()
    page = browser.get("/sale/order/", HTTP_ACCEPT="text/html")
    assert page.status_code == 200 and b'http-equiv="refresh"' in page.content
    assert b"<script" not in page.content and b"style=" not in page.content
    assert b"<style" not in page.content and b"Your place" in page.content
    api = Client().post("/sale/order/", HTTP_ACCEPT="application/json")
    assert api.status_code == 429 and int(api["Retry-After"]) >= 1
    body = api.json()
    assert body["state"] == "waiting" and body["position"] == 2 and body["ahead"] == 1
    assert body["eta_seconds"] > 0 and body["poll_after"] >= 1
    status = browser.get("/stock-locks/waiting-room/kettles/")
    assert status.status_code == 200 and status.json()["ahead"] == 0


def test_an_async_view_waits_behind_the_room_the_same_way(sale_event):
    from django.test import AsyncClient, Client

    admitted = Client()
    assert admitted.get("/sale/order-async/").json() == {"ordered": True, "async": True}
    waiting = AsyncClient()
    page = async_to_sync(waiting.get)("/sale/order-async/", headers={"Accept": "application/json"})
    assert page.status_code == 429 and page.json()["state"] == "waiting"
    token = admitted.get("/sale/order/")[sl_settings.WAITING_ROOM_PASS_HEADER]
    again = admitted.get("/sale/order-async/", HTTP_X_WAITING_ROOM_PASS=token)
    assert again.status_code == 200 and again[sl_settings.WAITING_ROOM_PASS_HEADER]


def test_the_status_endpoint_tells_a_place_and_never_joins(client, sale_event):
    from django.test import Client

    status = client.get("/stock-locks/waiting-room/kettles/")
    assert status.status_code == 200 and status.json()["state"] == "unknown"
    assert room_events.room_for("kettles").stats().admitted == 0  # nobody joined
    assert client.get("/sale/order/").status_code == 200  # joins there, admitted
    waiting = Client()
    waiting.get("/sale/order/", HTTP_ACCEPT="application/json")
    assert waiting.get("/stock-locks/waiting-room/kettles/").json()["state"] == "waiting"


def test_an_other_sessions_pass_is_refused(client, sale_event):
    from django.test import Client

    first = client.get("/sale/order/")
    token = first[sl_settings.WAITING_ROOM_PASS_HEADER]
    thief = Client()
    stolen = thief.get("/sale/order/", HTTP_ACCEPT="application/json",
                       **{"HTTP_X_WAITING_ROOM_PASS": token})  # fmt: skip
    assert stolen.status_code == 429


def test_release_frees_the_slot_for_the_next(client, sale_event):
    from django.test import Client

    assert client.get("/sale/order/").status_code == 200
    other = Client()
    assert other.get("/sale/order/", HTTP_ACCEPT="application/json").status_code == 429
    paid = client.post("/sale/paid/")
    assert paid.status_code == 200 and paid.json() == {"released": True}
    assert other.get("/sale/order/", HTTP_ACCEPT="application/json").status_code == 200


def test_unknown_or_disabled_event_status_is_404(client, sale_event):
    assert client.get("/stock-locks/waiting-room/nope/").status_code == 404
    Event.objects.filter(slug="kettles").update(enabled=False)
    room_events.forget()
    assert client.get("/stock-locks/waiting-room/kettles/").status_code == 404
    assert client.get("/sale/order/").status_code == 200  # off: everyone goes through


# -- the operator's view --------------------------------------------------------------


def test_the_dashboard_and_the_scrape_show_each_room(admin_client, sale_event):
    from django.conf import settings
    from django.test import Client
    from django.urls import reverse

    assert Client().get("/sale/order/").status_code == 200
    for _ in range(2):
        Client().get("/sale/order/", HTTP_ACCEPT="application/json")  # two wait
    snapshot = admin_client.get(reverse("admin:stock_locks_dashboard_json")).json()
    (row,) = snapshot["waiting_rooms"]
    assert row["slug"] == "kettles" and row["state"] == "open"
    assert (row["waiting"], row["admitted"], row["admitted_total"]) == (2, 1, 1)
    page = admin_client.get(reverse("admin:stock_locks_dashboard"))
    assert b'data-room="kettles"' in page.content
    token = settings.STOCK_LOCKS["METRICS_TOKEN"]
    scrape = Client().get("/stock-locks/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    text = scrape.content.decode()
    assert 'stock_locks_waiting_room_waiting{event="kettles"} 2' in text
    assert 'stock_locks_waiting_room_admitted{event="kettles"} 1' in text
    assert 'stock_locks_waiting_room_sold_out{event="kettles"} 0' in text


def test_the_dashboard_clears_a_room_after_the_sale_and_audits_it(
    admin_client, sale_event, redis_client
):
    from django.test import Client
    from django.urls import reverse

    from stock_locks.models import AuditEntry
    from tests.support.served_page import ServedPage

    assert Client().get("/sale/order/").status_code == 200  # admitted: the one slot
    for _ in range(2):
        Client().get("/sale/order/", HTTP_ACCEPT="application/json")  # two wait
    keys = room_events.room_for("kettles").keys.script_keys()
    held = redis_client.exists(*keys)
    assert held > 0

    page = ServedPage(admin_client.get(reverse("admin:stock_locks_dashboard")).content.decode())
    [row] = page.rows("sl-rooms")
    [clear] = [
        link["attrs"]["href"]
        for cell in row["cells"]
        for link in cell["links"]
        if link["text"] == "Clear"
    ]
    confirm = admin_client.get(clear)
    assert confirm.status_code == 200 and b'name="event" value="kettles"' in confirm.content
    assert redis_client.exists(*keys) == held  # asking changes nothing

    url = reverse("admin:stock_locks_dashboard_action", args=["clear_room"])
    admin_client.post(url, {"event": "nope", "confirm": "yes"})  # no such event
    assert redis_client.exists(*keys) == held
    assert admin_client.post(url, {"event": "kettles", "confirm": "yes"}).status_code == 302
    assert redis_client.exists(*keys) == 0

    refused, cleared = AuditEntry.objects.filter(action="clear_room").order_by("id")
    assert (refused.target, refused.displaced) == ("nope", None)
    assert "nothing cleared" in refused.outcome
    assert cleared.target == "kettles"
    assert (cleared.displaced["waiting"], cleared.displaced["admitted"]) == (2, 1)
    # The room starts again, its one slot free: the next visitor goes through.
    assert Client().get("/sale/order/").status_code == 200


def test_admin_lists_and_adds_events(admin_client, sale_event):
    listing = admin_client.get("/admin/stock_locks/event/")
    assert listing.status_code == 200 and b"kettles" in listing.content
    assert admin_client.get("/admin/stock_locks/event/add/").status_code == 200


def test_the_admin_refuses_an_event_the_room_could_not_read(admin_client, db):
    form = {
        "name": "Bad", "slug": "bad", "enabled": "on", "start_0": "2026-11-27",
        "start_1": "09:00:00", "max_active": 10, "admit_per_minute": 60, "stock_factor": 1,
        "lanes": '["guests", "guests"]', "skus": "[]", "queue_ttl": 60, "session_ttl": 600,
    }  # fmt: skip
    refused = admin_client.post("/admin/stock_locks/event/add/", form)
    assert refused.status_code == 200 and b"lanes must be distinct" in refused.content
    assert not Event.objects.exists()
    form["lanes"] = '["members", "guests"]'
    assert admin_client.post("/admin/stock_locks/event/add/", form).status_code == 302
    assert Event.objects.get().lanes == ["members", "guests"]


def test_a_guest_admitted_keeps_its_pass_through_a_login_and_release_frees_the_slot(
    client, sale_event, django_user_model
):
    from django.test import Client

    assert client.get("/sale/order/").status_code == 200  # admitted as a guest
    user = django_user_model.objects.create_user("alice", password="pw")
    client.force_login(user)  # a new session key, the same session data
    assert client.get("/sale/order/").status_code == 200  # the pass still holds
    other = Client()
    assert other.get("/sale/order/", HTTP_ACCEPT="application/json").status_code == 429
    assert client.post("/sale/paid/").status_code == 200  # leaves by the pass's ticket
    assert room_events.room_for("kettles").stats().admitted == 0
    assert other.get("/sale/order/", HTTP_ACCEPT="application/json").status_code == 200
