"""What the ZooKeeper backend adds to the lock contract (tests/contract): session
semantics, the queue (one watch per waiter, nothing left by a caller that gave
up), fences from the log, the watchdog's check, configuration and fork.

One real ZooKeeper server for the module (tests/support/zookeeper_servers.py);
each test uses a root znode of its own. A session is ended on purpose the way
ZooKeeper's FAQ does it: a second client joins the session (same id and
password) and closes it, so the server expires it at once; no sleeping.
"""

from __future__ import annotations

import logging
import os

import pytest
from django.core.exceptions import ImproperlyConfigured
from kazoo.client import KazooClient

from stock_locks import Lock
from stock_locks.backends import get_backend
from stock_locks.backends.base import call
from stock_locks.backends.zookeeper import ZooKeeperBackend, queue_order
from stock_locks.exceptions import LockNotOwned, StaleFencingToken, ZooKeeperUnavailable
from stock_locks.fencing import claim, fenced_update
from stock_locks.operations import force_release, inspect
from tests.contract.support import backends_configured, in_thread, joined, sleeping_in
from tests.inventory.models import Item
from tests.support.redis_servers import free_port
from tests.support.waiting import TIMEOUT, wait_until
from tests.support.zookeeper_servers import four_letters, zookeeper_backend
from tests.support.zookeeper_servers import zookeeper_server as zookeeper_server  # (a fixture)

ALIAS = "zk"


@pytest.fixture
def zk(zookeeper_server) -> ZooKeeperBackend:
    with backends_configured({ALIAS: zookeeper_backend(zookeeper_server.hosts)}):
        backend = get_backend(ALIAS)
        assert isinstance(backend, ZooKeeperBackend)
        yield backend


def end_session(backend: ZooKeeperBackend) -> None:
    """Expire ``backend``'s session now: another client takes it over and closes it."""
    session_id, password = backend.client.client_id
    intruder = KazooClient(hosts=backend.hosts, client_id=(session_id, password))
    intruder.start(timeout=TIMEOUT)
    intruder.stop()
    intruder.close()


def queue(backend: ZooKeeperBackend, name: str) -> list[str]:
    path = backend.lock_keys(name).lock
    return queue_order(backend.client.get_children(path))


# -- sessions ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_ended_session_loses_the_lock_and_its_fenced_write_is_refused(zk):
    item = Item.objects.create(code="ZK", title="ZooKeeper", on_hand=10)
    rows = Item.objects.filter(pk=item.pk)
    stale = Lock("inventory.item:ZK", backend=ALIAS)
    assert stale.acquire()
    claim(rows, stale.fence)
    end_session(zk)  # as if its process had been paused past the session timeout
    wait_until(lambda: stale.lost, what="the session listener to mark the hold lost")
    newer = Lock("inventory.item:ZK", timeout=TIMEOUT, backend=ALIAS)
    assert newer.acquire()
    assert newer.fence > stale.fence
    assert fenced_update(rows, newer.fence, on_hand=7) == 1
    with pytest.raises(StaleFencingToken):
        fenced_update(rows, stale.fence, on_hand=0)
    with pytest.raises(LockNotOwned):
        stale.release()
    assert newer.owned()  # the stale release touched nothing of the newer holder's
    newer.release()
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (7, newer.fence)


def _free(lock: Lock) -> bool:
    """Whether ``lock`` is free; "not yet" while the client re-establishes its session
    (a read then meets ConnectionLoss: ZooKeeperUnavailable)."""
    try:
        return not lock.locked()
    except ZooKeeperUnavailable:
        return False


def test_reentry_after_the_session_ended_raises_and_grants_nothing(zk):
    lock = Lock("zk:re-lost", reentrant=True, backend=ALIAS)
    assert lock.acquire()
    end_session(zk)
    wait_until(lambda: _free(lock), what="the session's child to go")
    with pytest.raises(LockNotOwned):
        lock.acquire()
    assert lock.lost and not lock.locked()
    assert lock.acquire()  # a fresh grant, in the client's new session
    assert lock.info().count == 1
    lock.release()


def test_remaining_and_extend_speak_of_a_session_not_a_lease(zk):
    with Lock("zk:session", ttl=1, backend=ALIAS) as lock:
        assert lock.remaining() == float("inf")
        lock.extend(5)  # nothing to extend: it checks the hold
        info = lock.info()
        assert info.remaining is None and info.ttl is None and info.acquired_at is not None
    with pytest.raises(LockNotOwned):
        Lock("zk:session", token="f" * 32, backend=ALIAS).extend(5)


# -- the queue ------------------------------------------------------------------------------


def watched_paths(server) -> set[str]:
    """Every znode path the server has a watch on (the ``wchp`` command)."""
    return {
        line.strip()
        for line in four_letters(server.port, b"wchp").splitlines()
        if line.startswith("/")
    }


def test_each_waiter_watches_only_its_predecessor(zk, zookeeper_server):
    holder = Lock("zk:queue", backend=ALIAS)
    assert holder.acquire()
    waiters = [Lock("zk:queue", timeout=TIMEOUT, backend=ALIAS) for _ in range(3)]
    runs = [in_thread(waiter.acquire) for waiter in waiters]
    for thread, _ in runs:
        wait_until(lambda t=thread: sleeping_in(t, "lock_wait"), what="a waiter asleep")
    path = zk.lock_keys("zk:queue").lock
    wait_until(lambda: len(queue(zk, "zk:queue")) == 4, what="three waiters queued")
    ordered = [f"{path}/{child}" for child in queue(zk, "zk:queue")]
    # The holder and each waiter but the last is watched, each by one waiter: no herd.
    assert wait_until(lambda: watched_paths(zookeeper_server) >= set(ordered[:-1]))
    assert {p for p in watched_paths(zookeeper_server) if p.startswith(path)} == set(ordered[:-1])
    holder.release()
    granted = []
    for _ in waiters:
        wait_until(lambda: any(w.owned() for w in waiters if w not in granted), what="a grant")
        (winner,) = [w for w in waiters if w not in granted and w.token and w.owned()]
        granted.append(winner)
        winner.release()
    assert [joined(*run) for run in runs] == [True] * 3
    fences = [w.fence for w in granted]
    assert fences == sorted(fences) and len(set(fences)) == 3
    assert queue(zk, "zk:queue") == []


def test_a_waiter_that_gives_up_leaves_nothing_queued(zk):
    holder = Lock("zk:give-up", backend=ALIAS)
    assert holder.acquire()
    assert not Lock("zk:give-up", timeout=0.2, backend=ALIAS).acquire()
    assert not Lock("zk:give-up", timeout=0, backend=ALIAS).acquire()
    assert [c.rsplit("-", 1)[0] for c in queue(zk, "zk:give-up")] == [holder.token]
    holder.release()
    assert queue(zk, "zk:give-up") == []


def test_a_repeated_try_keeps_its_oldest_child_and_the_fence_is_its_czxid(zk):
    lock = Lock("zk:again", backend=ALIAS)
    token = "a" * 32
    first = lock.do_acquire(token, 0)
    again = lock.do_acquire(token, 0)  # as if the first reply had been lost
    assert first.granted and again.granted and again.fence == first.fence
    (child,) = queue(zk, "zk:again")
    _, stat = zk.client.get(f"{zk.lock_keys('zk:again').lock}/{child}")
    assert stat.czxid == first.fence
    assert lock.do_release(token, 1) == 1


def test_names_of_any_shape_are_one_znode_each(zk):
    names = ["a/b", ".", "..", "100%", "zé:{1}"]
    locks = [Lock(name, backend=ALIAS) for name in names]
    for lock in locks:
        assert lock.acquire()
    assert zk.execute(call(zk.held_lock_names)) == sorted(names)
    infos = zk.execute(call(zk.inspect_many, [(n, zk.lock_keys(n)) for n in names]))
    assert [info.token for info in infos] == [lock.token for lock in locks]
    for lock in locks:
        lock.release()
    assert zk.execute(call(zk.held_lock_names)) == []


# -- the watchdog, force release ---------------------------------------------------------------


def test_the_watchdog_marks_a_force_released_hold_lost(zk, caplog):
    caplog.set_level(logging.WARNING, logger="stock_locks.lock.renewal")
    lock = Lock("zk:wd", ttl=0.3, watchdog=True, backend=ALIAS)
    assert lock.acquire()
    displaced = force_release("zk:wd", backend=ALIAS)
    assert displaced is not None and displaced.token == lock.token
    wait_until(lambda: lock.lost, what="the watchdog to find the hold gone")
    assert "lost" in caplog.text
    with pytest.raises(LockNotOwned):
        lock.release()


def test_max_hold_ends_a_watchdog_hold(zk):
    lock = Lock("zk:capped", ttl=0.3, watchdog=True, max_hold=0.6, backend=ALIAS)
    assert lock.acquire()
    wait_until(lambda: lock.lost, what="the watchdog to stop at max_hold")
    assert inspect("zk:capped", backend=ALIAS) is None
    with pytest.raises(LockNotOwned):
        lock.release()


# -- configuration, process ------------------------------------------------------------------


def test_configuration_errors_and_an_unreachable_ensemble():
    with pytest.raises(ImproperlyConfigured, match="LOCATION"):
        ZooKeeperBackend("zk")
    with pytest.raises(ImproperlyConfigured, match="ROOT"):
        ZooKeeperBackend("zk", location="127.0.0.1:1", options={"ROOT": "relative"})
    nobody = ZooKeeperBackend(
        "zk", location=f"127.0.0.1:{free_port()}", options={"CONNECT_TIMEOUT": 0.3}
    )
    with pytest.raises(ZooKeeperUnavailable, match="no connection"):
        Lock("zk:down", backend=nobody, timeout=0).acquire()


def test_a_forked_child_uses_a_session_of_its_own(zk):
    with Lock("zk:parent", backend=ALIAS) as parent:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own client, session and grants
            code = 1
            try:
                with Lock("zk:child", backend=ALIAS, timeout=TIMEOUT) as lock:
                    os.write(write, f"{zk.session()} {lock.fence}".encode())
                    code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            session, fence = pipe.read().split()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert int(session) != zk.session() and int(fence) > parent.fence
        assert parent.owned()  # the parent's session and hold are untouched
