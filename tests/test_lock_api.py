"""The lock API a team reaches for (issue 9): a hold handed to another process by
its token, force release by name and by host/pid (function, command, dashboard),
introspection from the object and by name, and max_hold on watchdog locks.

Real redis-server, real PostgreSQL, real spawned processes where a hold crosses
processes; leases end by writing state or by the cap under test, never by a
sleep the test times.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import socket
import threading
from io import StringIO

import pytest
import redis
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from stock_locks import Lock, LockInfo, lock_model, locked, scripts
from stock_locks.backends.base import ReleaseMode, ReleaseOutcome
from stock_locks.backends.redis.protocol import parse_record, release_argv, release_keys, token_of
from stock_locks.exceptions import LockError, LockNotOwned, StaleFencingToken
from stock_locks.fencing import claim, fenced_update
from stock_locks.models import AuditEntry
from stock_locks.operations import force_release, inspect, release_held_by
from stock_locks.watchdog import thread_watchdog
from tests.inventory.models import Item
from tests.support.lock_state import held
from tests.support.processes import event, start_process
from tests.support.redis_stats import (
    CountingConnection,
    blocked_clients,
    commandstats,
    redis_ms,
)
from tests.support.waiting import TIMEOUT, renewed, wait_until

NOT_OWNED, RELEASED = ReleaseOutcome.NOT_OWNED, ReleaseOutcome.RELEASED

_spawn = multiprocessing.get_context("spawn")
HOST = socket.gethostname()


# -- 1. a hold adopted by its token, across processes ----------------------------------------


def _adopt_extend_release(name: str, token: str, report, go) -> None:
    """Child: a Celery task's part: adopt the view's hold, read it, extend, release."""
    lock = Lock(name, ttl=30, token=token)
    info = lock.info()
    report.put(("adopted", lock.fence, lock.owned(), info.pid if info else None))
    lock.extend(120)
    report.put(("extended", lock.remaining()))
    go.wait(TIMEOUT)
    lock.release()
    report.put(("released", lock.owned()))


def test_a_spawned_process_adopts_a_hold_by_token_extends_and_releases_it(redis_client):
    view = Lock("order:77", ttl=30)
    assert view.acquire(timeout=0)
    report, go = _spawn.Queue(), event()
    task = start_process(_adopt_extend_release, "order:77", view.token, report, go)
    try:
        # The adopter reads the grant's fence from the holder's record (the view's process).
        assert report.get(timeout=TIMEOUT) == ("adopted", view.fence, True, str(os.getpid()))
        state, remaining = report.get(timeout=TIMEOUT)
        assert state == "extended" and 100 < remaining <= 120
        assert 100_000 < redis_client.pttl("sl:lock:{order:77}") <= 120_000
        go.set()
        assert report.get(timeout=TIMEOUT) == ("released", False)
    finally:
        go.set()
        task.join(TIMEOUT)
    assert not held(redis_client, "sl:lock:{order:77}")
    # The original holder's own release is recognised as already done: no error.
    view.release()
    assert not view.owned()
    with pytest.raises(LockError):
        view.release()  # and its hold is gone on this side
    with Lock("order:77", ttl=5, timeout=0) as next_holder:
        assert next_holder.fence > view.fence


def test_when_the_original_holder_releases_first_the_adopter_is_told(redis_client):
    original = Lock("order:78", ttl=30)
    original.acquire()
    adopted = Lock("order:78", ttl=30, token=original.token)
    original.release()  # the token is the owner: either handle frees the lock
    assert not adopted.owned() and adopted.remaining() == 0.0
    with pytest.raises(LockNotOwned):
        adopted.extend()
    adopted.release()  # recognised as already released
    assert not held(redis_client, "sl:lock:{order:78}")


def _adopt_with_watchdog(name: str, token: str, report, go) -> None:
    """Child: adopt a handed-off hold and keep it alive with this process's watchdog."""
    lock = Lock(name, ttl=0.6, token=token, watchdog=True)
    report.put(("adopted", lock.fence))
    go.wait(TIMEOUT)
    report.put(("lost before release", lock.lost))
    lock.release()
    report.put(("released", True))


def test_hand_off_stops_the_givers_renewals_and_the_receiver_renews(redis_client, caplog):
    giver = Lock("job:9", ttl=30, watchdog=True)
    caplog.set_level(logging.WARNING, logger="stock_locks.lock.renewal")
    with giver:
        token = giver.hand_off()
        assert token == giver.token
        assert (giver.keys.lock, token) not in thread_watchdog().schedule.renewals
        assert not giver.owned()
        report, go = _spawn.Queue(), event()
        receiver = start_process(_adopt_with_watchdog, "job:9", token, report, go)
    # The with block's end released nothing: the hold is the receiver's now.
    try:
        assert report.get(timeout=TIMEOUT) == ("adopted", giver.fence)
        assert token_of(redis_client.get("sl:lock:{job:9}")) == token
        # The receiver's watchdog renews the hold to its own 0.6 s lease, again and again.
        for _ in range(3):
            renewed(lambda: redis_client.pttl("sl:lock:{job:9}"), "the handed-off hold")
        go.set()
        assert report.get(timeout=TIMEOUT) == ("lost before release", False)
        assert report.get(timeout=TIMEOUT) == ("released", True)
    finally:
        go.set()
        receiver.join(TIMEOUT)
    assert not held(redis_client, "sl:lock:{job:9}")
    assert "job:9" not in caplog.text  # the giver's watchdog never saw it lost
    assert giver.acquire(timeout=0)  # the object is usable again
    giver.release()


def test_adopting_a_token_that_no_longer_holds_the_lock(redis_client):
    gone = Lock("order:79", ttl=30)
    gone.acquire()
    redis_client.pexpire(gone.keys.lock, 1)  # its lease ends
    wait_until(lambda: not held(redis_client, gone.keys.lock), what="lease end")
    adopted = Lock("order:79", ttl=30, token=gone.token)
    assert not adopted.owned() and adopted.remaining() == 0.0
    with pytest.raises(LockNotOwned):
        adopted.fence  # noqa: B018  (the fence of a hold it does not have)
    assert adopted.lost
    with pytest.raises(LockNotOwned):
        adopted.extend(10)
    with pytest.raises(LockNotOwned):
        adopted.release()


def test_adoption_arguments_are_checked_before_any_round_trip(redis_client):
    holder = Lock("order:80", ttl=30)
    holder.acquire()
    redis_client.config_resetstat()
    for bad in ("", 42, b"token", ["token"], "two words", "a\nb", "tab\t"):
        with pytest.raises(LockError):
            Lock("order:80", token=bad)
    with pytest.raises(LockError, match="reentrant"):
        Lock("order:80", reentrant=True, token=holder.token)
    with pytest.raises(LockError, match="reentrant"):
        Lock("order:81", reentrant=True).hand_off()
    with pytest.raises(LockError):
        Lock("order:81").hand_off()  # not held
    adopted = Lock("order:80", token=holder.token)
    with pytest.raises(LockError):
        adopted.acquire()  # already holds, like any holder
    assert "cmdstat_evalsha" not in commandstats(redis_client)
    adopted.release()
    assert not held(redis_client, "sl:lock:{order:80}")


# -- 2. force release: by name, by token, by host/pid; the displaced holder ------------------


def _holder_then_stale_write(name: str, item_pk: int, report, go) -> None:
    """Child: hold the lock; after the force release, write fenced, then release."""
    lock = Lock(name, ttl=300)
    assert lock.acquire(timeout=0)
    report.put(("held", lock.fence, lock.token))
    go.wait(TIMEOUT)
    try:
        fenced_update(Item.objects.filter(pk=item_pk), lock.fence, on_hand=0)
    except StaleFencingToken:
        report.put(("write", "refused"))
    else:
        report.put(("write", "accepted"))
    try:
        lock.release()
    except LockNotOwned:
        report.put(("release", "LockNotOwned"))
    else:
        report.put(("release", "released"))


@pytest.mark.django_db(transaction=True)
def test_force_release_returns_the_displaced_holder_whose_fenced_write_is_then_refused(
    redis_client,
):
    item = Item.objects.create(code="KETTLE", on_hand=5, title="Kettle")
    report, go = _spawn.Queue(), event()
    stuck = start_process(_holder_then_stale_write, "item:KETTLE", item.pk, report, go)
    try:
        state, fence, token = report.get(timeout=TIMEOUT)
        assert state == "held"
        displaced = force_release("item:KETTLE")
        assert isinstance(displaced, LockInfo)
        assert (displaced.name, displaced.token, displaced.fence) == ("item:KETTLE", token, fence)
        assert (displaced.host, displaced.pid) == (HOST, str(stuck.pid))
        assert displaced.caller.endswith("_holder_then_stale_write")
        assert not held(redis_client, "sl:lock:{item:KETTLE}")
        assert AuditEntry.objects.count() == 0  # the caller audits, not the function
        with Lock("item:KETTLE", ttl=30, timeout=0) as newer:
            assert newer.fence > fence
            claim(Item.objects.filter(pk=item.pk), newer.fence)  # before reading
            fenced_update(Item.objects.filter(pk=item.pk), newer.fence, on_hand=4)
            go.set()
            assert report.get(timeout=TIMEOUT) == ("write", "refused")
            assert report.get(timeout=TIMEOUT) == ("release", "LockNotOwned")
            assert newer.owned()  # the displaced holder's release touched nothing
    finally:
        go.set()
        stuck.join(TIMEOUT)
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (4, newer.fence)


def test_force_release_by_token_compares_the_token(redis_client):
    lock = Lock("order:90", ttl=30)
    lock.acquire()
    assert force_release("order:90", token="someone-else") is None
    assert lock.owned()
    displaced = force_release("order:90", token=lock.token)
    assert displaced is not None and displaced.token == lock.token
    assert force_release("order:90") is None  # free: nothing to displace
    assert force_release("order:90", token=lock.token) is None
    with pytest.raises(LockNotOwned):
        lock.release()
    for bad in ("", 42):
        with pytest.raises(LockError):
            force_release("order:90", token=bad)
    with pytest.raises(LockError):
        force_release("")


def test_a_repeated_force_release_is_recognised_and_the_holder_still_told(redis_client):
    # The script level of a force release whose reply was lost: the repeat reports
    # the release that happened, while the holder's own release is still refused.
    lock = Lock("order:91", ttl=30)
    lock.acquire()
    force = (release_keys(lock.keys), release_argv(lock.token, 1, ReleaseMode.FORCE))
    assert scripts.LOCK_RELEASE(*force, client=redis_client) == RELEASED
    assert scripts.LOCK_RELEASE(*force, client=redis_client) == RELEASED
    assert lock.do_release(lock.token, 1) == NOT_OWNED


def test_force_release_wakes_a_waiter(redis_server, redis_client):
    Lock("order:92", ttl=300).acquire()
    client = redis.Redis(port=redis_server.port, socket_timeout=None)
    granted: list[bool] = []
    waiter = threading.Thread(
        target=lambda: granted.append(
            Lock("order:92", ttl=5, timeout=TIMEOUT, redis=client).acquire()
        )
    )
    waiter.start()
    wait_until(lambda: blocked_clients(redis_client) == 1, what="waiter blocked in BLPOP")
    assert force_release("order:92") is not None
    waiter.join(TIMEOUT)
    assert granted == [True]  # woken by the force release, long before the 300 s lease


def _hold_two_then_hang(report) -> None:
    """Child: a worker that takes two locks and then hangs (the test kills it)."""
    held = [Lock(name, ttl=300) for name in ("deploy:a", "deploy:b")]
    for lock in held:
        assert lock.acquire(timeout=0)
    report.put([lock.fence for lock in held])
    threading.Event().wait(TIMEOUT * 4)


def test_release_held_by_host_and_pid_frees_a_dead_workers_locks_from_the_index(redis_client):
    report = _spawn.Queue()
    worker = start_process(_hold_two_then_hang, report)
    fences = report.get(timeout=TIMEOUT)
    worker.kill()  # the worker dies holding both
    worker.join(TIMEOUT)
    mine = Lock("deploy:c", ttl=300)
    mine.acquire()
    redis_client.config_resetstat()

    assert release_held_by(host="elsewhere") == []
    would = release_held_by(host=HOST, pid=worker.pid, dry_run=True)
    assert [(i.name, i.fence, i.pid) for i in would] == [
        ("deploy:a", fences[0], str(worker.pid)),
        ("deploy:b", fences[1], str(worker.pid)),
    ]
    assert held(redis_client, "sl:lock:{deploy:a}", "sl:lock:{deploy:b}") == 2
    displaced = release_held_by(host=HOST, pid=worker.pid)
    assert [i.name for i in displaced] == ["deploy:a", "deploy:b"]
    assert not held(redis_client, "sl:lock:{deploy:a}", "sl:lock:{deploy:b}")
    assert mine.owned()  # another process's lock on the same host is left alone
    assert [i.name for i in release_held_by(host=HOST, dry_run=True)] == ["deploy:c"]
    stats = commandstats(redis_client)
    assert "cmdstat_scan" not in stats and "cmdstat_keys" not in stats  # the index, not SCAN
    for bad in (
        dict(host=""),
        dict(host=None),
        dict(host=HOST, pid="x"),
        dict(host=HOST, pid=True),
    ):
        with pytest.raises(LockError):
            release_held_by(**bad)
    mine.release()


@pytest.mark.django_db
def test_release_locks_command_lists_releases_and_audits(redis_client):
    held = [Lock(name, ttl=300) for name in ("cmd:a", "cmd:b")]
    for lock in held:
        lock.acquire()
    out = StringIO()
    call_command(
        "release_locks", "--host", HOST, "--pid", str(os.getpid()), "--dry-run", stdout=out
    )
    assert "would release 2 lock(s)" in out.getvalue() and "cmd:a" in out.getvalue()
    assert all(lock.owned() for lock in held) and AuditEntry.objects.count() == 0

    out = StringIO()
    call_command("release_locks", "--host", HOST, "--pid", str(os.getpid()), "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert (result["host"], result["pid"], result["dry_run"]) == (HOST, os.getpid(), False)
    assert [row["name"] for row in result["locks"]] == ["cmd:a", "cmd:b"]
    assert result["locks"][0]["token"] == held[0].token[:8]  # a credential: only a prefix
    assert result["locks"][0]["fence"] == str(held[0].fence)
    assert not any(lock.owned() for lock in held)
    entries = list(AuditEntry.objects.order_by("target"))
    assert [(e.action, e.target, e.user) for e in entries] == [
        ("release_lock", "cmd:a", None),
        ("release_lock", "cmd:b", None),
    ]
    assert entries[0].username == "manage.py release_locks"
    assert entries[0].displaced["pid"] == str(os.getpid())
    with pytest.raises(CommandError):
        call_command("release_locks", stdout=StringIO())  # --host is required


@pytest.mark.django_db
def test_the_dashboard_action_force_releases_through_the_public_function(redis_client, caplog):
    from stock_locks.dashboard.actions import force_release_lock

    lock = Lock("order:93", ttl=30)
    lock.acquire()
    with caplog.at_level(logging.WARNING, logger="stock_locks.lock.force"):
        outcome = force_release_lock("order:93", lock.token)
    assert outcome.done
    assert outcome.displaced["name"] == "order:93"
    assert outcome.displaced["token"] == lock.token[:8]
    assert outcome.displaced["fence"] == str(lock.fence)
    assert "order:93" in caplog.text and "force-released" in caplog.text
    assert not force_release_lock("order:93", lock.token).done


# -- 3. introspection ------------------------------------------------------------------------


def test_inspect_and_info_describe_the_holder(redis_client):
    assert inspect("order:100") is None
    lock = Lock("order:100", ttl=20, reentrant=True)
    before = redis_ms(redis_client)
    lock.acquire()
    lock.acquire()
    after = redis_ms(redis_client)
    info = inspect("order:100")
    assert (lock.info().token, lock.info().fence) == (info.token, info.fence)
    assert (info.name, info.token, info.fence, info.count) == (
        "order:100", lock.token, lock.fence, 2,
    )  # fmt: skip
    assert (info.host, info.pid, info.thread) == (HOST, str(os.getpid()), "MainThread")
    assert info.caller.endswith("test_inspect_and_info_describe_the_holder")
    assert info.ttl == 20 and 15 < info.remaining <= 20 and info.watchdog is False
    assert before <= round(info.acquired_at.timestamp() * 1000) <= after  # the Redis clock
    assert info.acquired_at.tzinfo is not None
    data = info.as_dict()
    assert data["acquired_at"] == info.acquired_at.isoformat() and json.dumps(data)
    assert 15 < lock.remaining() <= 20
    other = Lock("order:100", ttl=20)  # not the holder: info() still says who is
    assert other.info().token == lock.token and other.remaining() == 0.0
    lock.release()
    lock.release()
    assert inspect("order:100") is None and lock.info() is None and lock.remaining() == 0.0
    with pytest.raises(LockError):
        inspect("")


def test_introspection_is_one_round_trip_and_the_cycle_stays_two(redis_server):
    client = redis.Redis(
        connection_pool=redis.ConnectionPool(
            host="127.0.0.1", port=redis_server.port, connection_class=CountingConnection
        )
    )
    lock = Lock("order:101", ttl=5, redis=client)
    lock.acquire()
    lock.info()  # scripts loaded
    for call in (lock.info, lock.remaining, lambda: inspect("order:101", redis=client)):
        CountingConnection.replies = 0
        call()
        assert CountingConnection.replies == 1
    adopted = Lock("order:101", ttl=5, token=lock.token, redis=client)
    CountingConnection.replies = 0
    assert adopted.fence == lock.fence and adopted.fence == lock.fence
    assert CountingConnection.replies == 1  # read once, then known
    lock.release()
    CountingConnection.replies = 0
    for _ in range(10):
        lock.acquire()
        lock.release()
    assert CountingConnection.replies == 20


# -- 4. max_hold: a watchdog lock is not held forever ----------------------------------------


def test_the_watchdog_stops_renewing_at_max_hold_and_the_lease_runs_out(redis_client, caplog):
    capped = Lock("wd:capped", ttl=1, watchdog=True, max_hold=1.5)
    uncapped = Lock("wd:uncapped", ttl=1, watchdog=True)
    caplog.set_level(logging.WARNING, logger="stock_locks.lock.renewal")
    capped.acquire()
    uncapped.acquire()
    granted_ms = int(parse_record(redis_client.get(capped.keys.lock))["acquired_at"])
    wait_until(lambda: not held(redis_client, capped.keys.lock), what="the capped lease ends")
    # Renewed past its 1 s ttl up to the cap, then left to run out: its last lease
    # ended max_hold after the grant, on the Redis clock (listed at least that long).
    assert redis_client.zscore("sl:locks", capped.keys.lock) >= granted_ms + 1_500
    assert redis_ms(redis_client) >= granted_ms + 1_500
    assert capped.lost
    assert "wd:capped" in caplog.text and "max_hold" in caplog.text
    assert uncapped.owned() and not uncapped.lost  # the watchdog still renews the others
    with pytest.raises(LockNotOwned):
        capped.release()
    uncapped.release()


def _hung_worker(report, hang) -> None:
    """Child: takes a watchdog lock, then its main thread hangs; its watchdog lives on."""
    lock = Lock("wd:hung", ttl=0.6, watchdog=True, max_hold=1.2)
    assert lock.acquire(timeout=0)
    report.put(lock.fence)
    hang.wait(TIMEOUT * 4)


def test_a_hung_but_alive_worker_loses_its_watchdog_lock_at_max_hold(redis_client):
    report, hang = _spawn.Queue(), event()
    worker = start_process(_hung_worker, report, hang)
    try:
        fence = report.get(timeout=TIMEOUT)
        with Lock("wd:hung", ttl=5, timeout=TIMEOUT) as next_holder:
            assert worker.is_alive()  # alive, still renewing anything else it held
            assert next_holder.fence > fence
    finally:
        hang.set()
        worker.join(TIMEOUT)


def test_an_adopted_watchdog_hold_is_capped_from_the_original_grant(redis_client):
    original = Lock("wd:adopted", ttl=1)
    original.acquire()
    granted_ms = int(parse_record(redis_client.get(original.keys.lock))["acquired_at"])
    adopted = Lock("wd:adopted", ttl=1, watchdog=True, max_hold=1.5, token=original.token)
    wait_until(lambda: not held(redis_client, adopted.keys.lock), what="the capped lease ends")
    # Renewed by the adopter up to the cap counted from the original grant.
    assert redis_client.zscore("sl:locks", adopted.keys.lock) >= granted_ms + 1_500
    assert redis_ms(redis_client) >= granted_ms + 1_500
    assert adopted.lost


def test_max_hold_defaults_from_the_setting_and_is_checked(redis_client):
    base = getattr(django_settings, "STOCK_LOCKS", {})
    with override_settings(STOCK_LOCKS={**base, "LOCK_MAX_HOLD": 60}):
        assert Lock("mh", ttl=5, watchdog=True).max_hold == 60
        assert Lock("mh", ttl=5).max_hold is None  # only watchdog locks are capped
        assert Lock("mh", ttl=5, watchdog=True, max_hold=math.inf).max_hold is None
    with (
        override_settings(STOCK_LOCKS={**base, "LOCK_MAX_HOLD": "60"}),
        pytest.raises(LockError, match="LOCK_MAX_HOLD"),
    ):
        Lock("mh", ttl=5, watchdog=True)
    assert Lock("mh", ttl=5, watchdog=True).max_hold is None  # default: no cap
    cut = Lock("mh", ttl=30, watchdog=True, max_hold=5)  # a lease longer than the cap is cut
    assert cut.ttl == 5
    cut.acquire()
    assert 0 < redis_client.pttl(cut.keys.lock) <= 5_000
    cut.release()
    with pytest.raises(LockError, match="watchdog"):
        Lock("mh", ttl=5, max_hold=10)
    for bad in (0, -1, "5", float("nan"), True):
        with pytest.raises(LockError):
            Lock("mh", ttl=5, watchdog=True, max_hold=bad)


def test_a_decorated_call_outliving_max_hold_loses_the_lock_and_its_result_stands(
    redis_client, caplog
):
    @locked("job:{n}", ttl=0.5, watchdog=True, max_hold=1)
    def job(n):
        key = f"sl:lock:{{job:{n}}}"
        assert held(redis_client, key)
        wait_until(lambda: not held(redis_client, key), what="the capped lease ends")
        return "done"

    with caplog.at_level(logging.WARNING):
        assert job(1) == "done"
    assert "max_hold" in caplog.text  # the watchdog's warning
    assert "release failed" in caplog.text  # and the decorator's, at the end of the call
    with pytest.raises(LockError, match="watchdog"):
        locked("job:{n}", max_hold=5)
    with pytest.raises(LockError, match="watchdog"):
        lock_model(Item, kwarg="pk", max_hold=5)
    with pytest.raises(LockError):
        locked("job:{n}", watchdog=True, max_hold=-1)


# -- on a real Redis Cluster (one node serving every slot) -----------------------------------


def test_adopt_inspect_and_force_release_on_a_cluster(cluster_client):
    names = ["}starts", "{a}b", "order:1", "order:2"]
    held = [Lock(name, ttl=30, redis=cluster_client) for name in names]
    for lock in held:
        assert lock.acquire(timeout=0)
    adopted = Lock("{a}b", ttl=30, token=held[1].token, redis=cluster_client)
    assert adopted.fence == held[1].fence and adopted.remaining() > 0
    adopted.extend(60)
    info = inspect("}starts", redis=cluster_client)
    assert (info.token, info.pid) == (held[0].token, str(os.getpid()))
    assert force_release("order:1", token=held[2].token, redis=cluster_client).name == "order:1"
    would = release_held_by(host=HOST, pid=os.getpid(), dry_run=True, redis=cluster_client)
    assert sorted(i.name for i in would) == sorted(["}starts", "{a}b", "order:2"])
    displaced = release_held_by(host=HOST, pid=os.getpid(), redis=cluster_client)
    assert sorted(i.name for i in displaced) == sorted(["}starts", "{a}b", "order:2"])
    assert not any(lock.owned() for lock in held)
    assert inspect("order:2", redis=cluster_client) is None


def test_the_watchdog_renews_and_caps_on_a_cluster(cluster_client):
    # (Cluster pipelines refuse EVALSHA: the renewals go node by node.)
    kept = Lock("wd:cluster", ttl=0.6, watchdog=True, redis=cluster_client)
    capped = Lock("wd:cluster-capped", ttl=0.6, watchdog=True, max_hold=1, redis=cluster_client)
    kept.acquire()
    capped.acquire()
    wait_until(lambda: not held(cluster_client, capped.keys.lock), what="the capped lease ends")
    assert capped.lost
    for _ in range(2):
        renewed(lambda: cluster_client.pttl(kept.keys.lock), "the watchdog's lease")
    assert kept.owned() and not kept.lost
    kept.release()
