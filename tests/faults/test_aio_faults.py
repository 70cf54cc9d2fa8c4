"""stock_locks.aio when the reply does not come back: a coroutine cancelled after its
try reached Redis gives what it may have been granted back (the lost-reply rule of
the sync side). The Redis server is paused (SIGSTOP) so that the try is on its way
when the cancellation lands."""

from __future__ import annotations

import asyncio
import os
import signal

from stock_locks import aio
from tests.support.waiting import eventually


def _awaiting_reply(task: asyncio.Task) -> bool:
    """Whether ``task`` has sent its request and awaits the reply (down its awaits)."""
    awaited = task.get_coro()
    while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
        if awaited.cr_frame.f_code.co_name == "read_response":
            return True
        awaited = awaited.cr_await
    return False


def test_a_coroutine_cancelled_before_its_grants_reply_gives_the_grant_back(redis):
    async def main() -> None:
        warm = aio.Lock("aio:lost-reply", ttl=30)  # (scripts loaded, connections open)
        assert await warm.acquire()
        await warm.release()
        lock = aio.Lock("aio:lost-reply", ttl=30)
        os.kill(redis.pid, signal.SIGSTOP)
        try:
            task = asyncio.create_task(lock.acquire())
            await eventually(lambda: _awaiting_reply(task), what="the try sent")
            task.cancel()
        finally:
            os.kill(redis.pid, signal.SIGCONT)  # the try runs now, then the give-back
        try:
            await task
            raise AssertionError("the cancelled acquire returned")
        except asyncio.CancelledError:
            pass
        assert await aio.Lock("aio:lost-reply", timeout=0).acquire()  # nobody holds it

    asyncio.run(main())
