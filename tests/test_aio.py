"""stock_locks.aio in one process: many waiting coroutines on few connections, owners
per task, cancellation that leaves nothing behind. (The lock and semaphore contract
runs in the async mode too: tests/contract.)"""

from __future__ import annotations

import asyncio

import pytest

from stock_locks import aio
from stock_locks.backends import get_backend
from stock_locks.conf import settings
from stock_locks.exceptions import LockError
from stock_locks.loops import resources
from stock_locks.operations import force_release, semaphore_state
from tests.support.waiting import TIMEOUT, eventually

COROUTINES = 1000


def _listener():
    """The running loop's wake-up listener of the default backend (one Redis server)."""
    transport = resources().transports.get(get_backend())
    return None if transport is None else transport.listeners.get(None)


def _connections(redis_client) -> int:
    """Clients of the Redis server but the test's own (this process is the only other)."""
    return len(redis_client.client_list()) - 1


def test_a_thousand_coroutines_share_few_connections_and_exclude_each_other(redis_client):
    inside = most = done = 0
    before = _connections(redis_client)  # (the suite's own clients)

    async def buyer() -> None:
        nonlocal inside, most, done
        async with aio.Lock("aio:hot", ttl=30, timeout=TIMEOUT):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0)  # another coroutine runs here: it must not be inside
            inside -= 1
            done += 1

    async def main() -> tuple[int, int]:
        holder = aio.Lock("aio:hot", ttl=30)
        assert await holder.acquire()
        buyers = [asyncio.create_task(buyer()) for _ in range(COROUTINES)]
        waiting = await eventually(
            lambda: (listener := _listener()) is not None and len(listener) == COROUTINES,
            what="every buyer waiting on the listener",
        )
        connections = await asyncio.to_thread(_connections, redis_client)
        await holder.release()
        await asyncio.gather(*buyers)
        return waiting, connections

    waiting, connections = asyncio.run(main())
    assert waiting and done == COROUTINES and most == 1
    # The pool's bound, plus the listener's own connection: not one per waiter.
    assert connections - before <= settings.ASYNC_MAX_CONNECTIONS + 1, (before, connections)


def test_a_reentrant_lock_is_owned_by_its_task_and_not_by_child_tasks(redis_client):
    async def main() -> None:
        lock = aio.Lock("aio:reentrant", ttl=30, reentrant=True, timeout=0)
        assert await lock.acquire() and await lock.acquire()  # this task re-enters
        assert await asyncio.create_task(lock.acquire()) is False  # a child task: another owner
        with pytest.raises(LockError) as refused:
            await asyncio.create_task(lock.release())  # nor can it release the parent's hold
        assert "not held by this task" in str(refused.value)
        await lock.release()
        assert await lock.locked()  # one hold left
        await lock.release()
        assert not await lock.locked()

    asyncio.run(main())


def test_a_waiter_cancelled_while_waiting_leaves_nothing_behind(redis_client):
    async def main() -> None:
        holder = aio.Lock("aio:cancel", ttl=30)
        assert await holder.acquire()
        waiter = asyncio.create_task(aio.Lock("aio:cancel", ttl=30, timeout=TIMEOUT).acquire())
        await eventually(lambda: (lis := _listener()) and len(lis) == 1, what="the waiter asleep")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert len(_listener()) == 0
        info = await holder.info()
        assert info is not None and info.token == holder.token  # the holder still holds it
        await holder.release()
        assert await aio.Lock("aio:cancel", timeout=0).acquire()  # and nothing else does

        permit = aio.FairSemaphore("aio:fair", 1, ttl=30)
        assert await permit.acquire()
        queued = asyncio.create_task(aio.FairSemaphore("aio:fair", 1, timeout=TIMEOUT).acquire())
        await eventually(lambda: (lis := _listener()) and len(lis) == 1, what="the fair waiter")
        assert (await asyncio.to_thread(semaphore_state, "aio:fair"))["waiting"] == 1
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        state = await asyncio.to_thread(semaphore_state, "aio:fair")
        assert state["waiting"] == 0 and len(state["holders"]) == 1  # it left the queue
        await permit.release()

    asyncio.run(main())


def _connection_ids(redis_client) -> set[int]:
    return {int(entry["id"]) for entry in redis_client.client_list()}


def test_the_loops_clients_close_with_the_loop(redis_client):
    before = _connection_ids(redis_client)

    async def main() -> set[int]:
        async with aio.Lock("aio:closing", ttl=30):
            pass
        return await asyncio.to_thread(_connection_ids, redis_client)

    # (by id: another thread's connections may come and go meanwhile)
    opened = asyncio.run(main()) - before
    assert opened
    assert not opened & _connection_ids(redis_client)  # asyncio.run's end closed them


def test_the_pool_bound_queues_callers_and_times_out_with_a_clear_error(redis_server):
    from redis.exceptions import ConnectionError as RedisConnectionError

    from stock_locks.backends.redis.client import BoundedConnectionPool

    async def main() -> None:
        pool = BoundedConnectionPool.from_url(redis_server.url, max_connections=2, timeout=30)
        first, second = await pool.get_connection(), await pool.get_connection()
        assert pool.take_idle() is None  # nothing idle: both are in use
        gives_up = asyncio.create_task(pool.get_connection())
        waits = asyncio.create_task(pool.get_connection())
        await eventually(lambda: len(pool._waiters) == 2, what="two callers queued")
        gives_up.cancel()  # a caller that stops waiting leaves no turn behind
        await eventually(lambda: len(pool._waiters) == 1, what="the cancelled caller gone")
        await pool.release(first)
        third = await waits  # the released connection, to the caller still waiting
        assert third is first and len(pool._in_use_connections) == 2
        pool.timeout = 0.05
        with pytest.raises(RedisConnectionError, match="No connection available"):
            await pool.get_connection()
        assert not pool._waiters
        pool.put_back(second)  # the no-I/O return; take_idle hands it out again
        assert pool.take_idle() is second and len(pool._in_use_connections) == 2
        pool.put_back(second)
        await pool.release(third)
        await pool.disconnect()

    asyncio.run(main())


def test_a_reentrant_hold_is_the_tasks_whichever_object_took_it(redis_client):
    async def main() -> None:
        first = aio.Lock("aio:re-any", ttl=30, reentrant=True)
        assert await first.acquire()
        second = aio.Lock("aio:re-any", ttl=30, reentrant=True)
        assert await second.owned() and second.fence == first.fence
        await second.release()
        assert not await first.locked()

        owner = Owner()  # (the object that took the hold is dropped at once)
        await aio.Lock("aio:re-dropped", ttl=30, reentrant=True, owner=owner).acquire()
        await asyncio.to_thread(force_release, "aio:re-dropped", redis=redis_client)
        again = aio.Lock("aio:re-dropped", ttl=30, reentrant=True, owner=owner, timeout=0)
        assert await again.acquire()  # the owner's dropped hold does not fail it
        await again.release()

    asyncio.run(main())


class Owner:
    """An explicit owner of reentrant aio locks (anything weakly referenceable)."""
