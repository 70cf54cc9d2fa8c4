"""One wake-up listener per event loop and Redis node: waiting costs an event, not a connection.

A sync waiter blocks a pooled connection in ``BLPOP`` on its lock's signal
list. A thousand waiting coroutines cannot do that. Instead each waiting
coroutine registers a future for its signal key with the :class:`WakeListener`
of its loop (one per Redis server; one per hash slot on a cluster, since one
``BLPOP`` takes keys of one slot only), and the listener blocks in a single
``BLPOP`` on every registered key at once, on a connection of its own.

- A popped signal wakes exactly one coroutine waiting on that key (the first
  in line): like a sync waiter's BLPOP, one release wakes one waiter, no herd.
  When nobody here waits on it any more, the signal is pushed back for a
  waiter elsewhere.
- A key not yet in the listener's ``BLPOP`` nudges it: one element pushed to
  the listener's own control key (same slot), which is also in the ``BLPOP``,
  so the nudge cannot be missed whatever the timing; the listener then blocks
  again on the new set of keys. Signals pushed meanwhile wait in their list.
- Every wait stays bounded by its caller's deadline (the holder's lease), so
  a lost signal costs at most that, as on the sync side.
- A connection error reaches every waiter of the listener (their acquire
  fails as Redis unavailable, as a sync waiter's would). A node that stopped
  serving the slot (cluster failover) wakes them instead: they try again and
  meet the new map.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ResponseError

from ...conf import settings
from ...keys import prefix, slot_tag
from .errors import STALE_ROUTE_ERRORS
from .wakeup import SERVER_MARGIN, UNBLOCKED

# The listener's own BLPOP timeout: it blocks again after this, so that a server
# that silently lost the connection is noticed.
LISTEN_SECONDS = 10.0
CONTROL_TTL_MS = 60_000  # the control key outlives a listener that died


class WakeListener:
    """Wakes the coroutines of one event loop waiting on signal lists of one node.

    ``connect()`` opens the listener's own connection (not a pooled one);
    ``client`` runs the short commands (nudges, pushed-back signals) through the
    pool; ``slot``: the hash slot of its keys on a cluster (None: one server).
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        client: Any,
        slot: int | None,
        on_stale_route: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._connect = connect
        self._client = client
        self._on_stale_route = on_stale_route
        tag = slot_tag(slot) if slot is not None else "wake"
        self.control = f"{prefix()}:wake:{{{tag}}}:{secrets.token_hex(8)}"
        self.waiters: dict[str, deque[asyncio.Future[bool]]] = {}
        self.listening: frozenset[str] = frozenset()
        self._nudged = False
        self._task: asyncio.Task[None] | None = None
        self._connection: Any = None

    def __len__(self) -> int:
        """How many coroutines wait here."""
        return sum(len(queue) for queue in self.waiters.values())

    async def wait(self, key: str, seconds: float) -> bool:
        """Sleep until a signal on ``key`` is popped for this caller (True) or ``seconds``
        pass (False). Raises the listener's transport error if it fails meanwhile."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        queue = self.waiters.setdefault(key, deque())
        queue.append(future)
        woken = False
        try:
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(
                    self._listen(), name="stock_locks.aio wake-up listener"
                )
            elif key not in self.listening:
                await self._nudge()
            done, _ = await asyncio.wait((future,), timeout=max(seconds, 0.0))
            woken = bool(done)
            return woken and future.result()
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(future)
            if not queue and self.waiters.get(key) is queue:
                del self.waiters[key]
            if not woken and future.done() and not future.cancelled() and not future.exception():
                self._pass_on(key)  # popped for this caller as it stopped waiting
            future.cancel()

    async def _nudge(self) -> None:
        if self._nudged:
            return
        self._nudged = True
        pipe = self._client.pipeline(transaction=False)
        pipe.lpush(self.control, 1)
        pipe.pexpire(self.control, CONTROL_TTL_MS)
        await pipe.execute()

    def _deliver(self, key: str) -> None:
        for future in self.waiters.get(key, ()):
            if not future.done():
                future.set_result(True)
                return
        self._pass_on(key)

    def _pass_on(self, key: str) -> None:
        """A popped signal nobody here waits for: the next waiter here, else back to Redis."""
        for future in self.waiters.get(key, ()):
            if not future.done():
                future.set_result(True)
                return
        asyncio.get_running_loop().create_task(self._push_back(key))

    async def _push_back(self, key: str) -> None:
        with contextlib.suppress(Exception):  # (lost: a waiter elsewhere waits its bound)
            pipe = self._client.pipeline(transaction=False)
            pipe.rpush(key, 1)
            pipe.pexpire(key, int(settings.WAKE_SIGNAL_TTL * 1000))
            await pipe.execute()

    async def _listen(self) -> None:
        try:
            while self.waiters:
                if self._connection is None:
                    self._connection = await self._connect()
                keys = list(self.waiters)
                self.listening, self._nudged = frozenset(keys), False
                await self._connection.send_command("BLPOP", *keys, self.control, LISTEN_SECONDS)
                reply = await self._connection.read_response(timeout=LISTEN_SECONDS + SERVER_MARGIN)
                if reply:
                    key = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
                    if key != self.control:
                        self._deliver(key)
        except ResponseError as exc:
            await self._drop_connection()
            if str(exc).startswith(UNBLOCKED) or isinstance(exc, STALE_ROUTE_ERRORS):
                if self._on_stale_route is not None:
                    await self._on_stale_route()
                self._wake_all(None)  # the node changed hands: look again
            else:
                self._wake_all(exc)
        except asyncio.CancelledError:
            await self._drop_connection()
            raise
        except Exception as exc:  # a transport error: every waiter learns it
            await self._drop_connection()
            self._wake_all(exc)
        finally:
            self.listening = frozenset()

    def _wake_all(self, error: BaseException | None) -> None:
        for queue in self.waiters.values():
            for future in queue:
                if not future.done():
                    if error is None:
                        future.set_result(True)
                    else:
                        future.set_exception(error)

    async def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.disconnect()

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._drop_connection()
