"""One Redis server (or a Redis Cluster): locks and semaphores as Lua scripts.

Each operation is a build (script, keys, argv), an execute and a parse; only
the execute step talks to Redis, and it is the one place where redis-py's
transport errors become :class:`~stock_locks.exceptions.RedisUnavailable`. An
asyncio backend reuses the builds and the parses.

The client comes from, in order: an explicit ``client``; the ``LOCATION`` URL
(``OPTIONS["CLUSTER"]``: a ``RedisCluster``, and ``LOCATION`` may then be a list
of node URLs, any reachable one of which is enough to find the others); the
django-redis cache alias ``OPTIONS["CACHE_ALIAS"]``, else
``STOCK_LOCKS["REDIS_ALIAS"]``. On a Redis Cluster every script's keys share one
hash slot, the held-locks index is one key per slot, and batches (watchdog
renewals) run per node; calls made on a node's own connection read the slot
map again when the node answers that it no longer serves the slot, or cannot be
reached (``stock_locks.connection``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import scripts
from ..conf import settings
from ..connection import (
    CLUSTER_UNAVAILABLE_ERRORS,
    NODE_ERRORS,
    decoded,
    is_cluster,
    on_node,
    refresh_slot_map,
    stale_route,
)
from ..exceptions import LockError, LockNotOwned, LockNotReplicated, RedisUnavailable
from ..holder import LockInfo, process_identity, thread_name
from ..keys import LockKeys, SemaphoreKeys, lock_keys, semaphore_keys
from ..lease import Attempt, arun, run
from ..roundtrip import bounded_call
from ..wakeup import wait_for_signal
from .base import (
    ASYNCIO,
    FENCED,
    FORCE_RELEASE,
    HOLDER_METADATA,
    LEASED,
    SEMAPHORES,
    SERVER_CLOCK,
    WAKE_UP,
    Backend,
)

if TYPE_CHECKING:
    from redis.commands.core import Script

T = TypeVar("T")
# An operation of a backend: a generator of transport requests (Eval, Pop, ...) that
# receives their replies and returns the operation's result.
Requests = Generator[Any, Any, T]

# Errors after which a call may or may not have run on the server; ReadOnlyError:
# the node became a replica in a failover (the client's next call finds the new master).
# On a cluster, also the answers of one changing hands (CLUSTERDOWN, redirects that did
# not settle, no node for a slot yet): nothing ran, and a later call may succeed.
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError, RedisTimeoutError, ReadOnlyError, *CLUSTER_UNAVAILABLE_ERRORS,
)  # fmt: skip

# lock_release.lua's replies; lock_extend.lua's reply when max_hold cut the lease.
NOT_OWNED, RELEASED, STILL_HELD = 0, 1, 2
CAPPED = 2
# lock_acquire.lua's replies besides a grant (1) and a refusal (0).
_REENTRY_LOST, GIVEN_BACK = 2, 3
# The semaphore scripts' replies.
_SEM_GRANTED, _SEM_GIVEN_BACK = 1, 2
# How many released tokens a lock name remembers, so that a repeated release
# (its first reply lost) still finds its own after this many more releases.
RELEASED_KEPT = 8


def run_batch(client: Any, calls: Sequence[tuple[Any, Sequence, Sequence]]) -> list:
    """``scripts.run_batch`` on one server; on a Redis Cluster (whose pipelines
    refuse EVALSHA) one such batch per node, on that node's own connection.
    Replies in the order of ``calls``; a call that failed inside Redis gives its
    exception object.

    On a cluster, calls a node answered with a redirect (its slot moved: a
    failover, a reshard; they did not run) are grouped again by a freshly read
    slot map and sent once more; when they are still misrouted, that error is
    raised. A node that cannot be reached refreshes the slot map too, and its
    transport error is raised once every other node's batch has run (so one dead
    node does not hold up the others' calls). Every call must be safe to repeat.
    """
    if not is_cluster(client):
        return scripts.run_batch(client, calls)
    replies: list = [None] * len(calls)
    pending = list(range(len(calls)))
    for attempt in range(2):
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for index in pending:
            node = client.get_node_from_key(calls[index][1][0])
            by_node.setdefault(node.name, (node, []))[1].append(index)
        failure: BaseException | None = None
        for node, indexes in by_node.values():
            batch = [calls[i] for i in indexes]
            try:
                results = scripts.run_batch(client.get_redis_connection(node), batch)
            except NODE_ERRORS as exc:
                failure = failure or exc
                continue
            for index, reply in zip(indexes, results, strict=True):
                replies[index] = reply
        misrouted = [i for i in pending if stale_route(replies[i])]
        if failure is not None or misrouted:
            refresh_slot_map(client)
        if failure is not None:
            raise failure
        if not misrouted:
            break
        if attempt:
            raise replies[misrouted[0]]
        pending = misrouted
    return replies


# -- builds and parses, shared with the asyncio backend ---------------------------------


# The holder's record (the lock key's value, lock_acquire.lua) is one string of
# fields separated by newlines: token, fence, count, ttl ms, acquired_at ms (Redis
# clock), thread, host, pid, watchdog ("1"/"0"), caller.
RECORD_FIELDS = (
    "token", "fence", "count", "ttl", "acquired_at", "thread", "host", "pid", "watchdog", "caller",
)  # fmt: skip


def _field(text: str) -> str:
    """``text`` made safe as one field of a holder's record (no newline)."""
    return text.replace("\n", " ") if "\n" in text else text


def holder_argv(caller: str, watchdog: bool) -> str:
    """The fixed part of the holder's record, ``host \n pid \n watchdog \n caller``: the
    tail of ``lock_acquire.lua``'s ARGV[5], after the thread."""
    host, pid = process_identity()
    return f"{_field(host)}\n{pid}\n{int(watchdog)}\n{_field(caller)}"


def acquire_argv(token: str, ttl_ms: int, depth: int, holder: str, waited: bool) -> tuple:
    """ARGV of ``lock_acquire.lua``; ``holder`` comes from :func:`holder_argv`."""
    retention_ms = max(1, int(settings.FENCE_RETENTION * 1000))
    return (token, ttl_ms, depth, int(waited), f"{_field(thread_name())}\n{holder}", retention_ms)


def release_argv(token: str, depth: int, ttl_ms: int, mode: str = "release") -> tuple:
    """ARGV of ``lock_release.lua``: the list of released tokens lives ``ttl_ms`` (the
    lock's lease) from its creation; ``mode`` is release, abandon or force."""
    wake_ms = int(settings.WAKE_SIGNAL_TTL * 1000)
    return (token, depth, wake_ms, ttl_ms, RELEASED_KEPT, mode)


def acquire_keys(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, keys.fence, keys.waiters, keys.index, keys.released)


def release_keys(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, keys.waiters, keys.signal, keys.released, keys.index)


def extend_keys(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, keys.waiters, keys.index)


def token_of(record: Any) -> str | None:
    """The token of a holder's record (the lock key's value; None: free)."""
    if record is None:
        return None
    text = decoded(record)
    return text.split("\n", 1)[0]


def parse_record(record: Any) -> dict[str, str]:
    """The fields of a holder's record (a bare token, e.g. written by another
    client, has the token only)."""
    values = decoded(record).split("\n", len(RECORD_FIELDS) - 1)
    return dict(zip(RECORD_FIELDS, values, strict=False))


def lock_attempt(name: str, reply: Sequence) -> Attempt:
    """An :class:`Attempt` from ``lock_acquire.lua``'s reply.

    Raises :class:`LockNotOwned` for a re-entry whose token no longer holds the
    lock, :class:`LockError` for a token already given back.
    """
    if reply[0] == 1:
        return Attempt(True, fence=int(reply[1]), count=int(reply[2]))
    if reply[0] == _REENTRY_LOST:
        raise LockNotOwned(
            f"cannot re-enter {name!r}: this owner's token no longer holds it "
            "(its lease ran out or it was force-released)",
            name=name,
        )
    if reply[0] == GIVEN_BACK:
        raise LockError(f"lock {name!r}: this try's token was already given back", name=name)
    pttl = int(reply[1])
    # The holder's lease bounds the wait; -1 (no expiry): unknown.
    return Attempt(False, wait=(pttl + 1) / 1000 if pttl > 0 else None)


def lock_info(name: str, reply: list, backend: str = "default") -> LockInfo | None:
    """A :class:`LockInfo` from ``lock_inspect.lua``'s reply (None: free)."""
    if not reply:
        return None
    record, pttl = reply[0], reply[1]
    holder = parse_record(record)

    def number(field: str) -> int | None:
        value = holder.get(field)
        return int(value) if value and value.lstrip("-").isdigit() else None

    acquired_ms, ttl_ms = number("acquired_at"), number("ttl")
    return LockInfo(
        name=name,
        token=holder["token"],
        fence=number("fence"),
        count=number("count") or 1,
        remaining=None if int(pttl) < 0 else int(pttl) / 1000,
        ttl=None if ttl_ms is None else ttl_ms / 1000,
        acquired_at=(
            None
            if acquired_ms is None
            else dt.datetime.fromtimestamp(acquired_ms / 1000, tz=dt.UTC)
        ),
        host=holder.get("host"),
        pid=holder.get("pid"),
        thread=holder.get("thread"),
        caller=holder.get("caller"),
        watchdog=holder.get("watchdog") == "1",
        backend=backend,
    )


def force_argv(info: LockInfo) -> tuple:
    """ARGV of an operator's release of ``info``'s hold (remembered for its lease)."""
    lifetime_ms = max(1, int((info.ttl or settings.LOCK_TTL) * 1000))
    return release_argv(info.token, 1, lifetime_ms, "force")


def gone_key(keys: SemaphoreKeys) -> str:
    """The zset of given-back semaphore holder ids (id -> until when it is remembered, ms)."""
    return f"{keys.holders}:gone"


def semaphore_script_keys(keys: SemaphoreKeys, fair: bool) -> tuple[str, ...]:
    """KEYS of the acquire and release scripts of a plain or fair semaphore."""
    if fair:
        return (
            keys.holders, keys.meta, keys.queue, keys.alive, keys.ticket, keys.wake_prefix,
            gone_key(keys),
        )  # fmt: skip
    return (keys.holders, keys.meta, gone_key(keys))


def semaphore_attempt(name: str, reply: Sequence, fair: bool) -> Attempt:
    if reply[0] == _SEM_GIVEN_BACK:
        raise LockError(
            f"semaphore {name!r}: this holder id was given back; acquire again", name=name
        )
    if reply[0] == _SEM_GRANTED:
        return Attempt(True)
    ticket = (int(reply[3]) or None) if fair else None
    return Attempt(False, wait=int(reply[1]) / 1000, ticket=ticket)


def grace_ms() -> int:
    return int(settings.FAIR_QUEUE_GRACE * 1000)


# -- the backend -----------------------------------------------------------------------


class Eval(NamedTuple):
    """A transport request: run ``script`` on ``keys`` and ``argv``. ``bounded``: on a
    connection of its own with every step bounded (a clean-up); ``head``: the
    packed ``EVALSHA sha numkeys KEYS`` of a lock's own keys."""

    script: Script
    keys: Sequence[str]
    argv: Sequence
    bounded: bool = False
    head: CommandHead | None = None


class Batch(NamedTuple):
    """A transport request: many (script, keys, argv) calls in one round trip (one per
    node on a cluster); replies in order, an exception object for a call that failed."""

    calls: Sequence[tuple[Any, Sequence, Sequence]]


class Pop(NamedTuple):
    """A transport request: sleep until an element of the list ``key`` is popped (True:
    a wake-up) or ``seconds`` pass (False)."""

    key: str
    seconds: float


class Command(NamedTuple):
    """A transport request: one plain command (``GET``, ``EXISTS``) on the key's node."""

    args: tuple


class GrantConfirmed(NamedTuple):
    """A transport request: ``lock_acquire.lua`` then ``WAIT replicas wait_ms`` on the
    same connection; (the script's reply, replicas that confirmed or an error)."""

    keys: Sequence[str]
    argv: Sequence
    replicas: int
    wait_ms: int


class Tool(NamedTuple):
    """A transport request for operator tools: ``function(sync_client)`` (under asyncio
    run in a worker thread)."""

    function: Callable[[Any], Any]


class RedisBackend(Backend):
    """Locks and semaphores on one Redis server or one Redis Cluster.

    Each operation is a generator of transport requests (:class:`Eval`,
    :class:`Pop`, ...): :meth:`execute` performs them on the redis-py client,
    :meth:`aexecute` on a ``redis.asyncio`` client of the running event loop
    (``stock_locks.aio``).
    """

    capabilities = frozenset(
        {FENCED, LEASED, SERVER_CLOCK, WAKE_UP, HOLDER_METADATA, SEMAPHORES, FORCE_RELEASE,
         ASYNCIO}
    )  # fmt: skip

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
        self.options = dict(options or {})
        self.location = location
        self._client = client
        self._owns_client = False
        self.async_client = async_client  # an explicit redis.asyncio client (redis=)
        self._perform_by_type: dict[type, Callable[[Any], Any]] = {
            Eval: self._eval,
            Pop: self._pop,
            Batch: self._batch,
            Command: self._command,
            GrantConfirmed: self._grant_confirmed,
            Tool: self._tool,
        }

    @property
    def client(self) -> Any:
        """The redis-py client (``Redis`` or ``RedisCluster``), made on first use."""
        if self._client is None:
            if self.async_client is not None:
                raise ImproperlyConfigured(
                    f"backend {self.alias!r} was made around a redis.asyncio client: "
                    "use the stock_locks.aio primitives with it"
                )
            self._client = self._make_client()
        return self._client

    def client_kwargs(self) -> dict[str, Any]:
        """The redis-py keyword arguments of a client made from ``LOCATION`` (OPTIONS
        lower-cased, bounded timeouts by default)."""
        kwargs = {
            key.lower(): value
            for key, value in self.options.items()
            if key not in ("CLUSTER", "CACHE_ALIAS", "REPLICAS")
        }
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 5.0)
        return kwargs

    def _make_client(self) -> Any:
        if self.location:
            kwargs = self.client_kwargs()
            self._owns_client = True
            if self.options.get("CLUSTER"):
                return _cluster_client(self.location, kwargs)
            if not isinstance(self.location, str):
                raise ImproperlyConfigured(
                    f"stock_locks backend {self.alias!r}: LOCATION is one redis:// URL "
                    '(a list of node URLs only with OPTIONS["CLUSTER"])'
                )
            return redis.Redis.from_url(self.location, **kwargs)
        from django_redis import get_redis_connection

        return get_redis_connection(self.options.get("CACHE_ALIAS") or settings.REDIS_ALIAS)

    @property
    def cluster(self) -> bool:
        if self._client is None and self.async_client is not None:
            return is_cluster(self.async_client)
        if self.location:
            return bool(self.options.get("CLUSTER"))
        return is_cluster(self.client)

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
        self._client = None

    def _unavailable(self, exc: BaseException) -> RedisUnavailable:
        return RedisUnavailable(
            f"Redis unavailable (backend {self.alias!r}): {exc}", backend=self.alias
        )

    def execute(self, call: Any) -> Any:
        try:
            return run(getattr(self, call.verb)(*call.args, bounded=call.bounded), self.perform)
        except TRANSPORT_ERRORS as exc:
            raise self._unavailable(exc) from exc

    async def aexecute(self, call: Any) -> Any:
        from ..aio.redis import transport_for

        transport = transport_for(self)
        try:
            steps = getattr(self, call.verb)(*call.args, bounded=call.bounded)
            return await arun(steps, transport.perform)
        except TRANSPORT_ERRORS as exc:
            raise self._unavailable(exc) from exc

    # -- the synchronous transport ---------------------------------------------------------

    def perform(self, request: Any) -> Any:
        """Perform one transport request on the redis-py client."""
        return self._perform_by_type[type(request)](request)

    def _eval(self, request: Eval) -> Any:
        script, keys, argv, bounded, head = request
        if bounded:
            return bounded_call(self.client, script, keys, argv)
        # (what redis-py's Script.__call__ does, without its per-call overhead)
        client = self.client
        try:
            if type(client) is _PLAIN_CLIENT and client.connection is None:
                return _evalsha_once(client, script.sha, keys, argv, head)
            return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)
        except NoScriptError:
            client.script_load(script.script)
            return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)

    def _pop(self, request: Pop) -> bool:
        return wait_for_signal(self.client, request.key, request.seconds)

    def _batch(self, request: Batch) -> list:
        return run_batch(self.client, request.calls)

    def _command(self, request: Command) -> Any:
        return self.client.execute_command(*request.args)

    def _tool(self, request: Tool) -> Any:
        return request.function(self.client)

    def _grant_confirmed(self, request: GrantConfirmed) -> tuple[Any, Any]:
        # WAIT counts the replicas that have this connection's writes, so the
        # script and WAIT share one pipeline (one connection, one round trip).
        keys, argv, replicas, wait_ms = request

        def grant_and_wait(node: Any) -> tuple[list, Any]:
            for _ in range(2):
                pipe = node.pipeline(transaction=False)
                pipe.evalsha(scripts.LOCK_ACQUIRE.sha, len(keys), *keys, *argv)
                pipe.execute_command("WAIT", replicas, wait_ms)
                reply, confirmed = pipe.execute(raise_on_error=False)
                if not isinstance(reply, NoScriptError):
                    break
                node.script_load(scripts.LOCK_ACQUIRE.script)
            if isinstance(reply, Exception):
                raise reply  # (a redirect: on_node sends it again on a fresh slot map)
            return reply, confirmed

        # On a cluster WAIT must run on the connection of the key's own master.
        return on_node(self.client, keys[0], grant_and_wait)

    # -- locks (each a generator of transport requests) -------------------------------------

    def lock_keys(self, name: str) -> LockKeys:
        return lock_keys(name, cluster=self.cluster)

    def lock_try(
        self, lock: Any, token: str, depth: int, waited: bool, *, bounded: bool = False
    ) -> Requests[Attempt]:
        prepared = prepared_for(lock)
        argv = acquire_argv(token, lock._ttl_ms, depth, prepared.holder_part(), waited)
        replicas = self.options.get("REPLICAS", settings.REPLICAS)
        if replicas and not bounded:
            reply = yield from self._acquire_replicated(lock, token, argv, replicas)
        else:
            reply = yield Eval(
                scripts.LOCK_ACQUIRE, prepared.acquire_keys, argv, bounded, prepared.acquire_head
            )
        if reply[0] == 1:
            return Attempt(True, fence=reply[1], count=reply[2])
        return lock_attempt(lock.name, reply)

    def _acquire_replicated(
        self, lock: Any, token: str, argv: tuple, replicas: int
    ) -> Requests[list]:
        wait_ms = max(1, int(settings.REPLICA_TIMEOUT * 1000))
        request = GrantConfirmed(acquire_keys(lock.keys), argv, replicas, wait_ms)
        reply, confirmed = yield request
        confirmed = 0 if isinstance(confirmed, Exception) else int(confirmed)
        if reply[0] == 1 and int(reply[2]) == 1 and confirmed < replicas:
            yield from self.lock_release(lock, token, 1, "abandon")
            raise LockNotReplicated(
                f"lock {lock.name!r}: {confirmed} of {replicas} replicas confirmed the grant "
                f"within {settings.REPLICA_TIMEOUT}s; grant undone",
                name=lock.name,
                required=replicas,
                confirmed=confirmed,
            )
        return reply

    def lock_release(
        self, lock: Any, token: str, depth: int, mode: str = "release", *, bounded: bool = False
    ) -> Requests[int]:
        argv = release_argv(token, depth, lock._ttl_ms, mode)
        prepared = prepared_for(lock)
        return (
            yield Eval(
                scripts.LOCK_RELEASE, prepared.release_keys, argv, bounded, prepared.release_head
            )
        )

    def lock_extend(
        self, lock: Any, token: str, ttl_ms: int, max_hold_ms: int = 0, *, bounded: bool = False
    ) -> Requests[int]:
        argv = (token, ttl_ms, max_hold_ms)
        return (yield Eval(scripts.LOCK_EXTEND, extend_keys(lock.keys), argv, bounded))

    def lock_wait(self, lock: Any, seconds: float, *, bounded: bool = False) -> Requests[bool]:
        return (yield Pop(lock.keys.signal, seconds))

    def lock_inspect(
        self, name: str, keys: LockKeys, *, bounded: bool = False
    ) -> Requests[LockInfo | None]:
        reply = yield Eval(scripts.LOCK_INSPECT, (keys.lock,), (), bounded)
        return lock_info(name, reply, self.alias)

    def lock_token(self, keys: LockKeys, *, bounded: bool = False) -> Requests[str | None]:
        """The token holding the lock now, or None."""
        return token_of((yield Command(("GET", keys.lock))))

    def force_release(
        self, info: LockInfo, keys: LockKeys, *, bounded: bool = False
    ) -> Requests[int]:
        """Release the hold of ``info.token`` as an operator (remembered as forced)."""
        return (yield Eval(scripts.LOCK_RELEASE, release_keys(keys), force_argv(info), bounded))

    def held_lock_names(self, *, bounded: bool = False) -> Requests[list[str]]:
        """Names of the locks the held-locks index lists (every slot's, on a cluster)."""
        from ..dashboard import held_lock_names

        return (yield Tool(held_lock_names))

    def inspect_many(
        self, chunk: Sequence[tuple[str, LockKeys]], *, bounded: bool = False
    ) -> Requests[list[LockInfo | None]]:
        """The holders of many locks, (name, keys) pairs, in one round trip per node."""
        reads = [(scripts.LOCK_INSPECT, (keys.lock,), ()) for _, keys in chunk]
        infos = []
        for (name, _), reply in zip(chunk, (yield Batch(reads)), strict=True):
            if isinstance(reply, Exception):
                raise reply
            infos.append(lock_info(name, reply, self.alias))
        return infos

    def force_release_many(
        self, matches: Sequence[tuple[LockKeys, LockInfo]], *, bounded: bool = False
    ) -> Requests[list[int]]:
        """:meth:`force_release` of many (keys, holder) pairs, one round trip per node."""
        calls = [
            (scripts.LOCK_RELEASE, release_keys(keys), force_argv(info)) for keys, info in matches
        ]
        results = yield Batch(calls)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def renew_many(self, renewals: Sequence[Any], *, bounded: bool = False) -> Requests[list]:
        """Extend many leases in one round trip (one per node on a cluster). Each renewal
        has ``keys``, ``token``, ``ttl_ms`` and ``max_hold_ms``; replies in order (an
        exception object for a call that failed inside Redis)."""
        calls = [
            (scripts.LOCK_EXTEND, extend_keys(r.keys), (r.token, r.ttl_ms, r.max_hold_ms))
            for r in renewals
        ]
        return (yield Batch(calls))

    # -- semaphores ----------------------------------------------------------------------

    def semaphore_keys(self, name: str) -> SemaphoreKeys:
        return semaphore_keys(name)

    def semaphore_try(
        self, sem: Any, patience_ms: int, *, bounded: bool = False
    ) -> Requests[Attempt]:
        host, pid = process_identity()
        holder = (host, pid, thread_name(), sem.caller)
        argv: tuple
        if sem.fair:
            argv = (sem.id, sem.limit, sem._ttl_ms, patience_ms, grace_ms(), *holder)
            script = scripts.FAIR_ACQUIRE
        else:
            argv = (sem.id, sem.limit, sem._ttl_ms, patience_ms, *holder)
            script = scripts.SEM_ACQUIRE
        reply = yield Eval(script, semaphore_script_keys(sem.keys, sem.fair), argv, bounded)
        return semaphore_attempt(sem.name, reply, sem.fair)

    def semaphore_release(
        self, sem: Any, abandon: bool = False, *, bounded: bool = False
    ) -> Requests[int]:
        mode = "abandon" if abandon else "release"
        if sem.fair:
            argv = (sem.id, sem.limit, grace_ms(), sem._lease_ms, mode)
            script = scripts.FAIR_RELEASE
            keys = semaphore_script_keys(sem.keys, True)
        else:
            wake_ms = int(settings.WAKE_SIGNAL_TTL * 1000)
            argv = (sem.id, sem.limit, wake_ms, sem._lease_ms, mode)
            script = scripts.SEM_RELEASE
            keys = (sem.keys.holders, sem.keys.meta, sem.keys.signal, gone_key(sem.keys))
        return (yield Eval(script, keys, argv, bounded))

    def semaphore_refresh(self, sem: Any, ttl_ms: int, *, bounded: bool = False) -> Requests[int]:
        k = sem.keys
        keys = (k.holders, k.meta, k.queue, k.alive, k.ticket) if sem.fair else (k.holders, k.meta)
        return (yield Eval(scripts.SEM_REFRESH, keys, (sem.id, ttl_ms), bounded))

    def semaphore_wait(self, sem: Any, seconds: float, *, bounded: bool = False) -> Requests[bool]:
        key = sem.keys.wake_prefix + sem.id if sem.fair else sem.keys.signal
        return (yield Pop(key, seconds))

    def semaphore_state(self, keys: SemaphoreKeys, *, bounded: bool = False) -> Requests[list]:
        """``sem_state.lua``'s reply: [now ms, limit, waiting, flat holders]."""
        return (yield Eval(scripts.SEM_STATE, (keys.holders, keys.meta, keys.queue), (), bounded))

    def semaphore_evict(
        self, keys: SemaphoreKeys, holder_id: str, limit: int, *, bounded: bool = False
    ) -> Requests[int]:
        """Take ``holder_id``'s permit (an operator's action): 1 when it held a live one."""
        if (yield Command(("EXISTS", keys.queue, keys.ticket))):  # a fair semaphore with waiters
            fair_keys = semaphore_script_keys(keys, True)[:6]
            return (yield Eval(scripts.FAIR_RELEASE, fair_keys, (holder_id, limit, grace_ms())))
        argv = (holder_id, limit, int(settings.WAKE_SIGNAL_TTL * 1000))
        return (yield Eval(scripts.SEM_RELEASE, (keys.holders, keys.meta, keys.signal), argv))


_PLAIN_CLIENT = redis.Redis


class CommandHead:
    """``EVALSHA sha numkeys key...`` of one script on fixed KEYS, packed once in the
    wire format (RESP); a call packs only its ARGV after it."""

    __slots__ = ("count", "data")

    def __init__(self, sha: str, keys: Sequence[str]) -> None:
        fixed = (b"EVALSHA", sha.encode(), str(len(keys)).encode(), *(k.encode() for k in keys))
        self.count = len(fixed)
        self.data = b"".join(bulk(item) for item in fixed)


def bulk(data: bytes) -> bytes:
    """``data`` as one RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _evalsha_once(
    client: Any, sha: str, keys: Sequence[str], argv: Sequence, head: CommandHead | None = None
) -> Any:
    """EVALSHA on a pooled connection of a plain ``redis.Redis``, without the per-call
    bookkeeping of its ``execute_command`` (and with ``head``, packing only ARGV). A
    transport error closes the connection and sends the call again through
    ``execute_command`` (the client's own retries): every script is safe to repeat."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        if head is not None and conn.encoder.encoding == "utf-8":  # (the head's encoding)
            encode = conn.encoder.encode
            size = b"*%d\r\n" % (head.count + len(argv))
            conn.send_packed_command([size + head.data + b"".join(bulk(encode(a)) for a in argv)])
        else:
            conn.send_command("EVALSHA", sha, len(keys), *keys, *argv)
        return conn.read_response()
    except (RedisConnectionError, RedisTimeoutError):
        conn.disconnect()
    finally:
        pool.release(conn)
    return client.execute_command("EVALSHA", sha, len(keys), *keys, *argv)


class _Prepared:
    """What a lock's scripts take that does not change between its calls: the KEYS of
    acquire and release, and the fixed part of its holder's record (made again in a
    forked child, whose pid differs)."""

    __slots__ = (
        "acquire_keys", "release_keys", "acquire_head", "release_head", "caller", "watchdog",
        "identity", "holder",
    )  # fmt: skip

    def __init__(self, lock: Any) -> None:
        self.acquire_keys = acquire_keys(lock.keys)
        self.release_keys = release_keys(lock.keys)
        self.acquire_head = CommandHead(scripts.LOCK_ACQUIRE.sha, self.acquire_keys)
        self.release_head = CommandHead(scripts.LOCK_RELEASE.sha, self.release_keys)
        self.caller, self.watchdog = lock.caller, lock.watchdog
        self.identity = process_identity()
        self.holder = holder_argv(lock.caller, lock.watchdog)

    def holder_part(self) -> str:
        """:func:`holder_argv` of this lock, made once per process."""
        identity = process_identity()
        if identity != self.identity:
            self.identity, self.holder = identity, holder_argv(self.caller, self.watchdog)
        return self.holder


def prepared_for(lock: Any) -> _Prepared:
    """The lock's :class:`_Prepared`, kept on the lock (made again when its caller or
    watchdog flag changed)."""
    prepared = lock.__dict__.get("_redis_prepared")
    if prepared is None or prepared.caller is not lock.caller or prepared.watchdog != lock.watchdog:
        prepared = lock.__dict__["_redis_prepared"] = _Prepared(lock)
    return prepared


def _cluster_client(location: str | Sequence[str], kwargs: dict[str, Any]) -> Any:
    """A ``RedisCluster`` seeded with the node URL(s) of ``location``: it asks them in
    turn for the cluster's nodes, so one reachable node among them is enough (a list
    lets a process start while one of them is down)."""
    from urllib.parse import urlsplit

    from redis.cluster import ClusterNode, RedisCluster

    urls = [location] if isinstance(location, str) else list(location)
    if not urls:
        raise ImproperlyConfigured("a Redis Cluster LOCATION needs at least one node URL")
    others = [urlsplit(url) for url in urls[1:]]
    seeds = [ClusterNode(url.hostname or "localhost", url.port or 6379) for url in others]
    return RedisCluster.from_url(urls[0], startup_nodes=seeds, **kwargs)


def backend_for_client(client: Any) -> RedisBackend:
    """The :class:`RedisBackend` around an explicit redis-py client (``redis=``
    arguments; a ``redis.asyncio`` one for ``stock_locks.aio``): one per client,
    kept on the client, so that the watchdog batches the renewals of every lock
    on that client together."""
    backend = getattr(client, "_stock_locks_backend", None)
    if backend is None:
        if _is_asyncio_client(client):
            backend = RedisBackend("(client)", async_client=client)
        else:
            backend = RedisBackend("(client)", client=client)
        with contextlib.suppress(AttributeError):  # (__slots__: one backend per call)
            client._stock_locks_backend = backend
    return backend


def _is_asyncio_client(client: Any) -> bool:
    return type(client).__module__.startswith("redis.asyncio")
