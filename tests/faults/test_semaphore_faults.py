"""Semaphores when a round trip goes wrong: interrupted mid-call, or its reply lost.

An interrupted ``acquire()`` or ``release()`` (a signal whose handler raises,
like Ctrl-C or Celery's soft time limit, arriving while the request is held up
by the network) must not leave a permit, or a place in a fair queue, taken for
a whole lease. A release or refresh whose reply was lost must report what
happened on the server. Everything runs through a TCP proxy in front of a real
redis-server, with the interrupted holder in its own OS process; the verdict is
read from Redis.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stock_locks import FairSemaphore, Lock, Semaphore
from stock_locks.exceptions import LockError, LockNotOwned
from tests.support.fault_proxy import RETRIES, Interrupted, client_through, raise_interrupted
from tests.support.processes import event, start_process
from tests.support.redis_stats import blocked_clients, commandstats
from tests.support.waiting import TIMEOUT, wait_until

KINDS = {"plain": Semaphore, "fair": FairSemaphore}
BOTH = pytest.mark.parametrize("kind", list(KINDS))

_spawn = multiprocessing.get_context("spawn")


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def _load_scripts(kind: type[Semaphore], client: redis.Redis) -> None:
    """Run each script once, so no try through the proxy needs a SCRIPT LOAD."""
    with kind("warm-up", 1, ttl=10, redis=client):
        pass


# -- interrupted mid-round-trip ------------------------------------------------------


def _acquire_then_interrupted(kind: str, url: str, report, go) -> None:
    """Child: take a permit while the network holds the request; a signal interrupts."""
    signal.signal(signal.SIGUSR1, raise_interrupted)
    client = client_through(url)
    with Lock("warm-up", ttl=10, redis=client):  # its script connection made before the stall
        pass
    sem = KINDS[kind]("stalled", 1, ttl=300, redis=client)
    report.put(("ready", sem.id))
    go.wait(TIMEOUT)
    try:
        granted = sem.acquire(timeout=TIMEOUT)
    except Interrupted:
        report.put(("interrupted", sem.id))
    else:
        report.put(("not interrupted", granted))


@BOTH
def test_an_acquire_interrupted_mid_round_trip_leaves_no_permit_taken(
    kind, redis_server, redis_client, fault_proxy
):
    _load_scripts(KINDS[kind], redis_client)
    proxy = fault_proxy(redis_server.port)
    report, go = _spawn.Queue(), event()
    child = start_process(_acquire_then_interrupted, kind, proxy.url, report, go)
    try:
        state, sem_id = report.get(timeout=TIMEOUT)
        assert state == "ready"
        redis_client.config_resetstat()
        proxy.stall()
        go.set()
        wait_until(lambda: proxy.held_requests == 1, what="the acquire held up by the network")
        os.kill(child.pid, signal.SIGUSR1)
        # The interrupted call gives back what its try may be granted, by a round
        # trip it bounds itself: the network is still stalled, and the call must
        # end all the same.
        assert report.get(timeout=TIMEOUT) == ("interrupted", sem_id)
    finally:
        proxy.resume()
    child.join(TIMEOUT)
    # Both requests reach Redis now, in either order: the try, granted if it
    # lands first, and the give-back.
    wait_until(
        lambda: commandstats(redis_client).get("cmdstat_evalsha") == 2,
        what="the late try and the give-back ran",
    )
    assert redis_client.zscore("sl:sem:{stalled}", sem_id) is None
    assert redis_client.zscore("sl:sem:{stalled}:queue", sem_id) is None
    assert KINDS[kind]("stalled", 1, ttl=10, timeout=0, redis=redis_client).acquire()


def _wait_in_line_then_interrupted(url: str, report) -> None:
    """Child: queue for a fair semaphore, sleep, and be interrupted while asleep."""
    signal.signal(signal.SIGUSR1, raise_interrupted)
    sem = FairSemaphore("line", 1, ttl=300, redis=client_through(url))
    report.put(("ready", sem.id))
    try:
        sem.acquire(timeout=TIMEOUT)
    except Interrupted:
        report.put(("interrupted", sem.id))
    else:
        report.put(("not interrupted", sem.id))


def test_a_fair_waiter_interrupted_in_line_leaves_no_place_blocking_others(
    redis_server, redis_client, fault_proxy
):
    _load_scripts(FairSemaphore, redis_client)
    holder = FairSemaphore("line", 1, ttl=300, redis=redis_client)
    assert holder.acquire()
    proxy = fault_proxy(redis_server.port)
    report = _spawn.Queue()
    child = start_process(_wait_in_line_then_interrupted, proxy.url, report)
    try:
        state, waiter_id = report.get(timeout=TIMEOUT)
        assert state == "ready"
        wait_until(
            lambda: (
                redis_client.zscore("sl:sem:{line}:queue", waiter_id) is not None
                and blocked_clients(redis_client) == 1
            ),
            what="the waiter queued and asleep",
        )
        proxy.stall()  # its give-back will have to get through a stalled network
        os.kill(child.pid, signal.SIGUSR1)
        assert report.get(timeout=TIMEOUT) == ("interrupted", waiter_id)
    finally:
        proxy.resume()
    child.join(TIMEOUT)
    wait_until(
        lambda: redis_client.zscore("sl:sem:{line}:queue", waiter_id) is None,
        what="the interrupted waiter's place given back",
    )
    holder.release()
    # Nobody is ahead of a newcomer: the permit is not kept for the interrupted waiter.
    assert FairSemaphore("line", 1, ttl=10, timeout=0, redis=redis_client).acquire()


def _release_interrupted_then_again(kind: str, url: str, report, go, again) -> None:
    """Child: hold a permit; the release is held up and interrupted; release again."""
    signal.signal(signal.SIGUSR1, raise_interrupted)
    sem = KINDS[kind]("held", 1, ttl=300, redis=client_through(url))
    assert sem.acquire(timeout=0)
    report.put(("held", sem.id))
    go.wait(TIMEOUT)
    try:
        sem.release()
    except Interrupted:
        report.put(("interrupted", sem.id))
    else:
        report.put(("not interrupted", sem.id))
        return
    again.wait(TIMEOUT)
    try:
        sem.release()
    except LockError as error:
        report.put(("release failed", repr(error)))
    else:
        report.put(("released", sem.id))


@BOTH
def test_a_release_interrupted_mid_round_trip_keeps_the_hold_to_release_again(
    kind, redis_server, redis_client, fault_proxy
):
    _load_scripts(KINDS[kind], redis_client)
    proxy = fault_proxy(redis_server.port)
    report, go, again = _spawn.Queue(), event(), event()
    child = start_process(_release_interrupted_then_again, kind, proxy.url, report, go, again)
    try:
        state, sem_id = report.get(timeout=TIMEOUT)
        assert state == "held"
        proxy.stall()
        go.set()
        wait_until(lambda: proxy.held_requests == 1, what="the release held up by the network")
        os.kill(child.pid, signal.SIGUSR1)
        assert report.get(timeout=TIMEOUT) == ("interrupted", sem_id)
        # The network loses what it held: the release and the bounded give-back
        # that followed it never reach Redis.
        proxy.cut()
    finally:
        proxy.resume()
    assert redis_client.zscore("sl:sem:{held}", sem_id) is not None  # still taken
    again.set()
    # The interrupted call did not forget the hold, so it can be released now.
    assert report.get(timeout=TIMEOUT) == ("released", sem_id)
    child.join(TIMEOUT)
    assert redis_client.zscore("sl:sem:{held}", sem_id) is None
    assert KINDS[kind]("held", 1, ttl=10, timeout=0, redis=redis_client).acquire()


# -- lost replies ----------------------------------------------------------------------


def _holder_through(proxy, kind: str, retries: int) -> Semaphore:
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), retries))
    sem = KINDS[kind]("lost", 1, ttl=300, redis=client)
    assert sem.acquire(timeout=0)
    return sem


@BOTH
@RETRIES
def test_a_release_whose_reply_was_lost_reports_success(
    kind, retries, redis_server, redis_client, fault_proxy
):
    _load_scripts(KINDS[kind], redis_client)
    proxy = fault_proxy(redis_server.port)
    sem = _holder_through(proxy, kind, retries)
    proxy.lose_reply(b"EVALSHA")
    sem.release()  # it ran; its reply was lost; the repeat says it did happen
    assert proxy.lost == 1
    assert redis_client.zscore("sl:sem:{lost}", sem.id) is None
    assert KINDS[kind]("lost", 1, ttl=10, timeout=0, redis=redis_client).acquire()


@BOTH
@RETRIES
def test_a_refresh_whose_reply_was_lost_reports_success(
    kind, retries, redis_server, redis_client, fault_proxy
):
    _load_scripts(KINDS[kind], redis_client)
    proxy = fault_proxy(redis_server.port)
    sem = _holder_through(proxy, kind, retries)
    proxy.lose_reply(b"EVALSHA")
    sem.refresh(600)
    assert proxy.lost == 1
    lease_end = redis_client.zscore("sl:sem:{lost}", sem.id)
    assert lease_end - _server_ms(redis_client) > 300_000  # renewed to 600 s
    sem.release()


@BOTH
@RETRIES
def test_a_lost_lease_still_raises_when_the_reply_is_lost(
    kind, retries, redis_server, redis_client, fault_proxy
):
    _load_scripts(KINDS[kind], redis_client)
    proxy = fault_proxy(redis_server.port)
    sem = _holder_through(proxy, kind, retries)
    redis_client.zadd("sl:sem:{lost}", {sem.id: _server_ms(redis_client) - 1})  # lease over
    proxy.lose_reply(b"EVALSHA")
    with pytest.raises(LockNotOwned):
        sem.refresh()
    assert proxy.lost == 1
    proxy.lose_reply(b"EVALSHA")
    with pytest.raises(LockNotOwned):
        sem.release()
    assert proxy.lost == 2
    assert redis_client.zscore("sl:sem:{lost}", sem.id) is None
