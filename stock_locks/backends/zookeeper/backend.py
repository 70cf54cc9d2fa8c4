"""The ZooKeeper backend: the lock operations (the protocol is the package's docstring,
:mod:`stock_locks.backends.zookeeper`)."""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError, SessionExpiredError

from ...exceptions import LockError, LockNotOwned, ZooKeeperUnavailable
from ...holder import LockInfo, process_identity, thread_name
from ..base import (
    GIVE_BACK_TIMEOUT,
    Attempt,
    Backend,
    Call,
    Capability,
    ExtendOutcome,
    HoldState,
    LockSpec,
    ReleaseMode,
    ReleaseOutcome,
    Renewal,
    run,
)
from . import holders
from .queue import (
    ROOT,
    TOKEN,
    TRANSPORT_ERRORS,
    Held,
    Remembered,
    ZooKeeperKeys,
    children,
    delete,
    node_name,
    owned_by,
    queue_order,
    token_of,
)
from .session import Session, zookeeper_operation

NOT_OWNED, RELEASED, STILL_HELD = ReleaseOutcome
T = TypeVar("T")
P = ParamSpec("P")

SESSION_TIMEOUT = 10.0  # seconds: how long the ensemble keeps a silent client's session
CONNECT_TIMEOUT = 5.0  # seconds: the longest the first call waits to connect


class _PerThread(threading.local):
    """What one thread's calls keep: its queued waiters (lock path -> (token, child,
    czxid)), its last refused token per lock path (the one ``lock_wait`` queues), and
    whether the running call is bounded."""

    def __init__(self) -> None:
        self.pending: dict[str, tuple[str, str, int]] = {}
        self.refused: dict[str, str] = {}
        self.bounded = False


class ZooKeeperBackend(Backend):
    """Locks on a ZooKeeper ensemble (no semaphores: see docs/backends.md)."""

    capabilities: ClassVar[Capability] = (
        Capability.FENCED
        | Capability.SESSION_BOUND
        | Capability.WAKE_UP
        | Capability.HOLDER_METADATA
        | Capability.FORCE_RELEASE
    )

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
        session_timeout = float(options.pop("SESSION_TIMEOUT", SESSION_TIMEOUT))
        # A request not answered within a session timeout is answered by the session's end.
        self.operation_timeout = float(options.pop("OPERATION_TIMEOUT", session_timeout))
        self._session = Session(
            alias, self.hosts, session_timeout,
            float(options.pop("CONNECT_TIMEOUT", CONNECT_TIMEOUT)),
            {key.lower(): value for key, value in options.items()},
            self,
        )  # fmt: skip
        self.forked()

    def forked(self) -> None:
        """This process's state (made again in a forked child, which owns none of it)."""
        self._state_lock = threading.Lock()
        self._held: dict[str, Held] = {}  # token -> grant
        self._released = Remembered()  # (lock path, token) released or maybe released
        self._forced = Remembered()  # (lock path, token) force-released from here
        self._given_back = Remembered()  # tokens of acquires that gave up
        self._orphans: dict[tuple[str, str], None] = {}  # give-backs that failed: (path, token)
        self._waiting: set[threading.Event] = set()
        self._local = _PerThread()

    def __repr__(self) -> str:
        return f"<ZooKeeperBackend {self.alias!r} {self.hosts}{self.root}>"

    @property
    def client(self) -> KazooClient:
        """The kazoo client of this process, connected on first use (:class:`Session`)."""
        return self._session.client

    def close(self) -> None:
        self._session.close()

    def session(self) -> int | None:
        """The id of this process's session now (None while disconnected)."""
        return self._session.id()

    def connected(self, client: KazooClient) -> None:
        """(On kazoo's thread: must not block.) A session began: give-backs that
        failed are done now."""
        if self._orphans:
            client.handler.spawn(self._sweep)

    def session_lost(self) -> None:
        """(On kazoo's thread: must not block.) The session expired, and with it every
        ephemeral child of this process: its grants are lost, its waiters look again."""
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

    def execute(self, pending: Call[T]) -> T:
        previous, self._local.bounded = self._local.bounded, pending.bounded
        try:
            try:
                return self._run(pending)
            except SessionExpiredError:
                # The session ended under this call: what it did there went with it (its
                # children were ephemeral), so it runs once more, in the next session.
                return self._run(pending)
        except TRANSPORT_ERRORS as exc:
            raise ZooKeeperUnavailable(
                f"ZooKeeper unavailable (backend {self.alias!r}): {type(exc).__name__} {exc}",
                backend=self.alias,
            ) from exc
        finally:
            self._local.bounded = previous

    @staticmethod
    def _run(pending: Call[T]) -> T:
        return run(pending.operation(*pending.args), lambda request: request.function())

    def _timeout(self) -> float:
        """How long each request of the running call waits: a bounded call's short bound,
        else the operation timeout."""
        return GIVE_BACK_TIMEOUT if self._local.bounded else self.operation_timeout

    # -- queue primitives ---------------------------------------------------------------------

    def lock_keys(self, name: str) -> ZooKeeperKeys:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a lock name must be a non-empty string, got {name!r}")
        return ZooKeeperKeys(f"{self.root}/locks/{node_name(name)}")

    def lock_spec(self, name: str, *, ttl_ms: int, caller: str, watchdog: bool) -> LockSpec:
        return LockSpec(name, self.lock_keys(name), ttl_ms, caller, watchdog)

    def _record(self, spec: LockSpec, token: str, count: int) -> dict[str, Any]:
        host, pid = process_identity()
        return {
            "token": token, "count": count, "host": host, "pid": pid, "thread": thread_name(),
            "caller": spec.caller, "watchdog": spec.watchdog,
        }  # fmt: skip

    def _children(self, path: str, timeout: float) -> list[str]:
        return children(self.client, path, timeout)

    def _enqueue(
        self, path: str, token: str, record: dict[str, Any], timeout: float
    ) -> tuple[str, int, list[str]]:
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
        return delete(self.client, paths, timeout)

    def _own(self, path: str, token: str, timeout: float) -> list[str]:
        return owned_by(self.client, path, token, timeout)

    def _forget(self, token: str) -> Held | None:
        with self._state_lock:
            return self._held.pop(token, None)

    # -- lock operations ------------------------------------------------------------------------

    @zookeeper_operation
    def lock_try(
        self, spec: LockSpec, token: str, count: int, waited: bool, hold: HoldState | None
    ) -> Attempt:
        """One try. Granted when this token's oldest child is first in the queue (made
        now, or queued by :meth:`lock_wait`); otherwise its children are deleted again.

        Raises :class:`LockNotOwned` for a re-entry (``count`` > 0) whose token no longer
        holds the lock, :class:`LockError` for a token already given back.
        """
        if count:
            return self._reenter(spec, token, count, self._timeout())
        if token in self._given_back:
            raise LockError(
                f"lock {spec.name!r}: this try's token was already given back", name=spec.name
            )
        if not TOKEN.fullmatch(token):
            raise LockError(f"lock {spec.name!r}: token {token!r} is not [A-Za-z0-9_.~]+")
        path, timeout = spec.keys.lock, self._timeout()
        record = self._record(spec, token, 1)
        queued = self._local.pending.pop(path, None)
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
            grant = Held(f"{path}/{mine[0]}", int(czxid or 0), record, self.session(),
                          None if hold is None else weakref.ref(hold))  # fmt: skip
            with self._state_lock:
                self._held[token] = grant
            self._local.refused.pop(path, None)
            return Attempt(True, fence=grant.czxid, count=1)
        self._delete([f"{path}/{c}" for c in mine], timeout)
        self._local.refused[path] = token
        return Attempt(False)

    def _reenter(self, spec: LockSpec, token: str, count: int, timeout: float) -> Attempt:
        grant = self._held.get(token)
        lost = LockNotOwned(
            f"cannot re-enter {spec.name!r}: this owner's token no longer holds it "
            "(its session ended or it was force-released)",
            name=spec.name,
        )
        if grant is None or grant.lost:
            self._forget(token)
            raise lost
        record = {**grant.record, "count": count + 1}
        try:
            self.client.set_async(grant.path, json.dumps(record).encode()).get(timeout=timeout)
        except NoNodeError:
            self._forget(token)
            raise lost from None
        grant.record = record
        return Attempt(True, fence=grant.czxid, count=count + 1)

    @zookeeper_operation
    def lock_wait(self, spec: LockSpec, seconds: float) -> bool:
        """Queue behind the holder and sleep until this thread's child is first (True)
        or ``seconds`` pass (False). Watches only the child just before its own; the
        next :meth:`lock_try` of the same token finds the queued child."""
        path, timeout = spec.keys.lock, self._timeout()
        deadline = time.monotonic() + seconds
        token = self._local.refused.pop(path, None)
        pending = self._local.pending
        queued = pending.get(path)
        if token is None and queued is None:
            return self._wait_for_holder(path, deadline, timeout)
        if queued is None or (token is not None and queued[0] != token):
            assert token is not None
            child, czxid, children = self._enqueue(
                path, token, self._record(spec, token, 1), timeout
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

    @zookeeper_operation
    def lock_release(
        self, spec: LockSpec, token: str, count: int, mode: ReleaseMode
    ) -> ReleaseOutcome:
        """RELEASED (the child deleted, or deleted by an earlier call of this process
        whose reply was lost), STILL_HELD (a reentrant hold counted down), NOT_OWNED
        (the token holds nothing: its session ended, or it was force-released).
        ``mode`` "abandon" (an acquire's give-back) deletes every child of the token,
        queued or holding, and refuses later tries with it."""
        path, timeout = spec.keys.lock, self._timeout()
        key = (path, token)
        if mode != "release":
            self._given_back.add(token)
            self._local.refused.pop(path, None)
            queued = self._local.pending.get(path)
            if queued is not None and queued[0] == token:
                del self._local.pending[path]
        grant = self._held.get(token)
        if count > 1 and mode == "release":
            return self._count_down(grant, token, count, timeout)
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

    def _count_down(
        self, grant: Held | None, token: str, count: int, timeout: float
    ) -> ReleaseOutcome:
        if grant is None or grant.lost:
            self._forget(token)
            return NOT_OWNED
        record = {**grant.record, "count": count - 1}
        try:
            self.client.set_async(grant.path, json.dumps(record).encode()).get(timeout=timeout)
        except NoNodeError:
            self._forget(token)
            return NOT_OWNED
        grant.record = record
        return STILL_HELD

    @zookeeper_operation
    def lock_extend(
        self, spec: LockSpec, token: str, ttl_ms: int, max_hold_ms: int
    ) -> ExtendOutcome:
        """1 while ``token`` still holds the lock, else 0. There is no lease to extend:
        the grant lasts as long as the session."""
        return self._still_held(spec.keys.lock, token, self._timeout())

    def _still_held(self, path: str, token: str, timeout: float) -> ExtendOutcome:
        grant = self._held.get(token)
        if grant is not None:
            if grant.lost or self.client.exists_async(grant.path).get(timeout=timeout) is None:
                grant.lost = True
                return ExtendOutcome.LOST
            return ExtendOutcome.EXTENDED
        ordered = queue_order(self._children(path, timeout))
        held = bool(ordered) and token_of(ordered[0]) == token
        return ExtendOutcome.EXTENDED if held else ExtendOutcome.LOST

    @zookeeper_operation
    def lock_inspect(self, name: str, keys: ZooKeeperKeys) -> LockInfo | None:
        """The holder (the first child) of lock ``name``, or None when free. Two round
        trips (the queue, then the holder's record)."""
        return self._inspect(name, keys)

    def _inspect(self, name: str, keys: ZooKeeperKeys) -> LockInfo | None:
        return holders.inspect(self.client, self.alias, name, keys, self._timeout())

    @zookeeper_operation
    def lock_token(self, keys: ZooKeeperKeys) -> str | None:
        """The token holding the lock now (from the first child's name), or None."""
        ordered = queue_order(self._children(keys.lock, self._timeout()))
        return token_of(ordered[0]) if ordered else None

    @zookeeper_operation
    def force_release(self, info: LockInfo, keys: ZooKeeperKeys) -> ReleaseOutcome:
        """Delete the children of ``info.token`` (an operator's release): RELEASED, also
        when repeated after a lost reply; NOT_OWNED when that token holds nothing."""
        return self._force(info, keys)

    def _force(self, info: LockInfo, keys: ZooKeeperKeys) -> ReleaseOutcome:
        timeout = self._timeout()
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

    @zookeeper_operation
    def held_lock_names(self) -> list[str]:
        """Names of the locks with a holder now (one round trip for all)."""
        return holders.held_lock_names(self.client, self.root, self._timeout())

    @zookeeper_operation
    def inspect_many(self, chunk: Sequence[tuple[str, ZooKeeperKeys]]) -> list[LockInfo | None]:
        """The holders of many locks (two round trips for the chunk)."""
        return holders.inspect_many(self.client, self.alias, chunk, self._timeout())

    @zookeeper_operation
    def force_release_many(
        self, matches: Sequence[tuple[ZooKeeperKeys, LockInfo]]
    ) -> list[ReleaseOutcome]:
        return [self._force(info, keys) for keys, info in matches]

    @zookeeper_operation
    def renew_many(self, renewals: Sequence[Renewal]) -> list[ExtendOutcome | BaseException]:
        """The watchdog's check of many holds, sent together: 1 while a hold's child
        exists, 0 when it is gone (its session ended, or it was force-released),
        CAPPED when it was held ``max_hold`` (its child is deleted then: this
        process's monotonic clock from the grant)."""
        timeout = self._timeout()
        checks: list[tuple[Renewal, Held | None, Any]] = []
        for renewal in renewals:
            grant = self._held.get(renewal.token)
            request = None
            if grant is not None and not grant.lost:
                request = self.client.exists_async(grant.path)
            checks.append((renewal, grant, request))
        results: list[ExtendOutcome | BaseException] = []
        for renewal, grant, request in checks:
            try:
                if grant is None:
                    results.append(self._still_held(renewal.spec.keys.lock, renewal.token, timeout))
                elif request is None or request.get(timeout=timeout) is None:
                    grant.lost = True
                    results.append(ExtendOutcome.LOST)
                elif renewal.max_hold_ms and (
                    (time.monotonic() - grant.granted) * 1000 >= renewal.max_hold_ms
                ):
                    self._delete([grant.path], timeout)
                    grant.lost = True
                    results.append(ExtendOutcome.CAPPED)
                else:
                    results.append(ExtendOutcome.EXTENDED)
            except TRANSPORT_ERRORS as exc:
                results.append(
                    ZooKeeperUnavailable(
                        f"renewal of {renewal.spec.name!r}: {exc}", backend=self.alias
                    )
                )
        return results
