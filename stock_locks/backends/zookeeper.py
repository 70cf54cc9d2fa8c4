"""ZooKeeper: a lock held by a session and fenced by the consensus log.

Configured as a ``BACKENDS`` alias (needs the ``[zookeeper]`` extra, kazoo)::

    "zk": {
        "BACKEND": "stock_locks.backends.zookeeper.ZooKeeperBackend",
        "LOCATION": "zk1:2181,zk2:2181,zk3:2181",   # or a list of host:port
        "OPTIONS": {"ROOT": "/stock_locks", "SESSION_TIMEOUT": 10, "CONNECT_TIMEOUT": 5},
    }

The queue. Lock ``name`` is the znode ``<ROOT>/locks/<name, percent-encoded>``;
each contender is an ephemeral sequential child ``<token>-<sequence>`` holding
the holder's record (JSON: token, count, host, pid, thread, caller, watchdog).
The child with the lowest sequence number holds the lock. A try creates its
child and lists the queue in one round trip (ZooKeeper answers a session's
requests in order); when its child is not first it deletes it again and is
refused, so a caller that gives up leaves nothing behind. A waiter then queues a
child of its own and sets a watch on the child just before it, only that one:
a release wakes one waiter, and a waiter whose predecessor left without holding
(it gave up) watches the next one instead, without waking anybody. Nobody polls.

The fence is the holder's child's creation zxid (``czxid``): the position of
its creation in the ensemble's log. Every later grant of the name is a child
created later, so its zxid is greater, across leader elections too (a new
leader starts a new epoch, the high 32 bits of every zxid it assigns).

Sessions, not leases. A grant lasts as long as the client's session: its child
is ephemeral and the ensemble deletes it when the session expires (the process
died, or was paused or cut off for longer than ``SESSION_TIMEOUT``). Then
``lost`` is set on the Lock (from the session listener once this client learns
the session expired, or from the watchdog's check), ``release()`` raises
:class:`~stock_locks.exceptions.LockNotOwned`, and a paused holder's fenced
writes are refused because the next holder's fence is greater. What the Lock
arguments mean here:

- ``ttl``: no lease. It bounds how long a waiter sleeps before it looks at
  the queue again when no wake-up came (a safety net: the watch wakes it).
  ``extend()`` only checks that the token still holds the lock.
- ``watchdog``: a check every ``ttl / 3`` that the holder's child still
  exists; it sets ``lost`` as soon as it does not. ``max_hold``: the watchdog
  deletes the child once the lock was held that long (this process's clock),
  so a hung but alive worker loses it.
- The backend declares ``SESSION_BOUND`` and not ``LEASED`` or
  ``SERVER_CLOCK``; ``LockInfo.remaining`` and ``ttl`` are None, and
  ``acquired_at`` is the child's creation time on the leader's clock.

Every call is safe to repeat. A try finds the children of its token (a create
whose reply was lost) and keeps only the oldest; a release after a lost reply
is recognised (this process remembers the tokens it released or tried to), and
an acquire's give-back deletes every child of its token and makes this
process refuse later tries with it. One kazoo client per backend and process,
made on first use (a forked child makes its own).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from django.core.exceptions import ImproperlyConfigured
from kazoo import exceptions as kazoo_errors
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
    ZookeeperStoppedError,
)
from kazoo.handlers.threading import KazooTimeoutError

from ..exceptions import LockError, LockNotOwned, ZooKeeperUnavailable
from ..holder import LockInfo, process_identity, thread_name
from ..lease import Attempt, Call
from ..roundtrip import GIVE_BACK_TIMEOUT
from .base import FENCED, FORCE_RELEASE, HOLDER_METADATA, SESSION_BOUND, WAKE_UP, Backend

# lock_release's outcomes and the watchdog's "cut at max_hold" (the values of backends.redis).
NOT_OWNED, RELEASED, STILL_HELD = 0, 1, 2
CAPPED = 2

ROOT = "/stock_locks"
SESSION_TIMEOUT = 10.0  # seconds: how long the ensemble keeps a silent client's session
CONNECT_TIMEOUT = 5.0  # seconds: the longest the first call waits to connect
REMEMBERED = 4096  # released, forced and given-back tokens this process remembers

# (kazoo >= 2.11; before, a request's timeout is an OperationTimeoutError)
RequestTimeoutError: type[Exception] = getattr(
    kazoo_errors, "RequestTimeoutError", OperationTimeoutError
)
# Errors after which a request may or may not have run.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionLoss, SessionExpiredError, OperationTimeoutError, RequestTimeoutError,
    SessionMovedError, ZookeeperStoppedError, KazooTimeoutError,
)  # fmt: skip

_TOKEN = re.compile(r"[A-Za-z0-9_.~]+")
_SEQUENCE_DIGITS = 10  # ZooKeeper's sequence suffix


class ZooKeeperKeys(NamedTuple):
    """Where a lock lives: ``lock`` is its znode (the parent of its queue)."""

    lock: str


class _Held:
    """A grant this process holds: its child, fence, record, session and owner."""

    __slots__ = ("path", "czxid", "record", "session", "hold", "granted", "lost")

    def __init__(self, path: str, czxid: int, record: dict, session: Any, hold: Any) -> None:
        self.path = path
        self.czxid = czxid
        self.record = record
        self.session = session
        self.hold = hold  # weakref to the Lock's per-owner state (None: unknown)
        self.granted = time.monotonic()
        self.lost = False


class _Remembered:
    """A bounded set (oldest forgotten first)."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self._items: OrderedDict[Any, None] = OrderedDict()
        self._size = size

    def add(self, item: Any) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def discard(self, item: Any) -> None:
        self._items.pop(item, None)

    def __contains__(self, item: Any) -> bool:
        return item in self._items


def node_name(name: str) -> str:
    """``name`` as one znode name (percent-encoded; reversible with :func:`name_of`)."""
    text = quote(name, safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text


def name_of(node: str) -> str:
    return unquote(node)


def token_of(child: str) -> str:
    """The token of a queue child ``<token>-<sequence>``."""
    return child.rsplit("-", 1)[0]


def queue_order(children: Sequence[str]) -> list[str]:
    """The queue's children, first (the holder) first."""
    return sorted(
        (c for c in children if c[-_SEQUENCE_DIGITS:].isdigit()),
        key=lambda c: int(c[-_SEQUENCE_DIGITS:]),
    )


def _hold_of(lock: Any) -> Any:
    """A weak reference to the calling owner's hold state of ``lock`` (its ``lost`` flag
    is what the session listener sets), or None for an object without one."""
    hold = getattr(lock, "_hold", None)
    try:
        return weakref.ref(hold()) if hold is not None else None
    except TypeError:
        return None


class ZooKeeperBackend(Backend):
    """Locks on a ZooKeeper ensemble (no semaphores: see the README)."""

    capabilities = frozenset({FENCED, SESSION_BOUND, WAKE_UP, HOLDER_METADATA, FORCE_RELEASE})

    def __init__(
        self,
        alias: str = "zookeeper",
        *,
        location: str | Sequence[str] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(alias)
        if not location:
            raise ImproperlyConfigured(
                f"stock_locks backend {alias!r}: LOCATION must name the ZooKeeper servers "
                '("host:port,host:port" or a list of "host:port")'
            )
        self.hosts = location if isinstance(location, str) else ",".join(location)
        options = dict(options or {})
        root = str(options.pop("ROOT", ROOT)).rstrip("/")
        if not root.startswith("/") or root == "":
            raise ImproperlyConfigured(
                f"stock_locks backend {alias!r}: OPTIONS['ROOT'] must be an absolute znode "
                f"path other than '/', got {root!r}"
            )
        self.root = root
        self.session_timeout = float(options.pop("SESSION_TIMEOUT", SESSION_TIMEOUT))
        self.connect_timeout = float(options.pop("CONNECT_TIMEOUT", CONNECT_TIMEOUT))
        # A request not answered within a session timeout is answered by the session's end.
        self.operation_timeout = float(options.pop("OPERATION_TIMEOUT", self.session_timeout))
        self._client_kwargs = {key.lower(): value for key, value in options.items()}
        self._client_lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        """This process's state (made again in a forked child, which owns none of it)."""
        self._pid = os.getpid()
        self._kazoo: KazooClient | None = None
        self._state_lock = threading.Lock()
        self._held: dict[str, _Held] = {}  # token -> grant
        self._released = _Remembered()  # (lock path, token) released or maybe released
        self._forced = _Remembered()  # (lock path, token) force-released from here
        self._given_back = _Remembered()  # tokens of acquires that gave up
        self._orphans: dict[tuple[str, str], None] = {}  # give-backs that failed: (path, token)
        self._waiting: set[threading.Event] = set()
        self._local = threading.local()
        self._alive = threading.Event()  # cleared from a session's expiry to the next one
        self._alive.set()

    def __repr__(self) -> str:
        return f"<ZooKeeperBackend {self.alias!r} {self.hosts}{self.root}>"

    # -- the client ---------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The kazoo client of this process, connected on first use."""
        client = self._kazoo
        if client is None or self._pid != os.getpid():
            with self._client_lock:
                if self._pid != os.getpid():
                    self._reset()  # (the parent's client and grants are not this child's)
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
        with self._client_lock:
            client, self._kazoo = self._kazoo, None
        if client is not None and self._pid == os.getpid():
            client.stop()
            client.close()

    def session(self) -> int | None:
        """The id of this process's session now (None while disconnected)."""
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    def _on_state(self, state: str) -> None:
        # On kazoo's thread: must not block. LOST: the session expired, and with it
        # every ephemeral child of this process.
        if state == KazooState.CONNECTED:
            self._alive.set()
            if self._orphans and self._kazoo is not None:
                self._kazoo.handler.spawn(self._sweep)
        if state != KazooState.LOST:
            return
        if self._kazoo is not None:  # (not a first connection that failed)
            self._alive.clear()
        with self._state_lock:
            held = list(self._held.values())
            waiting = list(self._waiting)
        for grant in held:
            grant.lost = True
            hold = grant.hold() if grant.hold is not None else None
            if hold is not None:
                hold.lost = True
        for event in waiting:
            event.set()  # (their queued children are gone: look again)

    def execute(self, call: Call) -> Any:
        operation = getattr(self, call.verb)
        try:
            try:
                return operation(*call.args, bounded=call.bounded)
            except SessionExpiredError:
                # The session ended under this call: what it did there went with it (its
                # children were ephemeral), so it runs once more, in the next session.
                return operation(*call.args, bounded=call.bounded)
        except TRANSPORT_ERRORS as exc:
            raise ZooKeeperUnavailable(
                f"ZooKeeper unavailable (backend {self.alias!r}): {type(exc).__name__} {exc}",
                backend=self.alias,
            ) from exc

    def _timeout(self, bounded: bool) -> float:
        return GIVE_BACK_TIMEOUT if bounded else self.operation_timeout

    # -- queue primitives ---------------------------------------------------------------------

    def lock_keys(self, name: str) -> ZooKeeperKeys:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a lock name must be a non-empty string, got {name!r}")
        return ZooKeeperKeys(f"{self.root}/locks/{node_name(name)}")

    def _record(self, lock: Any, token: str, count: int) -> dict:
        host, pid = process_identity()
        return {
            "token": token, "count": count, "host": host, "pid": pid, "thread": thread_name(),
            "caller": lock.caller, "watchdog": bool(lock.watchdog),
        }  # fmt: skip

    def _children(self, path: str, timeout: float) -> list[str]:
        try:
            return self.client.get_children_async(path).get(timeout=timeout)
        except NoNodeError:
            return []

    def _enqueue(self, path: str, token: str, record: dict, timeout: float) -> tuple:
        """Queue a child for ``token``: (its name, its czxid, the queue's children after).
        The create and the listing go together (one round trip)."""
        data = json.dumps(record).encode()
        client = self.client
        for _ in range(3):
            created = client.create_async(
                f"{path}/{token}-", data, ephemeral=True, sequence=True, makepath=True,
                include_data=True,
            )  # fmt: skip
            listing = client.get_children_async(path)
            try:
                child_path, stat = created.get(timeout=timeout)
            except NodeExistsError:  # (a parent made by another client meanwhile)
                continue
            child = child_path.rsplit("/", 1)[1]
            try:
                children = listing.get(timeout=timeout)
            except NoNodeError:
                children = []
            if child not in children:  # (the parent was made by this create: list again)
                children = self._children(path, timeout)
            return child, stat.czxid, children
        raise ZooKeeperUnavailable(f"could not queue for {path}", backend=self.alias)

    def _delete(self, paths: Sequence[str], timeout: float) -> int:
        """Delete ``paths`` (sent together); how many existed."""
        requests = [self.client.delete_async(path) for path in paths]
        deleted = 0
        for request in requests:
            try:
                request.get(timeout=timeout)
                deleted += 1
            except NoNodeError:
                pass
        return deleted

    def _own(self, path: str, token: str, timeout: float) -> list[str]:
        """The full paths of ``token``'s children in the queue of ``path``, oldest first."""
        return [f"{path}/{c}" for c in queue_order(self._children(path, timeout))
                if token_of(c) == token]  # fmt: skip

    def _forget(self, token: str) -> _Held | None:
        with self._state_lock:
            return self._held.pop(token, None)

    def _pending(self) -> dict[str, tuple[str, str, int]]:
        """This thread's queued waiters: lock path -> (token, child, czxid)."""
        pending = getattr(self._local, "pending", None)
        if pending is None:
            pending = self._local.pending = {}
        return pending

    def _refused(self) -> dict[str, str]:
        """This thread's last refused token per lock path (the one lock_wait queues)."""
        refused = getattr(self._local, "refused", None)
        if refused is None:
            refused = self._local.refused = {}
        return refused

    # -- lock operations ------------------------------------------------------------------------

    def lock_try(
        self, lock: Any, token: str, depth: int, waited: bool, *, bounded: bool = False
    ) -> Attempt:
        """One try. Granted when this token's oldest child is first in the queue (made
        now, or queued by :meth:`lock_wait`); otherwise its children are deleted again.

        Raises :class:`LockNotOwned` for a re-entry (``depth`` > 0) whose token no longer
        holds the lock, :class:`LockError` for a token already given back.
        """
        if depth:
            return self._reenter(lock, token, depth, self._timeout(bounded))
        if token in self._given_back:
            raise LockError(
                f"lock {lock.name!r}: this try's token was already given back", name=lock.name
            )
        if not _TOKEN.fullmatch(token):
            raise LockError(f"lock {lock.name!r}: token {token!r} is not [A-Za-z0-9_.~]+")
        path, timeout = lock.keys.lock, self._timeout(bounded)
        record = self._record(lock, token, 1)
        queued = self._pending().pop(path, None)
        children: list[str] = []
        czxid: int | None = None
        if queued is not None and queued[0] == token:
            children = self._children(path, timeout)
            child, czxid = queued[1], queued[2]
            if child not in children:  # (its session ended, or an operator deleted it)
                queued = None
        if queued is None or queued[0] != token:
            child, czxid, children = self._enqueue(path, token, record, timeout)
        ordered = queue_order(children)
        if self._orphans and any((path, token_of(c)) in self._orphans for c in ordered):
            orphans = [c for c in ordered if (path, token_of(c)) in self._orphans]
            self._delete([f"{path}/{c}" for c in orphans], timeout)
            ordered = [c for c in ordered if c not in orphans]
            with self._state_lock:
                for c in orphans:
                    self._orphans.pop((path, token_of(c)), None)
        mine = [c for c in ordered if token_of(c) == token]
        if mine and ordered[0] == mine[0]:
            if len(mine) > 1:  # a repeated try's: keep the oldest
                self._delete([f"{path}/{c}" for c in mine[1:]], timeout)
            if mine[0] != child:
                _, stat = self.client.get_async(f"{path}/{mine[0]}").get(timeout=timeout)
                czxid = stat.czxid
            grant = _Held(f"{path}/{mine[0]}", int(czxid or 0), record, self.session(),
                          _hold_of(lock))  # fmt: skip
            with self._state_lock:
                self._held[token] = grant
            self._refused().pop(path, None)
            return Attempt(True, fence=grant.czxid, count=1)
        self._delete([f"{path}/{c}" for c in mine], timeout)
        self._refused()[path] = token
        return Attempt(False)

    def _reenter(self, lock: Any, token: str, depth: int, timeout: float) -> Attempt:
        grant = self._held.get(token)
        lost = LockNotOwned(
            f"cannot re-enter {lock.name!r}: this owner's token no longer holds it "
            "(its session ended or it was force-released)",
            name=lock.name,
        )
        if grant is None or grant.lost:
            self._forget(token)
            raise lost
        record = {**grant.record, "count": depth + 1}
        try:
            self.client.set_async(grant.path, json.dumps(record).encode()).get(timeout=timeout)
        except NoNodeError:
            self._forget(token)
            raise lost from None
        grant.record = record
        return Attempt(True, fence=grant.czxid, count=depth + 1)

    def lock_wait(self, lock: Any, seconds: float, *, bounded: bool = False) -> bool:
        """Queue behind the holder and sleep until this thread's child is first (True)
        or ``seconds`` pass (False). Watches only the child just before its own; the
        next :meth:`lock_try` of the same token finds the queued child."""
        path, timeout = lock.keys.lock, self._timeout(bounded)
        deadline = time.monotonic() + seconds
        token = self._refused().pop(path, None)
        pending = self._pending()
        queued = pending.get(path)
        if token is None and queued is None:
            return self._wait_for_holder(path, deadline, timeout)
        if queued is None or (token is not None and queued[0] != token):
            assert token is not None
            child, czxid, children = self._enqueue(
                path, token, self._record(lock, token, 1), timeout
            )
            pending[path] = queued = (token, child, czxid)
        else:
            children = self._children(path, timeout)
        child = queued[1]
        while True:
            ordered = queue_order(children)
            if child not in ordered or ordered[0] == child:
                return True  # first (or gone: the next try queues again)
            before = ordered[ordered.index(child) - 1]
            if self._sleep_on(f"{path}/{before}", deadline, timeout) is False:
                return False
            children = self._children(path, timeout)

    def _sleep_on(self, path: str, deadline: float, timeout: float) -> bool | None:
        """Sleep until the znode ``path`` changes or goes (True), or the deadline
        (False); None when it is already gone."""
        event = threading.Event()

        def woken(_: Any) -> None:
            event.set()

        # A data watch (not exists(): on a missing znode that would stay registered
        # until a znode of that name is created, which a sequential name never is).
        try:
            self.client.get_async(path, watch=woken).get(timeout=timeout)
        except NoNodeError:
            return None
        with self._state_lock:
            self._waiting.add(event)
        try:
            return event.wait(max(0.0, deadline - time.monotonic()))
        finally:
            with self._state_lock:
                self._waiting.discard(event)

    def _wait_for_holder(self, path: str, deadline: float, timeout: float) -> bool:
        # (a wait without a refused try before it: watch the holder itself)
        ordered = queue_order(self._children(path, timeout))
        if not ordered:
            return True
        return self._sleep_on(f"{path}/{ordered[0]}", deadline, timeout) is not False

    def lock_release(
        self, lock: Any, token: str, depth: int, mode: str = "release", *, bounded: bool = False
    ) -> int:
        """RELEASED (the child deleted, or deleted by an earlier call of this process
        whose reply was lost), STILL_HELD (a reentrant hold counted down), NOT_OWNED
        (the token holds nothing: its session ended, or it was force-released).
        ``mode`` "abandon" (an acquire's give-back) deletes every child of the token,
        queued or holding, and refuses later tries with it."""
        path, timeout = lock.keys.lock, self._timeout(bounded)
        key = (path, token)
        if mode != "release":
            self._given_back.add(token)
            self._refused().pop(path, None)
            queued = self._pending().get(path)
            if queued is not None and queued[0] == token:
                del self._pending()[path]
        grant = self._held.get(token)
        if depth > 1 and mode == "release":
            return self._count_down(grant, token, depth, timeout)
        if grant is not None and grant.lost:
            self._forget(token)
            return NOT_OWNED
        before = key in self._released  # an earlier call of this process sent the delete
        self._released.add(key)  # (kept when this reply is lost: the repeat recognises it)
        try:
            if grant is not None and mode == "release":
                paths = [grant.path]
            else:
                paths = sorted({*self._own(path, token, timeout), *([grant.path] if grant else [])})
            deleted = self._delete(paths, timeout) if paths else 0
        except TRANSPORT_ERRORS:
            if mode != "release":
                # A child nobody will release would hold the queue for the session's life:
                # deleted on reconnection, or by this process's next try of the lock.
                with self._state_lock:
                    self._orphans[key] = None
            raise
        self._forget(token)
        if deleted or before:
            return RELEASED
        self._released.discard(key)
        return NOT_OWNED

    def _sweep(self) -> None:
        """Delete the children of give-backs that failed (on kazoo's handler, after a
        reconnection); what fails again stays for the next reconnection or try."""
        with self._state_lock:
            orphans = list(self._orphans)
        for path, token in orphans:
            try:
                self._delete(self._own(path, token, self.operation_timeout),
                             self.operation_timeout)  # fmt: skip
            except TRANSPORT_ERRORS:
                continue
            with self._state_lock:
                self._orphans.pop((path, token), None)

    def _count_down(self, grant: _Held | None, token: str, depth: int, timeout: float) -> int:
        if grant is None or grant.lost:
            self._forget(token)
            return NOT_OWNED
        record = {**grant.record, "count": depth - 1}
        try:
            self.client.set_async(grant.path, json.dumps(record).encode()).get(timeout=timeout)
        except NoNodeError:
            self._forget(token)
            return NOT_OWNED
        grant.record = record
        return STILL_HELD

    def lock_extend(
        self, lock: Any, token: str, ttl_ms: int, max_hold_ms: int = 0, *, bounded: bool = False
    ) -> int:
        """1 while ``token`` still holds the lock, else 0. There is no lease to extend:
        the grant lasts as long as the session."""
        return self._still_held(lock.keys.lock, token, self._timeout(bounded))

    def _still_held(self, path: str, token: str, timeout: float) -> int:
        grant = self._held.get(token)
        if grant is not None:
            if grant.lost or self.client.exists_async(grant.path).get(timeout=timeout) is None:
                grant.lost = True
                return 0
            return 1
        ordered = queue_order(self._children(path, timeout))
        return int(bool(ordered) and token_of(ordered[0]) == token)

    def lock_inspect(
        self, name: str, keys: ZooKeeperKeys, *, bounded: bool = False
    ) -> LockInfo | None:
        """The holder (the first child) of lock ``name``, or None when free. Two round
        trips (the queue, then the holder's record)."""
        timeout = self._timeout(bounded)
        while True:
            ordered = queue_order(self._children(keys.lock, timeout))
            if not ordered:
                return None
            try:
                data, stat = self.client.get_async(f"{keys.lock}/{ordered[0]}").get(timeout)
            except NoNodeError:
                continue  # released meanwhile: look again
            return self._info(name, ordered[0], data, stat)

    def _info(self, name: str, child: str, data: bytes, stat: Any) -> LockInfo:
        try:
            record = json.loads(data.decode())
        except ValueError:
            record = {}
        if not isinstance(record, dict):
            record = {}

        def text(field: str) -> str | None:
            value = record.get(field)
            return None if value is None else str(value)

        return LockInfo(
            name=name,
            token=text("token") or token_of(child),
            fence=stat.czxid,
            count=int(record.get("count") or 1),
            remaining=None,
            ttl=None,
            acquired_at=dt.datetime.fromtimestamp(stat.ctime / 1000, tz=dt.UTC),
            host=text("host"),
            pid=text("pid"),
            thread=text("thread"),
            caller=text("caller"),
            watchdog=bool(record.get("watchdog")),
            backend=self.alias,
        )

    def lock_token(self, keys: ZooKeeperKeys, *, bounded: bool = False) -> str | None:
        """The token holding the lock now (from the first child's name), or None."""
        ordered = queue_order(self._children(keys.lock, self._timeout(bounded)))
        return token_of(ordered[0]) if ordered else None

    def force_release(self, info: LockInfo, keys: ZooKeeperKeys, *, bounded: bool = False) -> int:
        """Delete the children of ``info.token`` (an operator's release): RELEASED, also
        when repeated after a lost reply; NOT_OWNED when that token holds nothing."""
        timeout = self._timeout(bounded)
        key = (keys.lock, info.token)
        paths = self._own(keys.lock, info.token, timeout)
        if not paths:
            return RELEASED if key in self._forced else NOT_OWNED
        self._forced.add(key)
        deleted = self._delete(paths, timeout)
        grant = self._held.get(info.token)
        if grant is not None:
            grant.lost = True  # (a holder in this process learns it on its release)
        return RELEASED if deleted else NOT_OWNED

    def held_lock_names(self, *, bounded: bool = False) -> list[str]:
        """Names of the locks with a holder now: the lock znodes with children (their
        stats read together, one round trip for all)."""
        timeout = self._timeout(bounded)
        base = f"{self.root}/locks"
        nodes = self._children(base, timeout)
        stats = [self.client.exists_async(f"{base}/{node}") for node in nodes]
        names = []
        for node, request in zip(nodes, stats, strict=True):
            stat = request.get(timeout=timeout)
            if stat is not None and stat.numChildren:
                names.append(name_of(node))
        return sorted(names)

    def inspect_many(
        self, chunk: Sequence[tuple[str, ZooKeeperKeys]], *, bounded: bool = False
    ) -> list[LockInfo | None]:
        """The holders of many locks: every queue listed together, then every holder's
        record read together (two round trips for the chunk)."""
        timeout = self._timeout(bounded)
        client = self.client
        listings = [client.get_children_async(keys.lock) for _, keys in chunk]
        firsts: list[str | None] = []
        for request in listings:
            try:
                ordered = queue_order(request.get(timeout=timeout))
            except NoNodeError:
                ordered = []
            firsts.append(ordered[0] if ordered else None)
        reads = [
            None if first is None else client.get_async(f"{keys.lock}/{first}")
            for (_, keys), first in zip(chunk, firsts, strict=True)
        ]
        infos: list[LockInfo | None] = []
        for (name, keys), first, read in zip(chunk, firsts, reads, strict=True):
            if read is None or first is None:
                infos.append(None)
                continue
            try:
                data, stat = read.get(timeout=timeout)
            except NoNodeError:  # released meanwhile: that one alone, again
                infos.append(self.lock_inspect(name, keys, bounded=bounded))
                continue
            infos.append(self._info(name, first, data, stat))
        return infos

    def force_release_many(
        self, matches: Sequence[tuple[ZooKeeperKeys, LockInfo]], *, bounded: bool = False
    ) -> list[int]:
        return [self.force_release(info, keys, bounded=bounded) for keys, info in matches]

    def renew_many(self, renewals: Sequence[Any], *, bounded: bool = False) -> list:
        """The watchdog's check of many holds, sent together: 1 while a hold's child
        exists, 0 when it is gone (its session ended, or it was force-released),
        CAPPED when it was held ``max_hold`` (its child is deleted then: this
        process's monotonic clock from the grant)."""
        timeout = self._timeout(bounded)
        checks: list[tuple[Any, _Held | None, Any]] = []
        for renewal in renewals:
            grant = self._held.get(renewal.token)
            request = None
            if grant is not None and not grant.lost:
                request = self.client.exists_async(grant.path)
            checks.append((renewal, grant, request))
        results: list = []
        for renewal, grant, request in checks:
            try:
                if grant is None:
                    results.append(self._still_held(renewal.keys.lock, renewal.token, timeout))
                elif request is None or request.get(timeout=timeout) is None:
                    grant.lost = True
                    results.append(0)
                elif renewal.max_hold_ms and (
                    (time.monotonic() - grant.granted) * 1000 >= renewal.max_hold_ms
                ):
                    self._delete([grant.path], timeout)
                    grant.lost = True
                    results.append(CAPPED)
                else:
                    results.append(1)
            except TRANSPORT_ERRORS as exc:
                results.append(
                    ZooKeeperUnavailable(f"renewal of {renewal.name!r}: {exc}", backend=self.alias)
                )
        return results
