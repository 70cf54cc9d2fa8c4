"""Failovers of a real Redis Cluster: what moves to the replica, what is lost.

Replication is asynchronous. A master's replica has what the master wrote up
to a moment; a write acknowledged to its client after that moment and before
the master died is gone when the replica takes over. For locks that means a
lock granted just before the master died may be free again on the promoted
replica while its holder still believes it holds it: two holders, which only
fencing tokens make harmless. A grant confirmed with ``REPLICAS=1`` (WAIT) is
on a replica before the holder is told, and survives. Stock never oversells:
the database is the record, and the sweeper gives a reservation whose Redis
half was lost its record back.

The clients these tests use were made before the failover: their slot maps
are stale, so every path that talks to a node directly (watchdog batches, WAIT,
a waiter's BLPOP) must find the new master by itself.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from stock_locks import Lock
from stock_locks.exceptions import LockNotOwned, LockNotReplicated, RedisUnavailable
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.operations import inspect
from stock_locks.stock import get_strategy
from stock_locks.stock.reconcile import measure
from stock_locks.stock.sweeper import sweep
from tests import test_stock as single
from tests.cluster.conftest import on_cluster
from tests.cluster.settings import CLUSTER_URL_ENV, cluster_backend
from tests.inventory.models import Item
from tests.support.processes import run_in_processes
from tests.support.redis_cluster import RedisClusterServers
from tests.support.redis_servers import RedisServer
from tests.support.redis_stats import blocked_clients
from tests.support.stock_audit import audit
from tests.support.waiting import TIMEOUT, wait_until

pytestmark = pytest.mark.faults


def names_on(cluster: RedisClusterServers, master: RedisServer, count: int, prefix: str):
    """``count`` lock names whose keys live on ``master``."""
    names = []
    for n in range(1000):
        name = f"{prefix}{n}"
        if cluster.master_for_key(Lock(name).keys.lock) is master:
            names.append(name)
            if len(names) == count:
                return names
    raise AssertionError(f"not {count} names on {master.port}")


def blocked_on(server: RedisServer) -> int:
    client = server.client()
    try:
        return blocked_clients(client)
    finally:
        client.close()


def waiting_thread(lock: Lock) -> tuple[threading.Thread, list]:
    """``lock.acquire()`` in a thread; the list gets its result or the exception it raised."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(lock.acquire())
        except Exception as exc:  # what the caller would see, kept for the assertion
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def lease_end(name: str) -> float:
    """When the lease of ``name`` ends, on this process's monotonic clock."""
    info = inspect(name)
    assert info is not None, f"the lease of {name!r} ran out: not renewed"
    return time.monotonic() + info.remaining


def renewed_after(name: str, ttl: float) -> None:
    """Until the lease of ``name`` was renewed: its end moved later (a renewal every
    ttl / 3 moves it by about that much; a sixth of the ttl is far above the noise)."""
    first = lease_end(name)
    wait_until(
        lambda: lease_end(name) > first + ttl / 6, interval=0.05, what=f"a renewal of {name!r}"
    )


def test_a_manual_failover_moves_leases_renewals_waiters_and_replica_checks(
    redis_cluster: RedisClusterServers, caplog
):
    url = redis_cluster.url
    master = redis_cluster.master_for_key(Lock("fo").keys.lock)
    held_name, busy_name, before_name, after_name = names_on(redis_cluster, master, 4, "fo:")
    caplog.set_level(logging.WARNING, logger="stock_locks.lock.renewal")
    # Each of these clients is used by one lock only, so nothing but that lock's own
    # calls can tell it that the slot moved.
    backends = {"replicated": cluster_backend(url, REPLICAS=1), "renewed": cluster_backend(url)}
    with on_cluster(url, extra=backends):
        # A REPLICAS=1 grant: the script and WAIT on the node's own connection.
        before = Lock(before_name, ttl=60, backend="replicated")
        assert before.acquire(timeout=0)
        held = Lock(held_name, ttl=3, watchdog=True, backend="renewed")
        assert held.acquire(timeout=0)
        busy = Lock(busy_name, ttl=300)
        assert busy.acquire(timeout=0)
        thread, outcome = waiting_thread(Lock(busy_name, ttl=300, timeout=TIMEOUT))
        wait_until(lambda: blocked_on(master) == 1, what="the waiter blocked on the master")

        new = redis_cluster.failover(held.keys.lock)
        assert new is not master and master in redis_cluster.current_replicas()

        # The grant made with WAIT after the failover finds the new master by itself
        # (its client's map still names the old one) and is confirmed by its replica.
        after = Lock(after_name, ttl=60, backend="replicated")
        assert after.acquire(timeout=0)
        # The watchdog renews on the new master; nothing is marked lost.
        renewed_after(held_name, held.ttl)
        renewed_after(held_name, held.ttl)
        assert held.owned() and not held.lost
        # The waiter was sent off the demoted master without an error, waits on the new
        # one, and is woken there by the release.
        assert outcome == [] and thread.is_alive()
        busy.release()
        thread.join(TIMEOUT)
        assert outcome == [True]
        assert inspect(busy_name).pid and inspect(before_name).token == before.token
        for lock in (held, before, after):
            lock.release()
    assert "lost" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_killed_master_loses_what_its_replica_had_not_received_and_nothing_else(
    redis_cluster: RedisClusterServers, monkeypatch: pytest.MonkeyPatch, redis_client, caplog
):
    keys = StockKeys()
    # Every node as a seed: the process's clients made after the kill must not depend
    # on the dead one (a LOCATION of one URL would, if it named the dead master).
    urls = redis_cluster.urls
    monkeypatch.setenv(CLUSTER_URL_ENV, ",".join(urls))
    master = redis_cluster.master_for_key(keys.loaded)  # the stock tag's master
    keep_name, gone_name, busy_name, unconfirmed = names_on(redis_cluster, master, 4, "kill:")
    Item.objects.create(code="HOT", title="Hot", on_hand=20)
    try:
        with on_cluster(urls, extra={"replicated": cluster_backend(urls, REPLICAS=1)}):
            lua = get_strategy("lua")
            keep = Lock(keep_name, ttl=10, watchdog=True, backend="replicated")
            assert keep.acquire(timeout=0)  # a replica confirmed it before the grant counted
            busy = Lock(busy_name, ttl=300)
            assert busy.acquire(timeout=0)
            lua.reserve("before", {"HOT": 2})
            redis_cluster.sync_replicas(keys.loaded)  # all of that is on the replica
            thread, outcome = waiting_thread(Lock(busy_name, ttl=300, timeout=TIMEOUT))
            wait_until(lambda: blocked_on(master) == 1, what="the waiter blocked on the master")

            replica = redis_cluster.detach_replica(master)  # its writes now stay its own
            try:
                gone = Lock(gone_name, ttl=60)
                assert gone.acquire(timeout=0)  # granted by the master alone
                with pytest.raises(LockNotReplicated):
                    Lock(unconfirmed, ttl=60, backend="replicated").acquire(timeout=0)
                lua.reserve("during", {"HOT": 3})  # its Redis half is on the master alone
                redis_cluster.kill_master_for_key(keys.loaded)
            finally:
                redis_cluster.resume(replica)
            assert redis_cluster.wait_failover(keys.loaded) is replica

            # Kept: the grant a replica confirmed, renewed by its watchdog on the new
            # master, although nothing else used its client since the kill (whose map
            # named the dead master).
            assert inspect(keep_name).token == keep.token
            renewed_after(keep_name, keep.ttl)
            assert keep.owned() and not keep.lost

            # The waiter blocked on the dead master is told Redis was unavailable (or,
            # had it been woken before, granted): never a raw redis-py error.
            busy.release()
            thread.join(TIMEOUT)
            assert outcome == [True] or isinstance(outcome[0], RedisUnavailable), outcome
            # Lost: the grant the replica never received. The lock is free, a second
            # holder gets it while the first still believes it holds it; only the
            # fence, higher for the second, tells their writes apart.
            assert inspect(gone_name) is None
            second = Lock(gone_name, ttl=60)
            assert second.acquire(timeout=0)
            assert second.fence > gone.fence
            with pytest.raises(LockNotOwned):
                gone.release()  # the first holder learns it only now
            second.release()
            keep.release()

            # Stock: the sale made during the pause is in the database, not on the
            # new master; nothing is oversold, and the sweeper gives it its record back.
            assert Reservation.objects.get(order_ref="during").status == "reserved"
            assert not redis_client.exists(keys.record("during"))
            assert int(redis_client.get(keys.counter("HOT"))) == 18  # 20 - "before"
            assert [(row.sku, row.drift) for row in measure() if row.drift] == []
            result = sweep(grace=0, orphan_grace=0)
            assert result.restarted  # the stock tag's server changed (a new run id)
            assert result.repair.adopted == ["during"]
            assert lua.available("HOT") == 15 == single.db_stock("HOT")

            # Afterwards sales work again, across processes, and sell exactly what is left.
            outcomes = run_in_processes(single._buy_one, 4, "lua", 10)
            assert sum(o["sold"] for o in outcomes) == 15
            book = audit("HOT", initial=20)
            assert (book.oversold, book.lost, book.stock) == (0, 0, 0), book.summary()
            single.assert_no_drift()
    finally:
        redis_cluster.heal()
    assert master in redis_cluster.current_replicas()
