"""Semaphore, FairSemaphore and @limit_concurrency against a real redis-server.

Concurrency is proven with real processes; waits are bounded by ``wait_until``
and ``TIMEOUT``; leases are made to end by writing a past score, not by sleeping.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import redis
from celery import Celery
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http import JsonResponse
from django.test import RequestFactory, override_settings
from django.views import View

from stock_locks import FairSemaphore, Semaphore, limit_concurrency
from stock_locks.backends.redis.protocol import gone_key
from stock_locks.exceptions import LockError, LockNotOwned, LockTimeout, RedisUnavailable
from stock_locks.operations import semaphore_state
from stock_locks.semaphores import NO_BOUND
from tests.support.processes import event, run_in_processes, start_process
from tests.support.redis_stats import blocked_clients, commandstats, redis_ms
from tests.support.waiting import TIMEOUT, wait_until

KINDS = pytest.mark.parametrize("kind", [Semaphore, FairSemaphore], ids=["plain", "fair"])


def unbounded_client(redis_server) -> redis.Redis:
    """A client whose socket never times out, so a wait is never sliced into tries:
    a waiter granted before its bound can only have been woken."""
    return redis.Redis(port=redis_server.port, socket_timeout=None)


def state_keys(client) -> list[bytes]:
    """The semaphore keys that hold state (holders, waiters), not the short-lived
    memory of given-back ids (``...:gone``, kept one lease for repeated releases)."""
    return [key for key in client.keys("sl:sem:*") if not key.endswith(b":gone")]


def in_thread(target, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(target(*args)), daemon=True)
    thread.start()
    return thread, result


# -- grant, metadata, leases ------------------------------------------------------


@KINDS
def test_grant_stores_holder_metadata_and_the_limit_with_one_lease(kind, redis_client):
    sem = kind("exports", 3, ttl=20)
    assert sem.acquire()
    entries = redis_client.zrange("sl:sem:{exports}", 0, -1, withscores=True)
    assert [member.decode() for member, _ in entries] == [sem.id]
    assert 15_000 < entries[0][1] - redis_ms(redis_client) <= 20_000  # the Redis clock
    meta = redis_client.hgetall("sl:sem:{exports}:meta")
    assert meta[b"limit"] == b"3"
    assert json.loads(meta[sem.id.encode()])["pid"] == os.getpid()
    for key in ("sl:sem:{exports}", "sl:sem:{exports}:meta"):
        assert 15_000 < redis_client.pttl(key) <= 20_000  # an abandoned semaphore vanishes

    other = kind("exports", 3, ttl=60, caller="shop.reports")
    assert other.acquire()
    first, second = sem.holders()  # oldest grant first
    assert first["identifier"] == sem.id and second["identifier"] == other.id
    assert first["pid"] == os.getpid() and first["host"] and first["thread"] == "MainThread"
    assert first["caller"].endswith(
        "test_grant_stores_holder_metadata_and_the_limit_with_one_lease"
    )
    assert second["caller"] == "shop.reports"
    assert abs(first["acquired_at"] - redis_ms(redis_client) / 1000) < 5
    assert 15 < first["remaining"] <= 20 and 55 < second["remaining"] <= 60
    state = semaphore_state("exports")
    assert state["limit"] == 3 and state["waiting"] == 0
    assert [h["identifier"] for h in state["holders"]] == [sem.id, other.id]

    sem.release()
    assert [h["identifier"] for h in other.holders()] == [other.id]
    other.release()
    # Nothing left behind but the memory of the given-back ids (so that a repeated
    # release reports success), which expires after the longest lease.
    assert redis_client.keys("sl:sem:*") == [b"sl:sem:{exports}:gone"]
    assert {m.decode() for m in redis_client.zrange("sl:sem:{exports}:gone", 0, -1)} == {
        sem.id,
        other.id,
    }
    assert 55_000 < redis_client.pttl("sl:sem:{exports}:gone") <= 60_000


@KINDS
def test_at_most_limit_holders_and_a_released_permit_is_granted_again(kind):
    a, b, c = (kind("pair", 2, ttl=10, timeout=0) for _ in range(3))
    assert a.acquire() and b.acquire()
    assert not c.acquire()
    a.release()
    assert c.acquire()
    with pytest.raises(LockError):
        c.acquire()  # one object is one holder
    b.release()
    c.release()


@KINDS
def test_retried_acquire_with_the_same_id_is_granted_once(kind, redis_client):
    sem = kind("retry", 1, ttl=10)
    first = sem.do_acquire(0)
    second = sem.do_acquire(0)  # the reply of the first was "lost"; the semaphore is full now
    assert first == second and first.granted
    assert redis_client.zcard("sl:sem:{retry}") == 1


def test_all_keys_of_a_semaphore_share_one_hash_slot():
    from redis.crc import key_slot

    sem = FairSemaphore("{weird}name:}x", 2)
    keys = [*sem.keys, sem.keys.wake_prefix + sem.id, gone_key(sem.keys)]
    assert len({key_slot(key.encode()) for key in keys}) == 1


@KINDS
def test_context_manager_raises_lock_timeout_when_no_permit_is_free(kind):
    with kind("busy", 1, ttl=10), pytest.raises(LockTimeout) as info, kind("busy", 1, timeout=0):
        pass
    assert info.value.name == "busy"


def test_bad_arguments_are_refused_before_any_round_trip(redis_client):
    redis_client.config_resetstat()
    for limit in (0, -1, 1.5, True, "2", None):
        with pytest.raises(LockError, match="limit"):
            Semaphore("x", limit)
    for ttl in (0, -1, "5", False, float("nan"), float("inf")):
        with pytest.raises(LockError, match="ttl"):
            FairSemaphore("x", 2, ttl)
    with pytest.raises(LockError):
        Semaphore("", 2)
    for timeout in (-1, "1", True, float("nan")):
        with pytest.raises(LockError, match="timeout"):
            Semaphore("x", 2, timeout=timeout)
    for blocking in ("yes", 1, None):
        with pytest.raises(LockError, match="blocking"):
            Semaphore("x", 2, blocking=blocking)
    sem = FairSemaphore("x", 2, ttl=5)
    for timeout in (-2, "5", float("nan")):
        with pytest.raises(LockError, match="timeout"):
            sem.acquire(timeout=timeout)
    with pytest.raises(LockError, match="blocking"):
        sem.acquire(blocking="no")
    for call in (sem.release, sem.refresh):
        with pytest.raises(LockError, match="no permit held"):
            call()
    assert "cmdstat_evalsha" not in commandstats(redis_client)
    sem.acquire()
    for ttl in (0, "5", float("nan"), float("inf")):
        with pytest.raises(LockError, match="ttl"):
            sem.refresh(ttl)
    sem.release()


def test_the_decorators_checks_are_the_shared_ones():
    from stock_locks import _validate, limit_concurrency

    assert _validate.limit(3) == 3 and _validate.wait_seconds(None, "timeout") is None
    with pytest.raises(LockError, match="limit"):
        limit_concurrency("exports", True)
    with pytest.raises(LockError, match="timeout"):
        limit_concurrency("exports", 2, timeout=float("nan"))


# -- leases end on the Redis clock ----------------------------------------------------


@KINDS
def test_a_holder_whose_lease_ended_is_reaped_and_told_so(kind, redis_client):
    old = kind("reap", 1, ttl=30)
    assert old.acquire()
    redis_client.zadd("sl:sem:{reap}", {old.id: 1})  # its lease ended long ago
    new = kind("reap", 1, ttl=30, timeout=0)
    assert new.acquire()  # the ended holder no longer counts
    assert not redis_client.hexists("sl:sem:{reap}:meta", old.id)
    assert [h["identifier"] for h in new.holders()] == [new.id]
    with pytest.raises(LockNotOwned):
        old.refresh()
    assert old.lost
    with pytest.raises(LockNotOwned):
        old.release()
    assert [h["identifier"] for h in new.holders()] == [new.id]  # untouched by the old one
    new.release()


@KINDS
def test_refresh_extends_a_live_lease_and_refuses_an_ended_one(kind, redis_client):
    sem = kind("ref", 2, ttl=2)
    assert sem.acquire()
    sem.refresh(60)
    [holder] = sem.holders()
    assert 55 < holder["remaining"] <= 60
    assert 55_000 < redis_client.pttl("sl:sem:{ref}:meta") <= 60_000
    sem.refresh()  # back to its own ttl
    assert 0 < sem.holders()[0]["remaining"] <= 2
    # The lease ends on the Redis clock; nobody has reaped it yet, and it must not revive.
    ended = redis_ms(redis_client) - 1
    redis_client.zadd("sl:sem:{ref}", {sem.id: ended})
    with pytest.raises(LockNotOwned):
        sem.refresh(60)
    assert redis_client.zscore("sl:sem:{ref}", sem.id) == ended
    with pytest.raises(LockNotOwned):
        sem.release()
    assert redis_client.zscore("sl:sem:{ref}", sem.id) is None


# -- wake-ups --------------------------------------------------------------------------


def _hold_permit_until(name: str, acquired, release) -> None:
    with Semaphore(name, 1, ttl=300):
        acquired.set()
        release.wait(TIMEOUT)


def test_waiter_is_woken_by_the_release_not_by_the_lease(redis_client):
    acquired, release = event(), event()
    holder = start_process(_hold_permit_until, "handoff", acquired, release)
    assert acquired.wait(TIMEOUT)
    waiter, result = in_thread(Semaphore("handoff", 1, ttl=5, timeout=TIMEOUT).acquire)
    # The waiter sleeps inside BLPOP (it is not polling)...
    wait_until(lambda: blocked_clients(redis_client) == 1, what="waiter blocked in BLPOP")
    evalsha_while_blocked = commandstats(redis_client)["cmdstat_evalsha"]
    release.set()
    waiter.join(TIMEOUT)
    holder.join(TIMEOUT)
    # ...and was granted although the holder's lease (300 s) is far longer than
    # its own timeout: only the release can have woken it.
    assert result == [True]
    # One refused try before blocking, then: the holder's release and the grant, and
    # the first grant of the name in this process lists it for the admin page.
    assert commandstats(redis_client)["cmdstat_evalsha"] == evalsha_while_blocked + 3


def test_each_release_wakes_one_more_waiter(redis_server, redis_client):
    # Two releases in a row must leave two wake-ups, not one: the waiters wait with
    # no timeout on leases of 300 s, so a lost wake-up would hang one of them.
    client = unbounded_client(redis_server)
    holders = [Semaphore("two", 2, ttl=300, redis=client) for _ in range(2)]
    for holder in holders:
        assert holder.acquire()
    waiters = [in_thread(Semaphore("two", 2, ttl=300, redis=client).acquire) for _ in range(2)]
    wait_until(lambda: blocked_clients(redis_client) == 2, what="2 waiters blocked")
    for holder in holders:
        holder.release()
    for thread, result in waiters:
        thread.join(TIMEOUT)
        assert result == [True]


@pytest.mark.parametrize("kind", [Semaphore, FairSemaphore], ids=["plain", "fair"])
def test_runs_unchanged_on_redis_cluster(kind, redis_factory):
    # The fair scripts build each waiter's wake-up key inside Lua from a declared
    # prefix: the cluster must accept it (same hash tag, same slot).
    from redis.cluster import RedisCluster

    node = redis_factory("--cluster-enabled", "yes")
    node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    wait_until(lambda: node.client().cluster("info")["cluster_state"] == "ok", what="cluster up")
    client = RedisCluster(host="127.0.0.1", port=node.port, socket_timeout=None)
    holder = kind("c:1", 1, ttl=300, redis=client)
    assert holder.acquire()
    waiter, result = in_thread(kind("c:1", 1, ttl=300, redis=client).acquire)
    wait_until(lambda: blocked_clients(node.client()) == 1, what="waiter asleep")
    assert [h["identifier"] for h in holder.holders()] == [holder.id]
    holder.refresh()
    holder.release()
    waiter.join(TIMEOUT)
    assert result == [True]


# -- fairness --------------------------------------------------------------------------


def test_fair_waiters_are_admitted_in_arrival_order(redis_server, redis_client):
    client = unbounded_client(redis_server)
    first, second = (FairSemaphore("fifo", 2, ttl=300, redis=client) for _ in range(2))
    assert first.acquire() and second.acquire()
    waiters = [FairSemaphore("fifo", 2, ttl=300, timeout=TIMEOUT, redis=client) for _ in range(5)]
    done = [threading.Event() for _ in waiters]
    admitted: list[int] = []

    def wait_in_line(index: int) -> None:
        if waiters[index].acquire():
            admitted.append(index)
            done[index].wait(TIMEOUT)
            waiters[index].release()

    for index in range(len(waiters)):
        threading.Thread(target=wait_in_line, args=(index,), daemon=True).start()
        wait_until(
            lambda n=index + 1: redis_client.zcard("sl:sem:{fifo}:queue") == n,
            what=f"waiter {index} queued",
        )
    tickets = [int(redis_client.zscore("sl:sem:{fifo}:queue", w.id)) for w in waiters]
    assert tickets == sorted(tickets)
    wait_until(lambda: blocked_clients(redis_client) == 5, what="5 waiters asleep")

    # Free one permit at a time; each is taken by the next waiter in arrival order.
    for step, free_one in enumerate(
        [first.release, second.release, done[0].set, done[1].set, done[2].set]
    ):
        free_one()
        wait_until(lambda n=step + 1: len(admitted) == n, what=f"admission {step + 1}")
    assert admitted == [0, 1, 2, 3, 4]
    assert [w.ticket for w in waiters] == tickets
    for flag in done[3:]:
        flag.set()
    wait_until(lambda: not state_keys(redis_client), what="keys gone")


def test_a_caller_that_does_not_wait_cannot_take_the_permit_of_the_queue_head(redis_client):
    holder = FairSemaphore("line", 1, ttl=300)
    assert holder.acquire()
    head = FairSemaphore("line", 1, ttl=300)
    attempt = head.do_acquire(60_000)  # queued; not asleep yet (between tries)
    assert not attempt.granted and 0 < attempt.wait * 1000 <= 60_000
    for key in ("queue", "alive", "ticket"):  # its place lapses unless it comes back
        assert 0 < redis_client.pttl(f"sl:sem:{{line}}:{key}") <= 300_000
    holder.release()  # a permit is free now, and the head has been told
    assert redis_client.llen(f"sl:sem:{{line}}:wake:{head.id}") == 1
    newcomer = FairSemaphore("line", 1, ttl=300)
    assert not newcomer.acquire(timeout=0)  # the free permit is the head's
    assert redis_client.zrange("sl:sem:{line}:queue", 0, -1) == [head.id.encode()]
    assert semaphore_state("line")["waiting"] == 1
    assert head.acquire(timeout=0)
    assert not redis_client.exists("sl:sem:{line}:queue", f"sl:sem:{{line}}:wake:{head.id}")


def test_a_fair_waiter_that_times_out_leaves_the_queue(redis_server, redis_client):
    holder = FairSemaphore("patience", 1, ttl=300)
    assert holder.acquire()
    quitter = FairSemaphore("patience", 1, ttl=300, timeout=0.2)
    assert not quitter.acquire()
    assert quitter.ticket == 1  # it did queue, and left with its last try
    assert not redis_client.exists("sl:sem:{patience}:queue", "sl:sem:{patience}:alive")

    # A waiter ahead gives up: the one behind it moves to the head, and the next
    # release wakes it (no timeout, leases of 300 s: only a wake-up can admit it).
    ahead = FairSemaphore("patience", 1, ttl=300)
    assert ahead.do_acquire(60_000).granted is False
    behind = FairSemaphore("patience", 1, ttl=300, redis=unbounded_client(redis_server))
    thread, result = in_thread(behind.acquire)
    wait_until(lambda: blocked_clients(redis_client) == 1, what="the waiter behind asleep")
    assert not ahead.acquire(timeout=0)  # the last try of a waiter whose time ran out
    assert redis_client.zrange("sl:sem:{patience}:queue", 0, -1) == [behind.id.encode()]
    holder.release()
    thread.join(TIMEOUT)
    assert result == [True]
    behind.release()


def test_a_fair_waiter_let_in_but_leaving_wakes_the_next(redis_server, redis_client):
    holder = FairSemaphore("handover", 1, ttl=300)
    assert holder.acquire()
    ahead = FairSemaphore("handover", 1, ttl=300)
    assert ahead.do_acquire(60_000).granted is False
    behind = FairSemaphore("handover", 1, ttl=300, redis=unbounded_client(redis_server))
    thread, result = in_thread(behind.acquire)
    wait_until(lambda: blocked_clients(redis_client) == 1, what="the waiter behind asleep")
    holder.release()  # lets the head in; the one behind stays asleep
    assert redis_client.llen(f"sl:sem:{{handover}}:wake:{ahead.id}") == 1
    assert blocked_clients(redis_client) == 1 and result == []
    ahead.do_release()  # the head leaves before taking it (as after an error in its wait)
    thread.join(TIMEOUT)
    assert result == [True]
    assert not redis_client.exists(f"sl:sem:{{handover}}:wake:{ahead.id}")
    behind.release()


def test_a_dead_waiter_blocks_those_behind_only_until_its_place_lapses(redis_server, redis_client):
    grace = {**settings.STOCK_LOCKS, "FAIR_QUEUE_GRACE": 0.1}
    with override_settings(STOCK_LOCKS=grace):
        holder = FairSemaphore("dead", 1, ttl=300)
        assert holder.acquire()
        dead = FairSemaphore("dead", 1, ttl=300)
        assert dead.do_acquire(100).granted is False  # queued, then never tries again
        behind = FairSemaphore("dead", 1, ttl=300, redis=unbounded_client(redis_server))
        thread, result = in_thread(behind.acquire)
        wait_until(lambda: redis_client.zcard("sl:sem:{dead}:queue") == 2, what="2 queued")
        holder.release()  # wakes the dead head, who never comes
        # No timeout and a lease of 300 s: the waiter behind is admitted because its
        # sleep was bounded by the lapse of the place ahead, which its next try clears.
        thread.join(TIMEOUT)
    assert result == [True]
    assert not redis_client.exists("sl:sem:{dead}:queue", f"sl:sem:{{dead}}:wake:{dead.id}")
    behind.release()


def _woken(client, name: str, waiter: FairSemaphore) -> bool:
    return client.llen(f"sl:sem:{{{name}}}:wake:{waiter.id}") == 1


def _end_lease(client, name: str, holder: Semaphore) -> None:
    """Make ``holder``'s lease end now on the Redis clock (nobody reaps it yet)."""
    client.zadd(f"sl:sem:{{{name}}}", {holder.id: redis_ms(client) - 1})


def test_a_lapsed_lease_hands_the_permit_on_down_the_line_without_idle_time(redis_client):
    # Holders that let short leases run out, one after another: each permit must
    # go to the next waiter when the lease ends, not when that waiter's own,
    # older plan says (it was queued behind someone, and planned to look again
    # only when the place ahead could lapse, a grace later).
    holder = FairSemaphore("relay", 1, ttl=300)
    assert holder.acquire()
    first = FairSemaphore("relay", 1, ttl=1)
    second = FairSemaphore("relay", 1, ttl=300)
    assert first.do_acquire(NO_BOUND).granted is False  # head: waits for the holder's lease end
    attempt = second.do_acquire(NO_BOUND)  # behind: waits for the head's place
    assert (
        not attempt.granted and attempt.wait * 1000 > 300_000
    )  # (the holder's lease + the head's grace)
    _end_lease(redis_client, "relay", holder)
    assert first.do_acquire(NO_BOUND).granted  # the head takes the lapsed permit...
    lease_end = redis_client.zscore("sl:sem:{relay}", first.id)
    # ...and, its own lease being 1 s, the waiter behind is told to look again now.
    assert _woken(redis_client, "relay", second)
    before = redis_ms(redis_client)
    attempt = second.do_acquire(NO_BOUND)
    assert (
        not attempt.granted and attempt.wait * 1000 <= lease_end - before + 1
    )  # sleeps until that lease ends
    _end_lease(redis_client, "relay", first)
    assert second.do_acquire(NO_BOUND).granted


def test_a_release_wakes_every_waiter_whose_turn_it_brings_forward_and_no_other(redis_client):
    # limit 3, leases ending at 100, 200 and 300 s; waiters at ranks 0, 1, 2 each
    # wait for one of them. B (200 s) releases: rank 0 may take the free permit;
    # rank 1's turn now comes when A's lease ends (100 s, not 200 s); rank 2
    # still waits for C's (300 s) and is left asleep.
    holders = [FairSemaphore("shift", 3, ttl=ttl) for ttl in (100, 200, 300)]
    for holder in holders:
        assert holder.acquire()
    waiters = [FairSemaphore("shift", 3, ttl=300) for _ in range(3)]
    for waiter in waiters:
        assert waiter.do_acquire(NO_BOUND).granted is False
    holders[1].release()
    assert [_woken(redis_client, "shift", w) for w in waiters] == [True, True, False]

    # The head takes the free permit; the next looks again and waits for A's lease.
    assert waiters[0].do_acquire(NO_BOUND).granted
    assert waiters[1].do_acquire(NO_BOUND).granted is False
    assert not _woken(redis_client, "shift", waiters[2])  # C's lease is still its turn
    # A waiter ahead that gives up moves those behind it forward in the same way.
    assert not waiters[1].acquire(timeout=0)  # its last try: it leaves the queue
    assert _woken(redis_client, "shift", waiters[2])  # now A's lease end is its turn


@KINDS
def test_a_late_copy_of_a_given_back_try_is_refused(kind, redis_client):
    # An interrupted acquire gives back what its try may have been granted; the
    # try itself can still be on its way and land after the give-back.
    sem = kind("late", 1, ttl=300)
    assert sem.do_release(abandon=True) is False  # the give-back lands first...
    with pytest.raises(LockError, match="given back"):
        sem.do_acquire(NO_BOUND)  # ...then the try it gave up on: refused
    assert redis_client.zcard("sl:sem:{late}") == 0
    assert not redis_client.exists("sl:sem:{late}:queue")
    assert 295_000 < redis_client.pttl("sl:sem:{late}:gone") <= 300_000  # for one lease


@KINDS
def test_a_repeated_release_reports_what_the_first_one_did(kind, redis_client):
    sem = kind("again", 1, ttl=300)
    assert sem.acquire()
    assert sem.do_release() is True
    assert sem.do_release() is True  # a repeat (its reply was lost): it did happen
    sem.release()  # and so does the public call: no LockNotOwned
    assert sem.acquire()  # a new hold, a new id: not refused as given back
    _end_lease(redis_client, "again", sem)
    assert sem.do_release() is False  # the lease had ended: a real loss...
    assert sem.do_release() is False  # ...whatever the repeats say
    with pytest.raises(LockNotOwned):
        sem.release()


# -- the limit under real concurrency ---------------------------------------------------

_COUNT_INSIDE = """
local inside = redis.call('INCR', KEYS[1])
if inside > tonumber(redis.call('GET', KEYS[2]) or 0) then
  redis.call('SET', KEYS[2], inside)
end
return inside
"""


def _count_inside(index: int, kind: type[Semaphore], limit: int, rounds: int) -> int:
    from stock_locks.backends.redis import get_redis

    client = get_redis()
    count_inside = client.register_script(_COUNT_INSIDE)
    peak = 0
    for _ in range(rounds):
        with kind("pool", limit, ttl=30, timeout=TIMEOUT):
            peak = max(peak, count_inside(["inside", "peak"]))
            time.sleep(0.002)  # the work done while holding a permit
            client.decr("inside")
    return peak


@pytest.mark.slow
@KINDS
def test_limit_is_reached_and_never_exceeded_across_8_processes(kind, redis_client):
    peaks = run_in_processes(_count_inside, 8, kind, 3, 40)
    assert max(peaks) == 3
    assert int(redis_client.get("peak")) == 3
    assert int(redis_client.get("inside")) == 0
    assert not redis_client.exists("sl:sem:{pool}", "sl:sem:{pool}:queue")  # all given back
    # What is left (a plain semaphore's wake-up marks) expires by itself.
    assert all(redis_client.pttl(key) > 0 for key in redis_client.keys("sl:sem:*"))


# -- @limit_concurrency ----------------------------------------------------------------


@limit_concurrency("exports", 1, timeout=0)
def export_view(request):
    return JsonResponse({"exported": True})


class ReportView(View):
    @limit_concurrency("report:{request.user.pk}", 1, timeout=0, fair=True)
    def get(self, request):
        return JsonResponse({"user": request.user.pk})


def test_view_answers_429_with_json_when_no_permit_is_free(redis_client):
    request = RequestFactory().get("/export/")
    assert export_view(request).status_code == 200
    with Semaphore("exports", 1, ttl=10):
        response = export_view(request)
        assert response.status_code == 429
        assert response["Retry-After"] == "1"
        body = json.loads(response.content)
        assert body["error"] == "too_many" and body["semaphore"] == "exports"
        assert body["limit"] == 1
        with override_settings(
            STOCK_LOCKS={**settings.STOCK_LOCKS, "SEMAPHORE_TIMEOUT_STATUS": 503}
        ):
            assert export_view(request).status_code == 503
    assert export_view(request).status_code == 200
    assert not state_keys(redis_client)


def test_class_based_view_method_with_a_key_template(redis_client):
    request = RequestFactory().get("/report/")
    request.user = type("User", (), {"pk": 8})()
    view = ReportView.as_view()
    with FairSemaphore("report:8", 1, ttl=10):
        assert view(request).status_code == 429
    assert json.loads(view(request).content) == {"user": 8}


def test_function_runs_holding_a_permit_and_raises_lock_timeout_without_one(redis_client):
    @limit_concurrency("job:{job_id}", 2, timeout=0)
    def run(job_id, fail=False):
        if fail:
            raise ValueError("boom")
        return [h["caller"] for h in semaphore_state(f"job:{job_id}")["holders"]]

    assert run(3) == [f"{__name__}.{run.__qualname__}"]
    with pytest.raises(ValueError):
        run(3, fail=True)
    assert not state_keys(redis_client)  # given back after an exception too
    with Semaphore("job:3", 2, ttl=10), Semaphore("job:3", 2, ttl=10):
        with pytest.raises(LockTimeout) as info:
            run(3)
        assert info.value.name == "job:3"
        assert run(4)  # another job's semaphore is free


def test_bad_decorator_arguments_fail_at_decoration():
    with pytest.raises(LockError, match="job_id"):

        @limit_concurrency("job:{job_id}", 2)
        def run(pk):
            pass

    with pytest.raises(LockError, match="name the argument"):
        limit_concurrency("job:{}", 2)
    for bad in (dict(limit=0), dict(limit=2, ttl=0), dict(limit=2, timeout=-1)):
        with pytest.raises(LockError):
            limit_concurrency("jobs", **bad)


def test_celery_task_runs_holding_a_permit(redis_client):
    app = Celery("semaphore-test", set_as_current=False)

    @app.task(name="tests.export_report", bind=True)
    @limit_concurrency("reports", 1, timeout=0)
    def export_task(self, report_id):
        return len(semaphore_state("reports")["holders"])

    assert export_task.apply(args=(6,)).get() == 1
    with Semaphore("reports", 1, ttl=10):
        assert isinstance(export_task.apply(args=(6,)).result, LockTimeout)


def test_view_answers_503_and_function_raises_when_redis_is_down(redis_factory, use_redis):
    server = redis_factory()
    use_redis(server)
    server.kill()
    request = RequestFactory().get("/export/")
    request.user = AnonymousUser()
    response = export_view(request)
    assert response.status_code == 503
    body = json.loads(response.content)
    assert body["error"] == "unavailable" and body["semaphore"] == "exports"

    @limit_concurrency("exports", 1)
    def export():
        raise AssertionError("must not run without a permit")

    with pytest.raises(RedisUnavailable):
        export()
