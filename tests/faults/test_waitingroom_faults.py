"""The waiting room under faults: lost replies on join and on admission, Redis killed
and restarted empty in the middle of a sale, and admission run by several processes
at once.

A lost reply is staged by a FaultProxy that lets the request run and drops its
reply; the restart is a real SIGKILL and a fresh redis-server on the same port.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client, override_settings

from stock_locks import scripts
from stock_locks.exceptions import RedisUnavailable
from stock_locks.models import Event
from stock_locks.waitingroom import RoomSpec, WaitingRoom
from tests.support.processes import run_in_processes
from tests.support.waiting import wait_until
from tests.test_waitingroom import PAST, _fresh_caches, room  # noqa: F401 (the fixture)


@pytest.mark.parametrize("retries", [0, 1])
def test_a_lost_reply_on_join_neither_loses_the_ticket_nor_gives_a_second(
    redis_through_proxy, redis_client, retries
):
    proxy = redis_through_proxy(retries)
    flow = room(max_active=5)
    assert flow.visit("warm-up").ticket == 1  # (the script is loaded: the lost call runs it)
    # The transport sends a script again by itself once when its connection dies: one
    # loss it hides, two it reports (the script then ran twice).
    proxy.lose_reply(b"visitor-lost", times=1 if retries else 2)
    if retries:
        status = flow.visit("visitor-lost")  # sent again: its reply came back
    else:
        with pytest.raises(RedisUnavailable):
            flow.visit("visitor-lost")
        status = flow.visit("visitor-lost")  # the caller's retry
    assert proxy.lost == (1 if retries else 2)
    assert status.ticket == 2 and status.state == "admitted"
    assert redis_client.hget(flow.keys.state, "seq") == b"2"
    assert redis_client.zcard(flow.keys.active) == 2
    assert redis_client.hget(flow.keys.state, "admitted") == b"2"


def test_a_lost_reply_on_admission_admits_nobody_twice(redis_through_proxy, redis_client):
    proxy = redis_through_proxy(0)
    flow = room(max_active=3)
    tickets = [flow.visit(f"v{i}", remaining=0).ticket for i in range(10)]
    assert flow.admit(remaining=0) == 0  # (sold out: nothing; the script is loaded)
    proxy.lose_reply(scripts.WAITINGROOM_ADMIT.sha.encode(), times=2)
    with pytest.raises(RedisUnavailable):
        flow.admit(remaining=-1)  # it ran (twice: sent again once): the replies lost
    assert flow.admit(remaining=-1) == 0  # the repeat: the slots are taken
    admitted = sorted(int(t) for t in redis_client.zrange(flow.keys.active, 0, -1))
    assert admitted == tickets[:3]
    assert redis_client.hget(flow.keys.state, "admitted") == b"3"
    assert [flow.visit(f"v{i}").state for i in range(4)] == ["admitted"] * 3 + ["waiting"]


def _admit_and_leave(index: int, slug: str, visitors: list[str], max_active: int):  # child
    """Poll every visitor of this process until each was admitted once (then it leaves):
    the order admitted, and the most visitors seen admitted at once."""
    flow = room(slug, max_active=max_active)
    admitted: list[int] = []
    waiting = list(visitors)
    most = 0
    while waiting:
        for visitor in list(waiting):
            status = flow.visit(visitor, remaining=-1)
            most = max(most, flow.stats().admitted)
            if status.state == "admitted":
                admitted.append(status.ticket)
                waiting.remove(visitor)
                flow.leave(visitor)
    return admitted, most


def test_admission_from_several_processes_admits_each_once_within_max_active(redis_client):
    visitors = [[f"p{p}-v{i}" for i in range(30)] for p in range(4)]
    flow = room("many", max_active=4)
    for i in range(30):  # all arrive first, interleaved, while the room is sold out
        for p in range(4):
            flow.visit(visitors[p][i], remaining=0)
    outcomes = run_in_processes(_admit_by_index, 4, "many", visitors, 4)
    tickets = [ticket for admitted, _ in outcomes for ticket in admitted]
    assert sorted(tickets) == list(range(1, 121))  # everyone once, nobody twice
    assert max(most for _, most in outcomes) <= 4
    stats = flow.stats()
    assert stats.admitted_total == 120 and stats.left == 120 and stats.admitted == 0


def _admit_by_index(index: int, slug: str, visitors: list[list[str]], max_active: int):
    return _admit_and_leave(index, slug, visitors[index], max_active)


# -- Redis killed in the middle of a sale --------------------------------------------


@pytest.fixture
def sale(db):
    return Event.objects.create(
        name="Kettles", slug="kettles", start=PAST, max_active=2, admit_per_minute=6000,
        session_ttl=30,
    )  # fmt: skip


def _json(client: Client, path: str = "/sale/order/"):
    return client.get(path, HTTP_ACCEPT="application/json")


def test_redis_killed_mid_sale_gives_503_and_the_restart_keeps_the_limits(redis, sale):
    first, second, third = Client(), Client(), Client()
    assert _json(first).status_code == 200
    assert _json(second).status_code == 200
    assert _json(third).status_code == 429  # two slots, both taken
    redis.kill()
    assert _json(first).status_code == 200  # a fresh pass needs no Redis
    down = _json(third)
    assert down.status_code == 503 and down["Retry-After"]
    assert down.json()["error"] == "unavailable"
    assert third.get("/stock-locks/waiting-room/kettles/").status_code == 503
    redis.restart()  # empty: the room's state is lost, the passes are not
    # From here a short pass refresh, which is also how long the hold after a loss lasts.
    short = {**settings.STOCK_LOCKS, "WAITING_ROOM_PASS_REFRESH": 1.0}
    with override_settings(STOCK_LOCKS=short):
        # The first visit after the restart makes the state again, with a hold: passes of
        # the lost state must lapse (or be refused at renewal) before anyone is admitted.
        assert _json(third).status_code == 429
        client = redis.client()
        spec = RoomSpec(slug="kettles", start=PAST, max_active=2, admit_per_minute=6000)
        active = WaitingRoom(spec).keys.active
        assert client.zcard(active) == 0
        # The old passes are of another state now: renewed in Redis, refused there.
        assert _json(first).status_code == 429
        assert _json(second).status_code == 429

        def admitted_after_the_hold() -> list[int]:
            codes = [_json(c).status_code for c in (first, second, third)]
            assert client.zcard(active) <= 2  # never past max_active
            return codes if codes.count(200) == 2 else []

        codes = wait_until(admitted_after_the_hold, interval=0.1, what="admission after the hold")
        assert sorted(codes) == [200, 200, 429]
