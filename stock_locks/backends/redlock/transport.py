"""The redis-py transport of RedLock: a round to every master at once, and a blocking pop
on one master.

A :class:`Round` sends each master its commands on one pooled connection, all
masters at once, and reads every reply within one deadline of ``NODE_TIMEOUT``:
a master that stalls costs at most that, and a dead one nothing. A master that
does not answer in time is counted as :class:`~.quorum.Failed` (its connection
dropped, so that a late reply never reaches the connection's next user).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import redis
from redis.exceptions import ResponseError

from ..redis.errors import UNAVAILABLE_ERRORS
from ..redis.requests import Blocking
from ..redis.wakeup import wait_for_item
from .quorum import Failed


class Round(NamedTuple):
    """``commands[i]`` (a list of commands) to master ``i``, all at once, read with one
    deadline; the replies per master, each a reply or a :class:`Failed`."""

    commands: Sequence[Sequence[tuple[Any, ...]]]


class MasterPop(NamedTuple):
    """A blocking pop of the list ``key`` on master ``master`` (see ``requests.Pop``)."""

    master: int
    key: str
    seconds: float


class RedLockTransport:
    """Performs RedLock's requests on one redis-py client per master."""

    def __init__(self, clients: Sequence[Any], node_timeout: float) -> None:
        self.clients = list(clients)
        self.node_timeout = node_timeout

    def perform(self, request: Any) -> Any:
        if type(request) is Round:
            return self._round(request.commands)
        if type(request) is MasterPop:
            return wait_for_item(self.clients[request.master], request.key, request.seconds)
        assert type(request) is Blocking
        return request.function()

    def _round(self, commands: Sequence[Sequence[tuple[Any, ...]]]) -> list[list[Any]]:
        sent: list[tuple[int, Any]] = []
        results: list[list[Any]] = [[] for _ in commands]
        for index, batch in enumerate(commands):
            if not batch:
                continue
            pool = self.clients[index].connection_pool
            try:
                connection = pool.get_connection()  # (connects: fails fast on a dead master)
            except UNAVAILABLE_ERRORS as exc:
                results[index] = [Failed(exc)] * len(batch)
                continue
            try:
                connection.send_packed_command(connection.pack_commands(batch))
            except BaseException as exc:
                connection.disconnect()
                pool.release(connection)
                if not isinstance(exc, UNAVAILABLE_ERRORS):
                    self._drop(sent)
                    raise
                results[index] = [Failed(exc)] * len(batch)
                continue
            sent.append((index, connection))
        deadline = time.monotonic() + self.node_timeout
        try:
            while sent:
                index, connection = sent[0]
                results[index] = self._replies(connection, len(commands[index]), deadline)
                self.clients[index].connection_pool.release(connection)
                sent.pop(0)
        except BaseException:
            self._drop(sent)
            raise
        return results

    def _replies(self, connection: Any, count: int, deadline: float) -> list[Any]:
        """The next ``count`` replies on ``connection``, each by ``deadline``."""
        replies: list[Any] = []
        while len(replies) < count:
            try:
                if not connection.can_read(max(0.0, deadline - time.monotonic())):
                    raise redis.TimeoutError(f"no reply within {self.node_timeout}s")
                replies.append(connection.read_response())
            except ResponseError as exc:  # an error reply: the connection stays usable
                replies.append(Failed(exc))
            except UNAVAILABLE_ERRORS as exc:
                connection.disconnect()  # a late reply must not reach the next user
                replies.extend([Failed(exc)] * (count - len(replies)))
        return replies

    def _drop(self, sent: list[tuple[int, Any]]) -> None:
        for index, connection in sent:
            connection.disconnect()
            self.clients[index].connection_pool.release(connection)
