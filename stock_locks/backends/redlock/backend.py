"""RedLock: one lock over N independent Redis masters, granted by a majority.

Configured as a ``BACKENDS`` alias::

    "redlock": {
        "BACKEND": "stock_locks.backends.redlock.RedLockBackend",
        "LOCATION": ["redis://a:6379/0", "redis://b:6379/0", "redis://c:6379/0"],
        "OPTIONS": {"NODE_TIMEOUT": 0.2, "RETRY_DELAY": 0.2},
    }

Each operation is the single-Redis Lua script (``backends/redis/protocol.py``'s builds)
sent to every master at once on one connection each, then read with one
deadline of ``NODE_TIMEOUT`` seconds for all: a master that stalls costs at
most that, and a dead one nothing. A try is granted when a majority
(``N // 2 + 1``) granted the same token and the validity
``ttl - elapsed - (ttl * CLOCK_DRIFT + 2 ms)`` is still positive; otherwise
it is given back on every master, including those that seemed to refuse (a
reply may have been lost), and the caller retries: after a wake-up or the
holder's lease end when another holder has a majority, after a random delay
below ``RETRY_DELAY`` when the votes split. Extend, watchdog renewals and
releases need a majority too. A majority that cannot be reached raises
:class:`~stock_locks.exceptions.RedisUnavailable` (nothing is held then: what
a minority granted is given back). The rules are :mod:`.quorum`'s.

Fencing. Each master proposes ``its counter + 1`` (its clock in microseconds
when it has no counter: ``lock_acquire.lua``'s counter rule). The grant's fence
is the highest proposal of its majority, and it counts only once a majority
stores at least that fence (``lock_fence.lua``; no extra round trip when the
granting majority already proposed the same value, the usual case). Any two
majorities share a master, so **every grant's fence is greater than every
earlier grant's while no majority has lost its data** (a master restarted
empty, or restored from an older snapshot, counts as having lost it). A
master's counter expires ``FENCE_RETENTION`` after its own clock has passed
the fence it holds (never before the lease ends): from then on that master
proposes its clock, which is above the fence, so the shared master still
proposes more than the last grant's fence once its counter is gone.

A master restarted empty does not refuse grants for a lease (no delayed
restart). Mutual exclusion then holds as long as a majority still records the
holder: one emptied master of three cannot hand out a lock the other two hold.
If a majority is emptied while a lock is held (two of three restarted at
once), a second holder can be granted; its fence is still greater than the
first holder's whenever the masters' clocks are ahead of the last fence (they
are: fences start from a master's clock and grow by one per grant), so fenced
writes (``stock_locks.fencing``) refuse the first holder. Unfenced code is not
protected then: that is what the fence is for.

Waiting: a refused try sets every master's waiters flag, and a release
pushes a wake-up on each; a waiter blocks on one master's wake-up list (its
"home", chosen by the lock name; the next one when it is unreachable), bounded
by the time a majority's leases need to end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from ... import scripts
from ...exceptions import LockError, LockNotOwned, RedisUnavailable
from ...holder import LockInfo
from ...keys import LockKeys, key_slot, lock_keys
from ..base import (
    Attempt,
    Backend,
    Call,
    Capability,
    ExtendOutcome,
    HoldState,
    LockSpec,
    Operation,
    ReleaseMode,
    ReleaseOutcome,
    Renewal,
    arun,
    run,
)
from ..redis.client import NO_HANDSHAKE, ClientOptions
from ..redis.errors import UNAVAILABLE_ERRORS
from ..redis.held import held_lock_names
from ..redis.protocol import (
    AcquireReply,
    acquire_argv,
    acquire_keys,
    extend_argv,
    extend_keys,
    fence_retention_ms,
    force_argv,
    holder_argv,
    lock_info,
    release_argv,
    release_keys,
)
from ..redis.requests import Blocking, Requests, evalsha, with_source
from . import quorum
from .aio_transport import transport_for
from .quorum import Failed, Unknown
from .transport import MasterPop, RedLockTransport, Round

T = TypeVar("T")

NODE_TIMEOUT = 0.2  # seconds: the longest one round to the masters waits for replies
RETRY_DELAY = 0.2  # seconds: a try refused by split votes retries within this
CLOCK_DRIFT = 0.01  # of the ttl, plus 2 ms: how far the masters' clocks may run apart


class RedLockBackend(Backend):
    """Locks over N independent Redis masters (no semaphores: docs/backends.md).

    Each operation is a generator of requests (:class:`~.transport.Round`,
    :class:`~.transport.MasterPop`): :meth:`execute` performs them on redis-py
    clients, :meth:`aexecute` on ``redis.asyncio`` clients of the running event
    loop.
    """

    capabilities: ClassVar[Capability] = (
        Capability.FENCED
        | Capability.LEASED
        | Capability.SERVER_CLOCK
        | Capability.WAKE_UP
        | Capability.HOLDER_METADATA
        | Capability.FORCE_RELEASE
        | Capability.ASYNCIO
    )

    def __init__(
        self,
        alias: str = "redlock",
        *,
        location: Sequence[str] | None = None,
        options: dict[str, Any] | None = None,
        clients: Sequence[Any] | None = None,
    ) -> None:
        super().__init__(alias)
        options = dict(options or {})
        self.node_timeout = float(options.pop("NODE_TIMEOUT", NODE_TIMEOUT))
        self.retry_delay = float(options.pop("RETRY_DELAY", RETRY_DELAY))
        self.clock_drift = float(options.pop("CLOCK_DRIFT", CLOCK_DRIFT))
        if clients is None:
            if isinstance(location, str) or not location:
                raise LockError(
                    f"RedLock backend {alias!r}: LOCATION must be a list of Redis URLs "
                    "(one per independent master)"
                )
            # Every step bounded by the node timeout, and no handshake on connect (a
            # stalled master must cost one node timeout, not a handshake's wait too).
            bounded = {
                "SOCKET_TIMEOUT": self.node_timeout,
                "SOCKET_CONNECT_TIMEOUT": self.node_timeout,
                "RETRY": Retry(NoBackoff(), 0),
                "PROTOCOL": 2,
                **{key.upper(): value for key, value in NO_HANDSHAKE.items()},
            }
            self.masters = [
                ClientOptions.parse(alias, url, {**bounded, **options}) for url in location
            ]
            clients = [redis.Redis.from_url(url, **m.kwargs) for url, m in
                       zip(location, self.masters, strict=True)]  # fmt: skip
            self._owns_clients = True
        else:
            self.masters = [ClientOptions(alias, None) for _ in clients]
            self._owns_clients = False
        if len(clients) < 3 or len(clients) % 2 == 0:
            raise LockError(
                f"RedLock backend {alias!r}: needs an odd number of masters, at least 3 "
                f"(got {len(clients)})"
            )
        self.clients = list(clients)
        self.quorum = len(self.clients) // 2 + 1
        self.transport = RedLockTransport(self.clients, self.node_timeout)

    def __repr__(self) -> str:
        return f"<RedLockBackend {self.alias!r} x{len(self.clients)}>"

    def close(self) -> None:
        if self._owns_clients:
            for client in self.clients:
                client.close()

    def execute(self, pending: Call[T]) -> T:
        return run(pending.operation(*pending.args), self.transport.perform)

    async def aexecute(self, pending: Call[T]) -> T:
        return await arun(pending.operation(*pending.args), transport_for(self).perform)

    # -- one round to every master -----------------------------------------------------------

    def _round(self, commands: Sequence[Sequence[tuple[Any, ...]]]) -> Requests[list[list[Any]]]:
        """``commands[i]`` to master ``i``, all at once; the replies per master. A master
        that answered NOSCRIPT (it restarted and lost its scripts) is sent the sources
        in a second round."""
        replies: list[list[Any]] = list((yield Round(commands)))
        unknown = [
            [
                i
                for i, r in enumerate(per)
                if isinstance(r, Failed) and isinstance(r.error, NoScriptError)
            ]
            for per in replies
        ]
        if any(unknown):
            again = [
                [with_source(commands[m][i]) for i in found] for m, found in enumerate(unknown)
            ]
            for m, answers in enumerate((yield Round(again))):
                for i, reply in zip(unknown[m], answers, strict=True):
                    replies[m][i] = reply
        return replies

    def _all(self, command: tuple[Any, ...]) -> Requests[list[Any]]:
        """``command`` on every master; one reply (or :class:`Failed`) per master."""
        replies = yield from self._round([[command]] * len(self.clients))
        return [per[0] for per in replies]

    def _unavailable(self, what: str, replies: Sequence[Any]) -> RedisUnavailable:
        errors = [str(r.error) for r in replies if isinstance(r, Failed)]
        return RedisUnavailable(
            f"RedLock {self.alias!r}: {what}: fewer than {self.quorum} of {len(self.clients)} "
            f"masters answered ({'; '.join(errors[:3])})",
            backend=self.alias,
        )

    def _validity_ms(self, ttl_ms: int, started: float) -> float:
        elapsed_ms = (time.monotonic() - started) * 1000
        return quorum.validity_ms(ttl_ms, elapsed_ms, self.clock_drift)

    # -- locks ---------------------------------------------------------------------------

    def lock_keys(self, name: str) -> LockKeys:
        return lock_keys(name)

    def lock_spec(self, name: str, *, ttl_ms: int, caller: str, watchdog: bool) -> LockSpec:
        return LockSpec(name, self.lock_keys(name), ttl_ms, caller, watchdog)

    def lock_try(
        self, spec: LockSpec, token: str, count: int, waited: bool, hold: HoldState | None
    ) -> Operation[Attempt]:
        keys = spec.keys
        holder = holder_argv(spec.caller, spec.watchdog)
        argv = (*acquire_argv(token, spec.ttl_ms, count, holder, waited), "counter")
        started = time.monotonic()
        replies = yield from self._all(evalsha(scripts.LOCK_ACQUIRE, acquire_keys(keys), argv))
        grants = quorum.granted(replies)
        answered = quorum.answered(replies)
        valid = self._validity_ms(spec.ttl_ms, started) > 0
        if count:
            if len(grants) >= self.quorum and valid:
                return Attempt(True, fence=max(int(r[1]) for r in grants), count=count + 1)
            if answered < self.quorum:
                raise self._unavailable(f"re-entry of {spec.name!r}", replies)
            raise LockNotOwned(
                f"cannot re-enter {spec.name!r}: this owner's token no longer holds it on a "
                "majority of masters (its lease ran out or it was force-released)",
                name=spec.name,
            )
        if len(grants) >= self.quorum and valid:
            fence, agreed = quorum.grant_fence(grants, self.quorum)
            stored = agreed or (yield from self._store_fence(keys, token, fence, spec.ttl_ms))
            if stored and self._validity_ms(spec.ttl_ms, started) > 0:
                return Attempt(True, fence=fence, count=1)
        # Not granted: take back what a minority (or a too-slow majority) granted, so
        # that the next try (same token) starts clean.
        with contextlib.suppress(RedisUnavailable):  # (what stays frees with its lease)
            yield from self.lock_release(spec, token, 1, ReleaseMode.RETRACT)
        if answered < self.quorum:
            raise self._unavailable(f"acquire of {spec.name!r}", replies)
        if any(not isinstance(r, Failed) and r[0] == AcquireReply.GIVEN_BACK for r in replies):
            raise LockError(f"lock {spec.name!r}: this try's token was already given back")
        return Attempt(
            False, wait=quorum.wait_after(replies, len(grants), self.quorum, self.retry_delay)
        )

    def _store_fence(self, keys: LockKeys, token: str, fence: int, ttl_ms: int) -> Requests[bool]:
        argv = (token, fence, fence_retention_ms(), ttl_ms)
        command = evalsha(scripts.LOCK_FENCE, (keys.fence, keys.lock), argv)
        stored = sum(reply == 1 for reply in (yield from self._all(command)))
        return bool(stored >= self.quorum)

    def lock_release(
        self, spec: LockSpec, token: str, count: int, mode: ReleaseMode
    ) -> Operation[ReleaseOutcome]:
        argv = release_argv(token, count, mode)
        replies = yield from self._all(evalsha(scripts.LOCK_RELEASE, release_keys(spec.keys), argv))
        return self._release_outcome(f"release of {spec.name!r}", replies)

    def _release_outcome(self, what: str, replies: Sequence[Any]) -> ReleaseOutcome:
        try:
            return quorum.release_outcome(replies, self.quorum)
        except Unknown:
            raise self._unavailable(what, replies) from None

    def lock_extend(
        self, spec: LockSpec, token: str, ttl_ms: int, max_hold_ms: int
    ) -> Operation[ExtendOutcome]:
        started = time.monotonic()
        command = evalsha(
            scripts.LOCK_EXTEND,
            extend_keys(spec.keys),
            extend_argv(token, ttl_ms, max_hold_ms, "counter"),
        )
        replies = yield from self._all(command)
        return self._extend_outcome(f"extend of {spec.name!r}", replies, ttl_ms, started)

    def _extend_outcome(
        self, what: str, replies: Sequence[Any], ttl_ms: int, started: float
    ) -> ExtendOutcome:
        valid = self._validity_ms(ttl_ms, started) > 0
        try:
            return quorum.extend_outcome(replies, self.quorum, valid)
        except Unknown:
            raise self._unavailable(what, replies) from None

    def renew_many(
        self, renewals: Sequence[Renewal]
    ) -> Operation[list[ExtendOutcome | BaseException]]:
        """Every renewal's extend on every master in one round; per renewal its outcome,
        or a RedisUnavailable when too few masters answered to tell."""
        started = time.monotonic()
        commands = [
            evalsha(
                scripts.LOCK_EXTEND,
                extend_keys(r.spec.keys),
                extend_argv(r.token, r.ttl_ms, r.max_hold_ms, "counter"),
            )
            for r in renewals
        ]
        per_master = yield from self._round([commands] * len(self.clients))
        outcomes: list[ExtendOutcome | BaseException] = []
        for i, r in enumerate(renewals):
            replies = [replies[i] for replies in per_master]
            try:
                outcomes.append(
                    self._extend_outcome(f"renewal of {r.spec.name!r}", replies, r.ttl_ms, started)
                )
            except RedisUnavailable as exc:  # unknown: the watchdog tries again soon
                outcomes.append(exc)
        return outcomes

    def lock_wait(self, spec: LockSpec, seconds: float) -> Operation[bool]:
        count = len(self.clients)
        home = key_slot(spec.keys.lock) % count
        deadline = time.monotonic() + seconds
        for step in range(count):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                return (
                    yield MasterPop((home + step) % count, spec.keys.signal, remaining)
                ) is not None
            except UNAVAILABLE_ERRORS:
                continue  # that master is down: wait on the next one
        return False

    def lock_inspect(self, name: str, keys: LockKeys) -> Operation[LockInfo | None]:
        replies = yield from self._all(evalsha(scripts.LOCK_INSPECT, (keys.lock,), ()))
        try:
            held = quorum.majority_holder(replies, self.quorum)
        except Unknown:
            raise self._unavailable("inspect", replies) from None
        if held is None:
            return None
        infos = [info for reply in held if (info := lock_info(name, reply, self.alias))]
        best = max(infos, key=lambda info: info.fence or 0)
        remaining = [info.remaining for info in infos if info.remaining is not None]
        return replace(best, remaining=min(remaining) if remaining else None)

    def lock_token(self, keys: LockKeys) -> Operation[str | None]:
        replies = yield from self._all(("GET", keys.lock))
        try:
            return quorum.majority_token(replies, self.quorum)
        except Unknown:
            raise self._unavailable("read", replies) from None

    def force_release(self, info: LockInfo, keys: LockKeys) -> Operation[ReleaseOutcome]:
        command = evalsha(scripts.LOCK_RELEASE, release_keys(keys), force_argv(info))
        replies = yield from self._all(command)
        return self._release_outcome(f"force release of {info.name!r}", replies)

    def held_lock_names(self) -> Operation[list[str]]:
        """Names in the held-locks index of any reachable master."""
        clients = self.clients

        def read() -> list[str]:
            names: set[str] = set()
            for client in clients:
                try:
                    names.update(held_lock_names(client))
                except UNAVAILABLE_ERRORS:
                    continue
            return sorted(names)

        names: list[str] = yield Blocking(read)
        return names

    def inspect_many(
        self, chunk: Sequence[tuple[str, LockKeys]]
    ) -> Operation[list[LockInfo | None]]:
        infos = []
        for name, keys in chunk:
            infos.append((yield from self.lock_inspect(name, keys)))
        return infos

    def force_release_many(
        self, matches: Sequence[tuple[LockKeys, LockInfo]]
    ) -> Operation[list[ReleaseOutcome]]:
        results = []
        for keys, info in matches:
            results.append((yield from self.force_release(info, keys)))
        return results
