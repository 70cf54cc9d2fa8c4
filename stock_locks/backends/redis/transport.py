"""The redis-py transport: performs the Redis backend's requests
(``stock_locks.backends.redis.requests``) on a ``Redis`` or ``RedisCluster`` client.

It only performs: a script, a command, a pipeline on one node, a batch (one
pipeline per node), a blocking pop, a slot map refresh, and a connection of
its own for a bounded request. The policies (NOSCRIPT, redirects, what a lost
reply means) are the requests module's.

A script runs on a connection the calling thread keeps (:class:`KeptConnections`),
lent once by the client's pool and kept while the thread lives: a lock's acquire
and release then skip the pool's bookkeeping on every call (a lock, a health
check, metrics), which costs about as long as the script itself takes in Redis.

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
        pool = getattr(client, "connection_pool", None)
        self._kept = KeptConnections(pool, _Lending(pool))

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
        script, keys, argv, head, _ = request.then
        return wait_then_run(
            self.client,
            request.key,
            request.seconds,
            lambda conn: packed_evalsha(conn, script.sha, keys, argv, head),
        )

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


class _Lending:
    """How many of a pool's connections threads keep (:class:`KeptConnections`): at most
    half the pool's bound, so that calls which borrow still find one; none from a
    pool whose callers wait for a free connection (``BlockingConnectionPool``)."""

    def __init__(self, pool: Any) -> None:
        blocking = isinstance(pool, redis.BlockingConnectionPool)
        usable = hasattr(pool, "owns_connection") and not blocking
        self.limit = int(getattr(pool, "max_connections", 0) or 0) // 2 if usable else 0
        self._reset()

    def _reset(self) -> None:
        self.pid, self.lock, self.count = os.getpid(), threading.Lock(), 0

    def admit(self) -> bool:
        if self.pid != os.getpid():
            self._reset()  # a forked child keeps none of the parent's
        with self.lock:
            if self.count >= self.limit:
                return False
            self.count += 1
            return True

    def returned(self) -> None:
        if self.pid == os.getpid():
            with self.lock:
                self.count = max(0, self.count - 1)


class _Lent:
    """One connection the pool lent a thread to keep; given back with the thread (when
    its locals are dropped) or when :meth:`KeptConnections.take` replaces it."""

    __slots__ = ("pool", "connection", "lending")

    def __init__(self, pool: Any, connection: Any, lending: _Lending) -> None:
        self.pool, self.connection, self.lending = pool, connection, lending

    def __del__(self) -> None:
        try:
            self.lending.returned()
            if self.connection.pid == os.getpid():  # (a forked child's pool was reset)
                self.pool.release(self.connection)
        except Exception:  # (interpreter shutdown)
            pass


class KeptConnections(threading.local):
    """The connection each thread keeps for its scripts on a plain ``redis.Redis``: lent
    by the client's pool once (counted there, closed by its ``disconnect()``, reset in
    a forked child) and kept while the thread lives, instead of borrowed and given
    back on every call; given back when the thread ends, when a call on it failed,
    and when the pool would not take it back as it is (``owns_connection``: a
    Sentinel pool that learned of a new primary). ``busy`` while a call uses it: a
    call nested in that one (a finalizer) borrows from the pool instead."""

    lent: _Lent | None = None
    busy = False

    def __init__(self, pool: Any, lending: _Lending) -> None:
        self.pool, self.lending = pool, lending

    def take(self) -> Any:
        """This thread's connection, marked busy; None: borrow one from the pool."""
        if self.busy:
            return None
        lent, pool = self.lent, self.pool
        if (
            lent is None
            or lent.connection.pid != os.getpid()
            or not pool.owns_connection(lent.connection)
        ):
            self.lent = None
            if not self.lending.admit():
                return None
            try:
                lent = self.lent = _Lent(pool, pool.get_connection(), self.lending)
            except BaseException:
                self.lending.returned()
                raise
        self.busy = True
        return lent.connection

    def drop(self) -> None:
        """Give this thread's connection back (a call on it failed)."""
        self.lent = None


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
    too, and a kept one closed is given back to the pool."""
    pool = client.connection_pool
    conn: Any = None
    borrowed = False
    try:
        conn = kept.take()
        borrowed = conn is None
        if borrowed:
            conn = pool.get_connection()
        else:
            conn.connect()  # (what the pool does on lending: the pool may have closed it)
        conn.send_packed_command(packed_evalsha(conn, sha, keys, argv, head))
        return conn.read_response()
    except (RedisConnectionError, RedisTimeoutError):
        if conn is None:
            raise
        _drop(conn, None if borrowed else kept)
    except ResponseError as exc:
        # (an error reply, read whole, e.g. NOSCRIPT: the connection is ready for its next
        # user. Dropping it would cost a reconnect, one that must ask the sentinels first;
        # READONLY says it reaches a replica now: dropped, the next one asks again)
        if isinstance(exc, ReadOnlyError) and conn is not None:
            _drop(conn, None if borrowed else kept)
        raise
    except BaseException:
        # (an interrupt mid-call: the reply may still come, and must not reach the
        # connection's next user; not every connection class drops itself then)
        if conn is not None:
            _drop(conn, None if borrowed else kept)
        raise
    finally:
        if conn is not None:
            if borrowed:
                pool.release(conn)
            else:
                kept.busy = False
    return client.execute_command("EVALSHA", sha, len(keys), *keys, *argv)


def _drop(conn: Any, kept: KeptConnections | None) -> None:
    """Close ``conn``; a kept one is given back to its pool (closed) too."""
    conn.disconnect()
    if kept is not None:
        kept.drop()


def packed_evalsha(
    conn: Any, sha: str, keys: Sequence[str], argv: Sequence[Any], head: CommandHead | None
) -> list[bytes]:
    """``EVALSHA`` in ``conn``'s wire format: ``head`` (packed once) and ARGV when the
    connection encodes UTF-8 as the head does, else packed whole by the connection."""
    if head is not None and conn.encoder.encoding == "utf-8":
        return [head.pack(conn.encoder.encode, argv)]
    return list(conn.pack_command("EVALSHA", sha, len(keys), *keys, *argv))


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
