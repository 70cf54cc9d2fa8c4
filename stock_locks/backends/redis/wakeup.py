"""Block on a wake-up signal list with a client-side deadline.

Locks and semaphores sleep in ``BLPOP`` on a signal list that a release
pushes to. Redis times out blocked clients only on its ``hz`` tick (every
100 ms by default), so a plain ``BLPOP key t`` returns up to 100 ms after
``t``: ``acquire(timeout=t)`` overshoots, and a waiter takes a dead holder's
lock up to 100 ms after the lease ended.

:func:`wait_for_signal` sends the ``BLPOP`` with a server timeout a little
beyond the wanted wait and waits for the reply on the socket itself, with a
deadline on ``time.monotonic()``. When the deadline passes first, the
connection is dropped (its ``BLPOP`` is still pending on the server, which
frees it as soon as it sees the close) instead of being returned to the pool.
A dropped connection costs a reconnect on its next use, which only the end of
a wait pays, never a wake-up.

A timeline of the one race left: the server pops the signal and writes the
reply after the last look at the socket, just before the close. That signal is
lost to everyone, but the caller was about to try again anyway (a lock or
semaphore retries after every wait), so the wake-up it carried is used.

On a Redis Cluster the ``BLPOP`` goes to the node that serves the key, on that
node's own connection, so redis-py's redirects do not apply. A node that does
not serve the key's slot (MOVED: a failover or a reshard moved it), a cluster
that is down for a moment, or a node that became a replica while the caller was
blocked on it (``UNBLOCKED``) pops nothing: the slot map is read again and the
wait ends as a wake-up, so the caller tries again at once, through the cluster
client, and waits next on the node the fresh map names.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .cluster import blocking_cap, node_client, refresh_slot_map
from .errors import NODE_ERRORS, STALE_ROUTE_ERRORS
from .requests import UNKNOWN

# How much later than the wanted wait the server's own BLPOP timeout is. The
# client-side deadline always comes first; the server timeout only frees the
# server's side if the client vanished without closing (a frozen host).
SERVER_MARGIN = 1.0  # seconds
# Redis reads a BLPOP timeout of 0 as "block forever": never send less.
MIN_WAIT = 0.001  # seconds
# The error a blocked client gets when its server stops being a master (a failover).
UNBLOCKED = "UNBLOCKED"


def wait_for_signal(client: Any, key: str, seconds: float) -> bool:
    """Pop one element of the list ``key``, waiting at most ``seconds``.

    Returns True when an element was popped (a release woke this caller), False
    when ``seconds`` passed first. The wait ends within about a millisecond of
    the deadline (plus scheduling), not on the server's next ``hz`` tick. It
    does not depend on the client's socket timeout, so a wait longer than that
    timeout needs no slicing.

    ``client`` is a redis-py ``Redis`` (or a ``RedisCluster``: the node that
    owns ``key`` is used). A client without a connection pool (e.g. a custom
    wrapper) falls back to a plain ``BLPOP`` in slices under its socket
    timeout, with Redis's own timing.

    Raises redis-py's ``ConnectionError``/``TimeoutError`` when Redis cannot be
    reached (on a cluster, after reading the slot map again). Any exception
    (KeyboardInterrupt included) drops the connection rather than put it back
    into the pool with a ``BLPOP`` still pending. On a cluster, a node that no
    longer serves the key (MOVED, CLUSTERDOWN, TRYAGAIN) makes it read the slot
    map again and wait on the node the fresh map names; when that node answers
    the same, or the wait was cut because its node stopped being a master
    (``UNBLOCKED``), it returns True having popped nothing: the caller looks again.
    """
    return wait_for_item(client, key, seconds) is not None


def wait_for_item(client: Any, key: str, seconds: float) -> bytes | None:
    """:func:`wait_for_signal` that returns what it popped: the element, or None when
    ``seconds`` passed first. On a cluster, a wait cut by a failover or a stale slot
    map returns ``b""`` (nothing popped: the caller looks again)."""
    return wait_then_run(client, key, seconds, None)[0]


def wait_then_run(
    client: Any, key: str, seconds: float, then: Callable[[Any], list[bytes]] | None
) -> tuple[bytes | None, Any]:
    """:func:`wait_for_item`, with a command sent behind the ``BLPOP`` on the same
    connection (``then(connection)``: its wire format; None: none), which the server
    runs as soon as the pop is served: (what :func:`wait_for_item` returns, the
    command's reply or its error reply as an exception object). The reply is None
    when no command was sent (a client without a pool: ``_plain_blpop``), and
    ``requests.UNKNOWN`` when one was and may have run, or may still run, with its
    reply lost: the deadline passed (the connection is dropped, and a server that
    sees the close late may serve the pop first), the wait was cut by a failover,
    or the connection broke after the pop."""
    seconds = max(float(seconds), MIN_WAIT)
    pool = _pool_for(client, key)
    if pool is None:
        return _plain_blpop(client, key, seconds), None
    deadline = time.monotonic() + seconds
    lost = None if then is None else UNKNOWN  # (``then``'s reply when the wait is cut)
    for attempt in range(2):
        try:
            return _blpop(pool, key, max(deadline - time.monotonic(), MIN_WAIT), then)
        except NODE_ERRORS:
            refresh_slot_map(client)
            raise
        except ResponseError as exc:
            unblocked = str(exc).startswith(UNBLOCKED)
            if not unblocked and not isinstance(exc, STALE_ROUTE_ERRORS):
                raise
            refresh_slot_map(client)
            if unblocked or attempt:  # cut by a failover: the holder may have changed, look again
                return b"", lost
        # Sent to a node that no longer serves the key (a stale slot map): once more,
        # to the node the fresh map names, for what is left of the wait.
        if deadline <= time.monotonic():
            return None, lost
        pool = _pool_for(client, key)
    raise AssertionError("unreachable")  # pragma: no cover


def _blpop(
    pool: Any, key: str, seconds: float, then: Callable[[Any], list[bytes]] | None
) -> tuple[bytes | None, Any]:
    deadline = time.monotonic() + seconds
    server_timeout = f"{seconds + SERVER_MARGIN:.3f}"
    for attempt in range(2):
        connection = pool.get_connection()
        try:
            try:
                command = connection.pack_command("BLPOP", key, server_timeout)
                connection.send_packed_command(
                    command if then is None else [*command, *then(connection)]
                )
            except RedisConnectionError:
                # A pooled connection the server closed meanwhile: one fresh try.
                connection.disconnect()
                if attempt:
                    raise
                continue
            if not _reply_before(connection, deadline):
                return None, (None if then is None else UNKNOWN)
            # (an error reply here is raised, and the connection dropped below: the
            # command's reply is still to come)
            reply = connection.read_response()
            popped = None if reply is None else _as_bytes(reply[1])
            if then is None:
                return popped, None
            try:
                return popped, connection.read_response()
            except ResponseError as exc:
                return popped, exc
            except (RedisConnectionError, RedisTimeoutError):
                connection.disconnect()
                return popped, UNKNOWN
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
    raise AssertionError("unreachable")  # pragma: no cover


def _reply_before(connection: Any, deadline: float) -> bool:
    """Whether a reply comes before ``deadline``; else the connection is dropped."""
    while True:
        remaining = deadline - time.monotonic()
        # can_read(0) is a non-blocking look: a reply already there is never dropped.
        if connection.can_read(max(remaining, 0.0)):
            return True
        if remaining <= 0:
            connection.disconnect()
            return False


def _plain_blpop(client: Any, key: str, seconds: float) -> bytes | None:
    cap = blocking_cap(client)
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        slice_ = remaining if cap is None else min(remaining, cap * 0.8)
        if reply := client.blpop([key], timeout=max(slice_, MIN_WAIT)):
            return _as_bytes(reply[1])


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _pool_for(client: Any, key: str) -> Any:
    """The connection pool that serves ``key`` (a cluster's node pool), or None."""
    return getattr(node_client(client, key), "connection_pool", None)
