"""The redis-py transport: performs the Redis backend's requests
(``stock_locks.backends.redis.requests``) on a ``Redis`` or ``RedisCluster`` client.

It only performs: a script, a command, a pipeline on one node, a batch (one
pipeline per node), a blocking pop, a slot map refresh, and a connection of
its own for a bounded request. The policies (NOSCRIPT, redirects, what a lost
reply means) are the requests module's.

A script runs on a connection the calling thread keeps (:class:`KeptConnections`),
made like the client's pool makes its connections but not lent by it: a lock's
acquire and release then skip the pool's bookkeeping (a lock, a health check,
metrics), about as long as the script itself takes in Redis. Each thread that
runs scripts holds one more connection to Redis, closed when the thread ends.

A bounded request (a clean-up after an interrupted call, a repeat after a lost
reply) must not hang the caller in turn: the pooled connections may have no
socket timeout, and the one in use when the call was interrupted has been
closed by redis-py. So it runs on a connection of its own, made by the pool's
connection class from the pool's arguments (a Sentinel-managed connection asks
the sentinels for the primary), whose every step waits at most
``GIVE_BACK_TIMEOUT``, and whose set-up (AUTH, SELECT) leaves in the same packet
as the request: if the reply is late, the request still runs when it reaches
the server. On a cluster it goes to the node serving the key; a redirect reads
the slot map again (the requests' policy), a transport error does not (a
refresh asks the nodes in turn and could outlast the bound).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..base import GIVE_BACK_TIMEOUT
from . import requests as rq
from .client import bounded_arguments
from .cluster import is_cluster, node_client, refresh_slot_map
from .errors import NODE_ERRORS
from .protocol import CommandHead
from .wakeup import wait_for_item, wait_then_run

_PLAIN_CLIENT = redis.Redis


class RedisTransport:
    """Performs requests on one redis-py client (see the module)."""

    __slots__ = ("client", "cluster", "_by_type", "_bounded_by_type", "_kept")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        self._by_type = rq.dispatch(self, bounded=False)
        self._bounded_by_type = rq.dispatch(self, bounded=True)
        self._kept = KeptConnections(client)

    def perform(self, request: Any) -> Any:
        """Perform one request; its reply (an error reply raised)."""
        return self._by_type[type(request)](request)

    def perform_bounded(self, request: Any) -> Any:
        """Perform one request of a bounded call (a script or command on a connection of
        its own, every step within ``GIVE_BACK_TIMEOUT``)."""
        return self._bounded_by_type[type(request)](request)

    def script(self, request: rq.Script) -> Any:
        script, keys, argv, head, repeatable = request
        client = self.client
        if repeatable and type(client) is _PLAIN_CLIENT and client.connection is None:
            return _evalsha_once(client, script.sha, keys, argv, head, self._kept)
        return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)

    def command(self, request: rq.Command) -> Any:
        return self.client.execute_command(*request.args)

    def pipeline(self, request: rq.Pipeline) -> list[Any]:
        node = node_client(self.client, request.key)
        try:
            pipe = node.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command)
            return list(pipe.execute(raise_on_error=False))
        except NODE_ERRORS:
            refresh_slot_map(self.client)
            raise

    def batch(self, request: rq.Batch) -> list[Any]:
        if not self.cluster:
            return _pipelined(self.client, [command for _, command in request.commands])
        replies: list[Any] = [None] * len(request.commands)
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for index, (key, _) in enumerate(request.commands):
            node = self.client.get_node_from_key(key)
            by_node.setdefault(node.name, (node, []))[1].append(index)
        for node, indexes in by_node.values():
            commands = [request.commands[i][1] for i in indexes]
            try:
                results = _pipelined(self.client.get_redis_connection(node), commands)
            except NODE_ERRORS as exc:
                results = [exc] * len(indexes)  # (one dead node does not hold up the others)
            for index, reply in zip(indexes, results, strict=True):
                replies[index] = reply
        return replies

    def pop(self, request: rq.Pop) -> bytes | None:
        return wait_for_item(self.client, request.key, request.seconds)

    def pop_then(self, request: rq.PopThen) -> tuple[bytes | None, Any]:
        client = self.client
        if type(client) is not _PLAIN_CLIENT or client.connection is not None:
            return wait_for_item(client, request.key, request.seconds), None
        script, keys, argv, head, _ = request.then

        def packed(connection: Any) -> list[bytes]:
            if head is not None and connection.encoder.encoding == "utf-8":
                return [head.pack(connection.encoder.encode, argv)]
            return list(connection.pack_command("EVALSHA", script.sha, len(keys), *keys, *argv))

        return wait_then_run(client.connection_pool, request.key, request.seconds, packed)

    def refresh_routes(self, request: rq.RefreshRoutes) -> None:
        refresh_slot_map(self.client)

    def blocking(self, request: rq.Blocking) -> Any:
        return request.function()

    def bounded(self, key: str | None, command: tuple[Any, ...]) -> Any:
        client = node_client(self.client, key) if key is not None else self.client
        return on_own_connection(client, command, GIVE_BACK_TIMEOUT)


def _pipelined(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(pipe.execute(raise_on_error=False))


class KeptConnections(threading.local):
    """The connection each thread keeps for its scripts on a plain ``redis.Redis``:
    made on first use by the client's pool's connection class from the pool's
    arguments (Sentinel, TLS, a password, a database all follow), connected again
    after it was closed, and made anew where the pool would drop it on its return
    (``owns_connection``: a Sentinel pool that learned of a new primary), in a
    forked child (the parent's socket is the parent's), and with the thread (its
    finalizer closes it)."""

    connection: Any = None
    busy = False  # a call uses it: a call nested in that one (a finalizer) borrows

    def __init__(self, client: Any) -> None:
        self.pool: Any = getattr(client, "connection_pool", None)

    def take(self) -> Any:
        """This thread's connection, marked busy (None: borrow one from the pool)."""
        if self.busy:
            return None
        connection, pool = self.connection, self.pool
        if connection is None or connection.pid != os.getpid():
            connection = self.connection = self._make()
        elif not pool.owns_connection(connection):
            connection.disconnect()
            connection = self.connection = self._make()
        if connection is not None:
            self.busy = True
        return connection

    def _make(self) -> Any:
        pool = self.pool
        make = getattr(pool, "connection_class", None)
        arguments = getattr(pool, "connection_kwargs", None)
        if make is None or arguments is None or not hasattr(pool, "owns_connection"):
            return None
        return make(**arguments)


def _evalsha_once(
    client: Any,
    sha: str,
    keys: Sequence[str],
    argv: Sequence[Any],
    head: CommandHead | None,
    kept: KeptConnections,
) -> Any:
    """EVALSHA on the calling thread's kept connection (``kept``; else a pooled one) of
    a plain ``redis.Redis``, without the per-call bookkeeping of its
    ``execute_command`` (and with ``head``, packing only ARGV). A transport error
    closes the connection and sends the call again through ``execute_command`` (the
    client's own retries): every script is safe to repeat. An error reply leaves the
    connection ready (READONLY aside); any other exception (an interrupt) closes it
    too. A closed kept connection connects again on its next use."""
    pool = client.connection_pool
    conn: Any = kept.take()
    borrowed = conn is None
    if borrowed:
        conn = pool.get_connection()
    try:
        if not borrowed:
            # (as the pool does on lending one: a Sentinel-managed connection asks the
            # sentinels for the primary there; sending on an unconnected one would dial
            # the service name)
            conn.connect()
        if head is not None and conn.encoder.encoding == "utf-8":  # (the head's encoding)
            conn.send_packed_command([head.pack(conn.encoder.encode, argv)])
        else:
            conn.send_command("EVALSHA", sha, len(keys), *keys, *argv)
        return conn.read_response()
    except (RedisConnectionError, RedisTimeoutError):
        conn.disconnect()
    except ResponseError as exc:
        # (an error reply, read whole, e.g. NOSCRIPT: the connection is ready for its next
        # user. Dropping it would cost a reconnect, one that must ask the sentinels first;
        # READONLY says it reaches a replica now: dropped, the next one asks again)
        if isinstance(exc, ReadOnlyError):
            conn.disconnect()
        raise
    except BaseException:
        # (an interrupt mid-call: the reply may still come, and must not reach the
        # connection's next user; not every connection class drops itself then)
        conn.disconnect()
        raise
    finally:
        if borrowed:
            pool.release(conn)
        else:
            kept.busy = False
    return client.execute_command("EVALSHA", sha, len(keys), *keys, *argv)


def on_own_connection(client: Any, command: tuple[Any, ...], timeout: float) -> Any:
    """``command`` on a new connection of ``client``'s pool (its connection class, its
    arguments) whose every step waits at most ``timeout``; its reply. A client
    without a pool runs it with its own timeouts."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return client.execute_command(*command)
    arguments, prelude = bounded_arguments(pool.connection_class, pool.connection_kwargs, timeout)
    connection = pool.connection_class(**arguments)
    try:
        # (connect() first: a Sentinel-managed connection asks the sentinels for the
        # primary there; sending on an unconnected one would dial the service name)
        connection.connect()
        connection.send_packed_command(connection.pack_commands([*prelude, command]))
        for _ in prelude:
            connection.read_response()
        return connection.read_response()
    finally:
        connection.disconnect()
