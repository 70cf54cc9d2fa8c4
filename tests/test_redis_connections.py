"""The connection each thread keeps for its scripts (backends/redis/transport.py): lent
once by the client's pool and kept while the thread lives, given back when it ends; not
kept from a pool whose callers wait for a free connection, nor more than half of a
bounded pool; a forked child takes its own once. Counted from the server's CLIENT LIST
and from the connections the pool made."""

from __future__ import annotations

import gc
import multiprocessing
import threading
from collections.abc import Callable

import pytest
import redis

from stock_locks import Lock
from stock_locks.exceptions import RedisUnavailable
from tests.support.waiting import TIMEOUT


class MadeConnection(redis.Connection):
    """A redis-py connection that counts how many were made."""

    made = 0

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        MadeConnection.made += 1


def client_ids(server_client: redis.Redis) -> set[int]:
    """The ids of the server's connections, the asking one left out."""
    own = server_client.client_id()
    return {int(entry["id"]) for entry in server_client.client_list()} - {own}


def kept_connection_id(lock: Lock) -> int:
    """The server's id of the calling thread's kept connection (it must exist)."""
    connection = lock.backend.transport._kept.lent.connection
    connection.send_command("CLIENT", "ID")
    return int(connection.read_response())


def cycles(lock: Lock, n: int = 20) -> None:
    for _ in range(n):
        assert lock.acquire(timeout=TIMEOUT)
        lock.release()


def counting_client(redis_server, pool_class=redis.ConnectionPool, **options) -> redis.Redis:
    pool = pool_class(
        host="127.0.0.1", port=redis_server.port, connection_class=MadeConnection, **options
    )
    return redis.Redis(connection_pool=pool)


def in_thread(function) -> list:
    """Run ``function`` in a new thread to its end; what it returned, in a list."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    thread.join(TIMEOUT)
    return result


@pytest.fixture(autouse=True)
def scripts_loaded(redis_client):
    cycles(Lock("kept-warm-up", ttl=5, redis=redis_client), 1)


def test_a_thread_keeps_the_connection_its_pool_lent_and_gives_it_back_when_it_ends(
    redis_server, redis_client
):
    client = counting_client(redis_server)
    lock = Lock("kept", ttl=5, redis=client)

    def worker() -> tuple[int, int, int]:
        cycles(lock, 1)
        first, made = kept_connection_id(lock), MadeConnection.made
        cycles(lock)
        # 20 cycles more on the same connection, and none borrowed or made meanwhile
        assert kept_connection_id(lock) == first and MadeConnection.made == made
        return first, made, threading.get_ident()

    [(first, made, _)] = in_thread(worker)
    gc.collect()  # (the ended thread's locals)
    [(again, made_again, _)] = in_thread(worker)
    assert again == first, "the ended thread did not give its connection back to the pool"
    assert made_again == made
    client.close()


def test_a_forked_child_takes_one_connection_not_one_per_call(redis_server, redis_client):
    client = counting_client(redis_server)
    lock = Lock("kept-fork", ttl=5, redis=client)
    cycles(lock, 1)
    parent_connection = kept_connection_id(lock)
    ctx = multiprocessing.get_context("fork")
    done = ctx.Queue()

    def child() -> None:
        made = MadeConnection.made
        cycles(lock, 50)
        done.put((MadeConnection.made - made, lock.fence))

    process = ctx.Process(target=child)
    process.start()
    made_in_child, child_fence = done.get(timeout=TIMEOUT)
    process.join(TIMEOUT)
    assert process.exitcode == 0 and made_in_child == 1
    # (the child inherited this thread's connection and neither used nor shut it)
    assert parent_connection in client_ids(redis_client)
    cycles(lock)
    assert kept_connection_id(lock) == parent_connection
    assert lock.fence > child_fence
    client.close()


def test_a_call_nested_in_a_call_on_the_kept_connection_borrows_from_the_pool(redis_server):
    client = counting_client(redis_server)
    lock = Lock("kept-nested", ttl=5, redis=client)
    cycles(lock, 1)
    kept = lock.backend.transport._kept
    kept.busy = True  # as while a call is under way on it (a finalizer runs a release)
    try:
        cycles(lock, 3)
        assert kept.busy, "the nested calls used the connection in use"
    finally:
        kept.busy = False
    client.close()


def while_alive(count: int, work: Callable[[], None], then: Callable[[], None]) -> None:
    """``work()`` in ``count`` threads which stay alive (what they keep stays kept) until
    every one has done it and ``then()`` has run here. A worker that never gets through
    (one waiting for a connection others keep) breaks the barrier: BrokenBarrierError."""
    ready, alive = threading.Barrier(count + 1), threading.Event()

    def worker() -> None:
        work()
        ready.wait(TIMEOUT)
        alive.wait(TIMEOUT)

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        ready.wait(TIMEOUT)
        then()
    finally:
        alive.set()
        for thread in threads:
            thread.join(TIMEOUT)


def test_threads_keep_no_connection_of_a_pool_whose_callers_wait_for_one(redis_server):
    client = counting_client(
        redis_server, redis.BlockingConnectionPool, max_connections=2, timeout=TIMEOUT
    )
    made = MadeConnection.made
    # Six threads alive that took locks: had they kept connections, the later ones
    # would wait for one until their timeout.
    while_alive(
        6,
        lambda: cycles(Lock("kept-blocking", ttl=5, timeout=TIMEOUT, redis=client), 10),
        lambda: None,
    )
    assert MadeConnection.made - made <= 2
    client.close()


def test_threads_keep_at_most_half_of_a_bounded_pool(redis_server):
    client = counting_client(redis_server, max_connections=4)
    lock = Lock("kept-bounded", ttl=5, timeout=TIMEOUT, redis=client)
    made = MadeConnection.made
    one_at_a_time = threading.Lock()

    def work() -> None:
        with one_at_a_time:  # (never more callers at once than the pool holds)
            cycles(lock, 5)

    # Four threads alive that took locks: had each kept a connection, the pool would
    # have none left to lend this thread ("Too many connections").
    while_alive(4, work, lambda: cycles(lock, 5))
    assert MadeConnection.made - made <= 4
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
