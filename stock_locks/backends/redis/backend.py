"""One Redis server (or a Redis Cluster): locks and semaphores as Lua scripts.

Each operation is a generator of requests (``requests.py``: a script, a
command, a pipeline, a blocking pop) built and parsed by ``protocol.py``; a
transport performs them, redis-py's (``transport.py``) for :meth:`RedisBackend.
execute` and ``redis.asyncio``'s (``aio_transport.py``) for :meth:`RedisBackend.
aexecute`. Both are the one place where redis-py's transport errors become
:class:`~stock_locks.exceptions.RedisUnavailable`. The client is built as
``client.py`` says (a ``LOCATION``, or a django-redis alias). On a Redis Cluster
every script's keys share one hash slot, the held-locks index is one key per
slot, and batches (watchdog renewals) run per node.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import NoScriptError

from ... import scripts
from ...conf import settings
from ...exceptions import LockNotReplicated
from ...holder import LockInfo, process_identity, thread_name
from ...keys import SEMAPHORES, LockKeys, SemaphoreKeys, lock_keys, semaphore_keys
from .. import get_backend
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
    SemaphoreSpec,
    arun,
    run,
)
from . import registry
from .aio_transport import transport_for
from .client import ClientOptions, async_client, get_redis, sync_client
from .cluster import is_cluster
from .errors import UNAVAILABLE_ERRORS, translated_error
from .held import held_lock_names
from .protocol import (
    AcquireReply,
    RedisLockSpec,
    acquire_argv,
    extend_argv,
    extend_keys,
    force_argv,
    gone_key,
    grace_ms,
    holder_argv,
    lock_attempt,
    lock_info,
    lock_spec,
    release_argv,
    release_keys,
    semaphore_attempt,
    semaphore_script_keys,
    token_of,
)
from .requests import (
    UNKNOWN,
    Blocking,
    Command,
    Pop,
    PopThen,
    Requests,
    Script,
    confirmed_script,
    script,
    scripts_batch,
)
from .transport import RedisTransport

T = TypeVar("T")

# Grants whose state (lock_acquire.lua's fourth reply element) is kept for their
# release, at most: a hold never released here (a lapsed lease, a hand-off) leaves
# its entry, so past this many they are all dropped (those releases then read the
# record first, as without it).
GRANT_STATES_KEPT = 10_000


release_log = logging.getLogger("stock_locks.lock.release")  # (core/lock.py's)
# lock_release.lua's replies 3 and 4: NOT_OWNED and RELEASED, and it put back a value
# it did not write without an expiry (an operator may have to force_release it).
_PUT_BACK_UNEXPIRING = frozenset((3, 4))


class RedisBackend(Backend):
    """Locks and semaphores on one Redis server or one Redis Cluster.

    ``client`` / ``async_client``: an explicit redis-py or ``redis.asyncio``
    client (the ``redis=`` argument of the primitives); otherwise the client is
    made on first use from ``location`` and ``options`` (``client.py``).
    """

    capabilities: ClassVar[Capability] = (
        Capability.FENCED
        | Capability.LEASED
        | Capability.SERVER_CLOCK
        | Capability.WAKE_UP
        | Capability.HOLDER_METADATA
        | Capability.SEMAPHORES
        | Capability.FORCE_RELEASE
        | Capability.ASYNCIO
    )

    def __init__(
        self,
        alias: str = "default",
        *,
        location: str | Sequence[str] | None = None,
        options: dict[str, Any] | None = None,
        client: Any = None,
        async_client: Any = None,
    ) -> None:
        super().__init__(alias)
        self.options = ClientOptions.parse(alias, location, options)
        self._client = client
        self._transport: RedisTransport | None = None
        self._owns_client = False
        self.async_client = async_client  # an explicit redis.asyncio client (redis=)
        # (lock key, token) -> the grant's state, for its release (lock_release.lua's
        # ARGV[7]: one SET ... GET instead of GET then SET)
        self._grant_states: dict[tuple[str, str], Any] = {}

    @property
    def client(self) -> Any:
        """The redis-py client (``Redis`` or ``RedisCluster``), made on first use."""
        if self._client is None:
            if self.async_client is not None:
                raise ImproperlyConfigured(
                    f"backend {self.alias!r} was made around a redis.asyncio client: "
                    "use the stock_locks.aio primitives with it"
                )
            self._client = sync_client(self.options)
            self._owns_client = self.options.direct
        return self._client

    def make_async_client(self) -> Any:
        """A new ``redis.asyncio`` client made like :attr:`client` (one per event loop)."""
        sync = None if self.options.direct else self.client
        return async_client(self.options, sync)

    @property
    def cluster(self) -> bool:
        if self._client is None and self.async_client is not None:
            return is_cluster(self.async_client)
        if self.options.direct:
            return self.options.cluster
        return is_cluster(self.client)

    @property
    def transport(self) -> RedisTransport:
        """The redis-py transport of :attr:`client`."""
        transport = self._transport
        if transport is None:
            transport = self._transport = RedisTransport(self.client)
        return transport

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
        self._client = self._transport = None

    # -- running operations ----------------------------------------------------------------

    def execute(self, pending: Call[T]) -> T:
        # (:meth:`run`, inlined: every lock and semaphore call passes here)
        transport = self._transport or self.transport
        perform = transport.perform_bounded if pending.bounded else transport.perform
        try:
            return run(pending.operation(*pending.args), perform)
        except UNAVAILABLE_ERRORS as exc:
            raise translated_error(exc, self.alias) from exc

    async def aexecute(self, pending: Call[T]) -> T:
        return await self.arun(pending.operation(*pending.args), bounded=pending.bounded)

    def run(self, requests: Requests[T], *, bounded: bool = False) -> T:
        """Drive a generator of requests on the redis-py transport; its result.

        Raises :class:`~stock_locks.exceptions.RedisUnavailable` (the cause
        chained) when Redis did not answer: the outcome is unknown.
        """
        transport = self.transport
        try:
            return run(requests, transport.perform_bounded if bounded else transport.perform)
        except UNAVAILABLE_ERRORS as exc:
            raise translated_error(exc, self.alias) from exc

    async def arun(self, requests: Requests[T], *, bounded: bool = False) -> T:
        """:meth:`run` on the running event loop's ``redis.asyncio`` transport."""
        transport = transport_for(self)
        try:
            return await arun(requests, transport.perform_bounded if bounded else transport.perform)
        except UNAVAILABLE_ERRORS as exc:
            raise translated_error(exc, self.alias) from exc

    # -- locks -----------------------------------------------------------------------------

    def lock_keys(self, name: str) -> LockKeys:
        return lock_keys(name, cluster=self.cluster)

    def lock_spec(self, name: str, *, ttl_ms: int, caller: str, watchdog: bool) -> LockSpec:
        return lock_spec(name, self.lock_keys(name), ttl_ms, caller, watchdog)

    def lock_try(
        self, spec: LockSpec, token: str, count: int, waited: bool, hold: HoldState | None
    ) -> Operation[Attempt]:
        assert isinstance(spec, RedisLockSpec)
        argv = acquire_argv(
            token, spec.ttl_ms, count, holder_argv(spec.caller, spec.watchdog), waited
        )
        replicas = self._replicas()
        if replicas:
            reply = yield from self._acquire_replicated(spec, token, argv, replicas)
        else:
            reply = yield from script(
                scripts.LOCK_ACQUIRE, spec.acquire_keys, argv, spec.acquire_head
            )
        return self._attempt(spec, token, reply)

    def _replicas(self) -> int:
        replicas = self.options.replicas
        return settings.REPLICAS if replicas is None else replicas

    def _attempt(self, spec: RedisLockSpec, token: str, reply: Any) -> Attempt:
        """The :class:`Attempt` of ``lock_acquire.lua``'s ``reply``; a grant's state is
        kept for its release."""
        if reply[0] == AcquireReply.GRANTED:
            states = self._grant_states
            if len(reply) > 3:
                if len(states) >= GRANT_STATES_KEPT:
                    states.clear()
                states[spec.keys.lock, token] = reply[3]
            else:
                states.pop((spec.keys.lock, token), None)
            return Attempt(True, fence=reply[1], count=reply[2])
        return lock_attempt(spec.name, reply)

    def _acquire_replicated(
        self, spec: RedisLockSpec, token: str, argv: tuple[Any, ...], replicas: int
    ) -> Requests[Any]:
        wait_ms = max(1, int(settings.REPLICA_TIMEOUT * 1000))
        reply, confirmed = yield from confirmed_script(
            scripts.LOCK_ACQUIRE, spec.acquire_keys, argv, (replicas, wait_ms)
        )
        confirmed = 0 if isinstance(confirmed, Exception) else int(confirmed)
        if reply[0] == AcquireReply.GRANTED and int(reply[2]) == 1 and confirmed < replicas:
            yield from self.lock_release(spec, token, 1, ReleaseMode.ABANDON)
            raise LockNotReplicated(
                f"lock {spec.name!r}: {confirmed} of {replicas} replicas confirmed the grant "
                f"within {settings.REPLICA_TIMEOUT}s; grant undone",
                name=spec.name,
                required=replicas,
                confirmed=confirmed,
            )
        return reply

    def lock_release(
        self, spec: LockSpec, token: str, count: int, mode: ReleaseMode
    ) -> Operation[ReleaseOutcome]:
        assert isinstance(spec, RedisLockSpec)
        state = self._grant_states.pop((spec.keys.lock, token), "") if count == 1 else ""
        argv = (*release_argv(token, count, mode), state)
        reply = yield from script(scripts.LOCK_RELEASE, spec.release_keys, argv, spec.release_head)
        if reply in _PUT_BACK_UNEXPIRING:  # (lock_release.lua: 3 for 0, 4 for 1)
            release_log.warning(
                "lock %r: its release found a value it did not write (another program's, "
                "an older version's record) and put it back without an expiry; if the lock "
                "stays held, free it with force_release",
                spec.name,
            )
            reply -= 3
        return ReleaseOutcome.of(reply)

    def lock_extend(
        self, spec: LockSpec, token: str, ttl_ms: int, max_hold_ms: int
    ) -> Operation[ExtendOutcome]:
        argv = extend_argv(token, ttl_ms, max_hold_ms)
        return ExtendOutcome.of(
            (yield from script(scripts.LOCK_EXTEND, extend_keys(spec.keys), argv))
        )

    def lock_wait(self, spec: LockSpec, seconds: float) -> Operation[bool]:
        return (yield Pop(spec.keys.signal, seconds)) is not None

    def lock_wait_try(
        self, spec: LockSpec, seconds: float, token: str, count: int
    ) -> Operation[Attempt | bool | None]:
        """:meth:`lock_wait`, with the waiting acquire's next try (``token``, ``count``,
        waited) sent behind its ``BLPOP`` on the same connection (``PopThen``): Redis
        runs it as soon as a release pops the signal, so the wake-up and the grant
        take one round trip. That try's :class:`Attempt`; True or False (woken, or
        not in time) when no try ran; None when one may have run or may still run
        with its reply lost (the deadline dropped the connection just as the pop
        was served; the connection broke after the pop): the caller's next try,
        with the same token, finds a grant that ran, and an acquire that gives up
        must give the token back (one still to run is then refused). With
        ``REPLICAS`` a plain wait (a grant is confirmed by ``WAIT`` on its own
        connection)."""
        assert isinstance(spec, RedisLockSpec)
        if self._replicas():
            return (yield from self.lock_wait(spec, seconds))
        argv = acquire_argv(
            token, spec.ttl_ms, count, holder_argv(spec.caller, spec.watchdog), True
        )
        then = Script(scripts.LOCK_ACQUIRE, spec.acquire_keys, argv, spec.acquire_head)
        popped, reply = yield PopThen(spec.keys.signal, seconds, then)
        if reply is UNKNOWN:
            return None
        if reply is None or isinstance(reply, NoScriptError):
            return popped is not None  # (no try ran: the caller makes it)
        if isinstance(reply, BaseException):
            raise reply
        return self._attempt(spec, token, reply)

    def lock_inspect(self, name: str, keys: LockKeys) -> Operation[LockInfo | None]:
        reply = yield from script(scripts.LOCK_INSPECT, (keys.lock,), ())
        return lock_info(name, reply, self.alias)

    def lock_token(self, keys: LockKeys) -> Operation[str | None]:
        return token_of((yield Command(("GET", keys.lock), keys.lock)))

    def force_release(self, info: LockInfo, keys: LockKeys) -> Operation[ReleaseOutcome]:
        reply = yield from script(scripts.LOCK_RELEASE, release_keys(keys), force_argv(info))
        return ReleaseOutcome.of(reply)

    def held_lock_names(self) -> Operation[list[str]]:
        client = self.client
        names: list[str] = yield Blocking(lambda: held_lock_names(client))
        return names

    def inspect_many(
        self, chunk: Sequence[tuple[str, LockKeys]]
    ) -> Operation[list[LockInfo | None]]:
        reads = [(scripts.LOCK_INSPECT, (keys.lock,), ()) for _, keys in chunk]
        replies = yield from scripts_batch(reads)
        return [lock_info(name, _raised(reply), self.alias) for (name, _), reply in
                zip(chunk, replies, strict=True)]  # fmt: skip

    def force_release_many(
        self, matches: Sequence[tuple[LockKeys, LockInfo]]
    ) -> Operation[list[ReleaseOutcome]]:
        calls = [
            (scripts.LOCK_RELEASE, release_keys(keys), force_argv(info)) for keys, info in matches
        ]
        return [ReleaseOutcome.of(_raised(reply)) for reply in (yield from scripts_batch(calls))]

    def renew_many(
        self, renewals: Sequence[Renewal]
    ) -> Operation[list[ExtendOutcome | BaseException]]:
        calls = [
            (
                scripts.LOCK_EXTEND,
                extend_keys(r.spec.keys),
                extend_argv(r.token, r.ttl_ms, r.max_hold_ms),
            )
            for r in renewals
        ]
        replies = yield from scripts_batch(calls)
        return [
            reply if isinstance(reply, BaseException) else ExtendOutcome.of(reply)
            for reply in replies
        ]

    # -- semaphores ------------------------------------------------------------------------

    def semaphore_keys(self, name: str) -> SemaphoreKeys:
        return semaphore_keys(name)

    def semaphore_try(
        self, spec: SemaphoreSpec, holder: str, lease_ms: int, patience_ms: int
    ) -> Operation[Attempt]:
        host, pid = process_identity()
        about = (host, pid, thread_name(), spec.caller)
        argv: tuple[Any, ...]
        if spec.fair:
            argv = (holder, spec.limit, lease_ms, patience_ms, grace_ms(), *about)
            source = scripts.FAIR_ACQUIRE
        else:
            argv = (holder, spec.limit, lease_ms, patience_ms, *about)
            source = scripts.SEM_ACQUIRE
        keys = semaphore_script_keys(spec.keys, spec.fair)
        attempt = semaphore_attempt(spec.name, (yield from script(source, keys, argv)), spec.fair)
        if attempt.granted:  # listed for the admin page (once a period per process)
            yield from registry.register(self, SEMAPHORES, spec.name)
        return attempt

    def semaphore_release(
        self, spec: SemaphoreSpec, holder: str, lease_ms: int, abandon: bool
    ) -> Operation[int]:
        mode = "abandon" if abandon else "release"
        k = spec.keys
        if spec.fair:
            argv = (holder, spec.limit, grace_ms(), lease_ms, mode)
            fair_keys = semaphore_script_keys(k, True)
            return int((yield from script(scripts.FAIR_RELEASE, fair_keys, argv)))
        wake_ms = int(settings.WAKE_SIGNAL_TTL * 1000)
        argv = (holder, spec.limit, wake_ms, lease_ms, mode)
        keys = (k.holders, k.meta, k.signal, gone_key(k))
        return int((yield from script(scripts.SEM_RELEASE, keys, argv)))

    def semaphore_refresh(self, spec: SemaphoreSpec, holder: str, ttl_ms: int) -> Operation[int]:
        k = spec.keys
        keys = (k.holders, k.meta, k.queue, k.alive, k.ticket) if spec.fair else (k.holders, k.meta)
        live = int((yield from script(scripts.SEM_REFRESH, keys, (holder, ttl_ms))))
        if live == 1:  # a hold kept for days stays listed
            yield from registry.register(self, SEMAPHORES, spec.name)
        return live

    def semaphore_wait(self, spec: SemaphoreSpec, holder: str, seconds: float) -> Operation[bool]:
        key = spec.keys.wake_prefix + holder if spec.fair else spec.keys.signal
        return (yield Pop(key, seconds)) is not None

    def semaphore_state(self, keys: SemaphoreKeys) -> Operation[list[Any]]:
        """``sem_state.lua``'s reply: [now ms, limit, waiting, flat holders]."""
        state_keys = (keys.holders, keys.meta, keys.queue)
        return list((yield from script(scripts.SEM_STATE, state_keys, ())))

    def semaphore_states(self, keys: Sequence[SemaphoreKeys]) -> Operation[list[list[Any]]]:
        """:meth:`semaphore_state` of many semaphores in one round trip (one pipeline per
        node on a cluster)."""
        calls = [(scripts.SEM_STATE, (k.holders, k.meta, k.queue), ()) for k in keys]
        return [list(_raised(reply)) for reply in (yield from scripts_batch(calls))]

    def semaphore_evict(self, keys: SemaphoreKeys, holder: str, limit: int) -> Operation[int]:
        """Take ``holder``'s permit (an operator's action): 1 when it held a live one."""
        if (yield Command(("EXISTS", keys.queue, keys.ticket), keys.queue)):  # fair, with waiters
            fair_keys = semaphore_script_keys(keys, True)[:6]
            argv = (holder, limit, grace_ms())
            return int((yield from script(scripts.FAIR_RELEASE, fair_keys, argv)))
        argv = (holder, limit, int(settings.WAKE_SIGNAL_TTL * 1000))
        plain_keys = (keys.holders, keys.meta, keys.signal)
        return int((yield from script(scripts.SEM_RELEASE, plain_keys, argv)))


def _raised(reply: Any) -> Any:
    """``reply``, or raised when it is an error reply of a batch."""
    if isinstance(reply, BaseException):
        raise reply
    return reply


def shared_backend() -> RedisBackend:
    """The Redis backend around :func:`~.client.get_redis`'s client, the one the stock
    strategies, the delay queue and the dashboard use: the default backend when that
    client is its own, else one made around the client."""
    client = get_redis()
    default = get_backend()
    if isinstance(default, RedisBackend) and default.client is client:
        return default
    return backend_for_client(client)


def backend_for_client(client: Any) -> RedisBackend:
    """The :class:`RedisBackend` around an explicit redis-py client (``redis=``
    arguments; a ``redis.asyncio`` one for ``stock_locks.aio``): one per client,
    kept on the client, so that the watchdog batches the renewals of every lock
    on that client together."""
    backend = getattr(client, "_stock_locks_backend", None)
    if backend is None:
        if type(client).__module__.startswith("redis.asyncio"):
            backend = RedisBackend("(client)", async_client=client)
        else:
            backend = RedisBackend("(client)", client=client)
        with contextlib.suppress(AttributeError):  # (__slots__: one backend per call)
            client._stock_locks_backend = backend
    return backend
