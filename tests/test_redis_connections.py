"""The connection each thread keeps for its scripts (backends/redis/transport.py): one per
thread, never lent by the pool, closed with the thread, made anew in a forked child, and
connected again after Redis restarts. Counted from the server's CLIENT LIST."""

from __future__ import annotations

import gc
import multiprocessing
import threading

import pytest
import redis

from stock_locks import Lock
from stock_locks.exceptions import RedisUnavailable
from tests.support.waiting import TIMEOUT, wait_until


def client_ids(server_client: redis.Redis) -> set[int]:
    """The ids of the server's connections, the asking one left out."""
    own = server_client.client_id()
    return {int(entry["id"]) for entry in server_client.client_list()} - {own}


def kept_connection_id(lock: Lock) -> int:
    """The server's id of the calling thread's kept connection (it must exist)."""
    connection = lock.backend.transport._kept.connection
    connection.send_command("CLIENT", "ID")
    return int(connection.read_response())


def cycles(lock: Lock, n: int = 20) -> None:
    for _ in range(n):
        assert lock.acquire(timeout=TIMEOUT)
        lock.release()


class MadeConnection(redis.Connection):
    """A redis-py connection that counts how many were made."""

    made = 0

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        MadeConnection.made += 1


def test_a_thread_keeps_one_connection_for_its_scripts_and_it_closes_when_the_thread_ends(
    redis_server, redis_client
):
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=redis_server.port, connection_class=MadeConnection
    )
    client = redis.Redis(connection_pool=pool)
    lock = Lock("kept", ttl=5, redis=client)
    cycles(lock, 1)  # the scripts loaded, the main thread's connection made
    main_connection = kept_connection_id(lock)
    made = MadeConnection.made
    cycled, finish = threading.Event(), threading.Event()
    worker_connection: list[int] = []

    def worker() -> None:
        cycles(lock)
        worker_connection.append(kept_connection_id(lock))
        cycled.set()
        finish.wait(TIMEOUT)

    thread = threading.Thread(target=worker)
    thread.start()
    assert cycled.wait(TIMEOUT)
    # 20 cycles on one new connection, the thread's own (the pool lent none)
    assert MadeConnection.made == made + 1
    assert worker_connection[0] != main_connection
    assert worker_connection[0] in client_ids(redis_client)
    finish.set()
    thread.join(TIMEOUT)
    gc.collect()
    wait_until(
        lambda: worker_connection[0] not in client_ids(redis_client),
        what="the ended thread's connection closed",
    )
    cycles(lock)  # the main thread's connection is still its own
    assert kept_connection_id(lock) == main_connection
    assert MadeConnection.made == made + 1
    client.close()


def test_a_forked_child_makes_its_own_connection_and_leaves_the_parents_open(
    redis_server, redis_client
):
    lock = Lock("kept-fork", ttl=5)
    cycles(lock, 1)
    parent_connection = kept_connection_id(lock)
    ctx = multiprocessing.get_context("fork")
    done = ctx.Queue()
    # (the child inherits this thread's kept connection and must not use or shut it)
    child = ctx.Process(target=lambda: (cycles(lock), done.put(lock.fence)))
    child.start()
    child_fence = done.get(timeout=TIMEOUT)
    child.join(TIMEOUT)
    assert child.exitcode == 0 and child_fence
    assert parent_connection in client_ids(redis_client)
    cycles(lock)
    assert kept_connection_id(lock) == parent_connection  # not reconnected
    assert lock.fence > child_fence


def test_a_call_nested_in_a_call_on_the_kept_connection_borrows_from_the_pool(
    redis_server, redis_client
):
    cycles(Lock("kept-nested", ttl=5, redis=redis_client), 1)  # the scripts loaded
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=redis_server.port, connection_class=MadeConnection
    )
    client = redis.Redis(connection_pool=pool)
    lock = Lock("kept-nested", ttl=5, redis=client)
    cycles(lock, 1)
    kept = lock.backend.transport._kept
    made = MadeConnection.made
    kept.busy = True  # as while a call is under way on it (a finalizer runs a release)
    try:
        cycles(lock, 3)
        assert kept.busy, "the nested calls used the connection in use"
        assert MadeConnection.made == made + 1  # the pool's first, lent to each call
    finally:
        kept.busy = False
    client.close()


def test_the_kept_connection_connects_again_after_redis_restarts(redis_factory):
    server = redis_factory()
    lock = Lock("kept-restart", ttl=5, redis=redis.Redis(host="127.0.0.1", port=server.port))
    cycles(lock, 3)
    fence = lock.fence
    server.kill()
    with pytest.raises(RedisUnavailable):
        lock.acquire(timeout=0)
    server.start()
    cycles(lock, 3)
    assert lock.fence > fence
