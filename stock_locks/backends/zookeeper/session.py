"""A ZooKeeper backend's kazoo client and its session, per process, and how an
operation runs its kazoo calls (:func:`zookeeper_operation`).

Connected on first use and made again in a forked child (the parent's client and
grants are not the child's). kazoo reports the session's states on its own
thread: a session that expired takes every ephemeral child of this process with
it, and kazoo refuses every request until it has a new one; a caller then waits,
at most the connect timeout, for the new session.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, NamedTuple, ParamSpec, Protocol, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError

from ...exceptions import ZooKeeperUnavailable
from ..base import Operation

if TYPE_CHECKING:
    from .backend import ZooKeeperBackend

T = TypeVar("T")
P = ParamSpec("P")


class Blocking(NamedTuple):
    """The one request of a ZooKeeper operation: its kazoo calls, run in the caller's
    thread (every call waits for its replies, at most the operation timeout)."""

    function: Any


def zookeeper_operation(
    method: Callable[Concatenate[ZooKeeperBackend, P], T],
) -> Callable[Concatenate[ZooKeeperBackend, P], Operation[T]]:
    """A backend operation (a generator of one :class:`Blocking` request) made of a
    method that does its kazoo calls itself."""

    def operation(self: ZooKeeperBackend, /, *args: P.args, **kwargs: P.kwargs) -> Operation[T]:
        result: T = yield Blocking(functools.partial(method, self, *args, **kwargs))
        return result

    operation.__name__ = method.__name__
    operation.__qualname__ = method.__qualname__
    operation.__doc__ = method.__doc__
    return operation


class SessionOwner(Protocol):
    """What the backend is told of its session (on kazoo's thread: must not block)."""

    def forked(self) -> None: ...

    def connected(self, client: KazooClient) -> None: ...

    def session_lost(self) -> None: ...


class Session:
    """The kazoo client of one backend in this process (see the module)."""

    def __init__(
        self,
        alias: str,
        hosts: str,
        session_timeout: float,
        connect_timeout: float,
        client_kwargs: dict[str, Any],
        owner: SessionOwner,
    ) -> None:
        self.alias = alias
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self._client_kwargs = client_kwargs
        self._owner = owner
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._kazoo: KazooClient | None = None
        self._alive = threading.Event()  # cleared from a session's expiry to the next one
        self._alive.set()

    @property
    def client(self) -> KazooClient:
        """The kazoo client of this process, connected on first use.

        Raises :class:`ZooKeeperUnavailable` when it cannot connect, or when its
        session expired and no new one came within the connect timeout."""
        client = self._kazoo
        if client is None or self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._reset()
                    self._owner.forked()
                if self._kazoo is None:
                    self._kazoo = self._connect()
                client = self._kazoo
        if not self._alive.is_set() or client.state == KazooState.LOST:
            # The session expired: kazoo refuses every request until it has a new one.
            # (kazoo says LOST an instant before the listener clears ``_alive``.)
            deadline = time.monotonic() + self.connect_timeout
            while client.state == KazooState.LOST and time.monotonic() < deadline:
                self._alive.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            if client.state == KazooState.LOST:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper unavailable (backend {self.alias!r}): the session expired "
                    f"and no new one within {self.connect_timeout}s",
                    backend=self.alias,
                )
        return client

    def _connect(self) -> KazooClient:
        kwargs = {
            "connection_retry": {"max_tries": -1, "delay": 0.05, "max_delay": 1.0},
            **self._client_kwargs,
        }
        client = KazooClient(hosts=self.hosts, timeout=self.session_timeout, **kwargs)
        client.add_listener(self._on_state)
        try:
            client.start(timeout=self.connect_timeout)
        except KazooTimeoutError as exc:
            raise ZooKeeperUnavailable(
                f"ZooKeeper unavailable (backend {self.alias!r}): no connection to "
                f"{self.hosts} within {self.connect_timeout}s",
                backend=self.alias,
            ) from exc
        return client

    def close(self) -> None:
        with self._lock:
            client, self._kazoo = self._kazoo, None
        if client is not None and self._pid == os.getpid():
            client.stop()
            client.close()

    def id(self) -> int | None:
        """The id of this process's session now (None while disconnected)."""
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    def _on_state(self, state: str) -> None:
        # On kazoo's thread: must not block.
        if state == KazooState.CONNECTED:
            self._alive.set()
            if self._kazoo is not None:
                self._owner.connected(self._kazoo)
        if state != KazooState.LOST:
            return
        if self._kazoo is not None:  # (not a first connection that failed)
            self._alive.clear()
        self._owner.session_lost()
