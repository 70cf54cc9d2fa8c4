"""RedLock: one lock over N independent Redis masters, granted by a majority.

Configured as a ``BACKENDS`` alias::

    "redlock": {
        "BACKEND": "stock_locks.backends.redlock.RedLockBackend",
        "LOCATION": ["redis://a:6379/0", "redis://b:6379/0", "redis://c:6379/0"],
        "OPTIONS": {"NODE_TIMEOUT": 0.2, "RETRY_DELAY": 0.2},
    }

Each operation is the single-Redis Lua script (``backends/redis.py``'s builds)
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
a minority granted is given back).

Fencing. Each master proposes ``its counter + 1`` (its clock in microseconds
when it has no counter: ``lock_acquire.lua``'s counter rule). The grant's fence
is the highest proposal of its majority, and it counts only once a majority
stores at least that fence (``lock_fence.lua``; no extra round trip when the
granting majority already proposed the same value, the usual case). Any two
majorities share a master, so **every grant's fence is greater than every
earlier grant's while no majority has lost its data** (a master restarted
empty, or restored from an older snapshot, counts as having lost it).

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
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from .. import scripts
from ..conf import settings
from ..exceptions import LockError, LockNotOwned, RedisUnavailable
from ..holder import LockInfo
from ..keys import LockKeys, key_slot, lock_keys
from ..lease import Attempt, arun, run
from ..roundtrip import NO_HANDSHAKE
from ..wakeup import wait_for_signal
from .base import (
    ASYNCIO,
    FENCED,
    FORCE_RELEASE,
    HOLDER_METADATA,
    LEASED,
    SERVER_CLOCK,
    WAKE_UP,
    Backend,
)
from .redis import (
    CAPPED,
    GIVEN_BACK,
    NOT_OWNED,
    RELEASED,
    STILL_HELD,
    TRANSPORT_ERRORS,
    Requests,
    Tool,
    acquire_argv,
    acquire_keys,
    extend_keys,
    force_argv,
    lock_info,
    prepared_for,
    release_argv,
    release_keys,
    token_of,
)

NODE_TIMEOUT = 0.2  # seconds: the longest one round to the masters waits for replies
RETRY_DELAY = 0.2  # seconds: a try refused by split votes retries within this
CLOCK_DRIFT = 0.01  # of the ttl, plus 2 ms: how far the masters' clocks may run apart

SCRIPTS_BY_SHA = {
    s.sha: s for s in vars(scripts).values() if isinstance(s, type(scripts.LOCK_ACQUIRE))
}


def _script_command(script: Any, keys: Sequence[str], argv: Sequence) -> tuple:
    return ("EVALSHA", script.sha, len(keys), *keys, *argv)


class Failed:
    """A master's missing reply: unreachable, timed out, or an error reply."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"<failed: {self.error}>"


class Round(NamedTuple):
    """A transport request: ``commands[i]`` (a list of commands) to master ``i``, all
    at once, read with one deadline of ``NODE_TIMEOUT``; the replies per master, each
    a reply or a :class:`Failed`."""

    commands: Sequence[Sequence[tuple]]


class MasterPop(NamedTuple):
    """A transport request: :class:`~stock_locks.backends.redis.Pop` on master ``master``."""

    master: int
    key: str
    seconds: float


class RedLockBackend(Backend):
    """Locks over N independent Redis masters (no semaphores: see the README).

    Each operation is a generator of transport requests (:class:`Round`,
    :class:`MasterPop`): :meth:`execute` performs them on redis-py clients,
    :meth:`aexecute` on ``redis.asyncio`` clients of the running event loop.
    """

    capabilities = frozenset(
        {FENCED, LEASED, SERVER_CLOCK, WAKE_UP, HOLDER_METADATA, FORCE_RELEASE, ASYNCIO}
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
        kwargs: dict[str, Any] = {}
        if clients is None:
            if isinstance(location, str) or not location:
                raise LockError(
                    f"RedLock backend {alias!r}: LOCATION must be a list of Redis URLs "
                    "(one per independent master)"
                )
            # Every step bounded by the node timeout, and no handshake on connect (a
            # stalled master must cost one node timeout, not a handshake's wait too).
            kwargs = {key.lower(): value for key, value in options.items()}
            kwargs.setdefault("socket_timeout", self.node_timeout)
            kwargs.setdefault("socket_connect_timeout", self.node_timeout)
            kwargs.setdefault("retry", Retry(NoBackoff(), 0))
            kwargs.setdefault("protocol", 2)
            for key, value in NO_HANDSHAKE.items():
                kwargs.setdefault(key, value)
            clients = [redis.Redis.from_url(url, **kwargs) for url in location]
            self._owns_clients = True
        else:
            self._owns_clients = False
        if len(clients) < 3 or len(clients) % 2 == 0:
            raise LockError(
                f"RedLock backend {alias!r}: needs an odd number of masters, at least 3 "
                f"(got {len(clients)})"
            )
        self.clients = list(clients)
        self.quorum = len(self.clients) // 2 + 1
        self.locations = None if location is None else list(location)
        self.client_kwargs = kwargs

    def __repr__(self) -> str:
        return f"<RedLockBackend {self.alias!r} x{len(self.clients)}>"

    def close(self) -> None:
        if self._owns_clients:
            for client in self.clients:
                client.close()

    def execute(self, call: Any) -> Any:
        return run(getattr(self, call.verb)(*call.args, bounded=call.bounded), self.perform)

    async def aexecute(self, call: Any) -> Any:
        from ..aio.redlock import transport_for

        steps = getattr(self, call.verb)(*call.args, bounded=call.bounded)
        return await arun(steps, transport_for(self).perform)

    def perform(self, request: Any) -> Any:
        """Perform one transport request on the redis-py clients."""
        if type(request) is Round:
            return self._round(request.commands)
        if type(request) is MasterPop:
            return wait_for_signal(self.clients[request.master], request.key, request.seconds)
        return request.function(self.clients)  # a Tool

    # -- one round to every master -------------------------------------------------------

    def _round(self, commands: Sequence[Sequence[tuple]]) -> list[list[Any]]:
        """Send ``commands[i]`` (a list of commands) to master ``i``, all at once; the
        replies per master, each a reply or a :class:`Failed`. Every read shares one
        deadline of ``NODE_TIMEOUT``: a master that does not answer by then is
        counted as failed (its connection dropped)."""
        sent: list[tuple[int, Any]] = []
        results: list[list[Any]] = [[] for _ in commands]
        for index, batch in enumerate(commands):
            if not batch:
                continue
            pool = self.clients[index].connection_pool
            try:
                connection = pool.get_connection()  # (connects: fails fast on a dead master)
            except TRANSPORT_ERRORS as exc:
                results[index] = [Failed(exc)] * len(batch)
                continue
            try:
                connection.send_packed_command(connection.pack_commands(batch))
            except BaseException as exc:
                connection.disconnect()
                pool.release(connection)
                if not isinstance(exc, TRANSPORT_ERRORS):
                    self._drop(sent)
                    raise
                results[index] = [Failed(exc)] * len(batch)
                continue
            sent.append((index, connection))
        deadline = time.monotonic() + self.node_timeout
        try:
            while sent:
                index, connection = sent[0]
                results[index] = self._read(connection, commands[index], deadline)
                self.clients[index].connection_pool.release(connection)
                sent.pop(0)
        except BaseException:
            self._drop(sent)
            raise
        return results

    def _read(self, connection: Any, batch: Sequence[tuple], deadline: float) -> list[Any]:
        replies = self._replies(connection, len(batch), deadline)
        unknown = [
            i
            for i, reply in enumerate(replies)
            if isinstance(reply, Failed) and isinstance(reply.error, NoScriptError)
        ]
        if unknown:  # this master restarted and lost its scripts: once more, with the sources
            evals = [("EVAL", SCRIPTS_BY_SHA[batch[i][1]].script, *batch[i][2:]) for i in unknown]
            try:
                connection.send_packed_command(connection.pack_commands(evals))
                again = self._replies(connection, len(evals), deadline)
            except TRANSPORT_ERRORS as exc:
                connection.disconnect()
                again = [Failed(exc)] * len(evals)
            for i, reply in zip(unknown, again, strict=True):
                replies[i] = reply
        return replies

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
            except TRANSPORT_ERRORS as exc:
                connection.disconnect()  # a late reply must not reach the next user
                replies.extend([Failed(exc)] * (count - len(replies)))
        return replies

    def _drop(self, sent: list[tuple[int, Any]]) -> None:
        for index, connection in sent:
            connection.disconnect()
            self.clients[index].connection_pool.release(connection)

    def _all(self, command: tuple) -> Requests[list[Any]]:
        """``command`` on every master; one reply (or :class:`Failed`) per master."""
        return [replies[0] for replies in (yield Round([[command]] * len(self.clients)))]

    def _unavailable(self, what: str, replies: Sequence[Any]) -> RedisUnavailable:
        errors = [str(r.error) for r in replies if isinstance(r, Failed)]
        return RedisUnavailable(
            f"RedLock {self.alias!r}: {what}: fewer than {self.quorum} of {len(self.clients)} "
            f"masters answered ({'; '.join(errors[:3])})",
            backend=self.alias,
        )

    def _validity_ms(self, ttl_ms: int, started: float) -> float:
        elapsed_ms = (time.monotonic() - started) * 1000
        return ttl_ms - elapsed_ms - (ttl_ms * self.clock_drift + 2)

    # -- locks -------------------------------------------------------------------------

    def lock_keys(self, name: str) -> LockKeys:
        return lock_keys(name)

    def lock_try(
        self, lock: Any, token: str, depth: int, waited: bool, *, bounded: bool = False
    ) -> Requests[Attempt]:
        keys = lock.keys
        holder = prepared_for(lock).holder_part()
        argv = (*acquire_argv(token, lock._ttl_ms, depth, holder, waited), "counter")
        started = time.monotonic()
        replies = yield from self._all(
            _script_command(scripts.LOCK_ACQUIRE, acquire_keys(keys), argv)
        )
        granted = [r for r in replies if not isinstance(r, Failed) and r[0] == 1]
        answered = sum(not isinstance(r, Failed) for r in replies)
        valid = self._validity_ms(lock._ttl_ms, started) > 0
        if depth:
            if len(granted) >= self.quorum and valid:
                return Attempt(True, fence=max(int(r[1]) for r in granted), count=depth + 1)
            if answered < self.quorum:
                raise self._unavailable(f"re-entry of {lock.name!r}", replies)
            raise LockNotOwned(
                f"cannot re-enter {lock.name!r}: this owner's token no longer holds it on a "
                "majority of masters (its lease ran out or it was force-released)",
                name=lock.name,
            )
        if len(granted) >= self.quorum and valid:
            fence = max(int(r[1]) for r in granted)
            agreed = sum(int(r[1]) == fence for r in granted) >= self.quorum
            stored = agreed or (yield from self._store_fence(keys, token, fence))
            if stored and self._validity_ms(lock._ttl_ms, started) > 0:
                return Attempt(True, fence=fence, count=1)
        # Not granted: take back what a minority (or a too-slow majority) granted, so
        # that the next try (same token) starts clean.
        with contextlib.suppress(RedisUnavailable):  # (what stays frees with its lease)
            yield from self.lock_release(lock, token, 1, "retract")
        if answered < self.quorum:
            raise self._unavailable(f"acquire of {lock.name!r}", replies)
        if any(not isinstance(r, Failed) and r[0] == GIVEN_BACK for r in replies):
            raise LockError(f"lock {lock.name!r}: this try's token was already given back")
        return Attempt(False, wait=self._wait_after(replies, len(granted)))

    def _store_fence(self, keys: LockKeys, token: str, fence: int) -> Requests[bool]:
        retention_ms = max(1, int(settings.FENCE_RETENTION * 1000))
        command = _script_command(
            scripts.LOCK_FENCE, (keys.fence, keys.lock), (token, fence, retention_ms)
        )
        return sum(reply == 1 for reply in (yield from self._all(command))) >= self.quorum

    def _wait_after(self, replies: Sequence[Any], granted: int) -> float | None:
        """How long a refused caller may sleep: until enough held leases end for a
        majority to be free; a short random delay when the votes split."""
        if granted:
            return random.uniform(0, self.retry_delay)
        leases = sorted(
            int(r[1]) if int(r[1]) >= 0 else float("inf")
            for r in replies
            if not isinstance(r, Failed) and r[0] == 0
        )
        free = len(self.clients) - len(leases) - sum(isinstance(r, Failed) for r in replies)
        needed = self.quorum - free
        if needed <= 0:
            return random.uniform(0, self.retry_delay)
        if needed > len(leases) or leases[needed - 1] == float("inf"):
            return None
        return (leases[needed - 1] + 1) / 1000

    def lock_release(
        self, lock: Any, token: str, depth: int, mode: str = "release", *, bounded: bool = False
    ) -> Requests[int]:
        command = _script_command(
            scripts.LOCK_RELEASE,
            release_keys(lock.keys),
            release_argv(token, depth, lock._ttl_ms, mode),
        )
        return self._release_outcome(f"release of {lock.name!r}", (yield from self._all(command)))

    def _release_outcome(self, what: str, replies: Sequence[Any]) -> int:
        """A release's outcome by majority. RELEASED once no majority can still hold the
        token (what a silent master may keep is a minority, freed by its lease) while
        one could have at the release; NOT_OWNED when a majority said the token held
        nothing (the lock was lost before); unavailable when a majority may still hold
        it (the caller repeats the release)."""
        votes = Counter(r for r in replies if not isinstance(r, Failed))
        unanswered = len(replies) - sum(votes.values())
        if votes[STILL_HELD] >= self.quorum:
            return STILL_HELD
        if votes[STILL_HELD] + unanswered >= self.quorum:
            raise self._unavailable(what, replies)
        if votes[RELEASED] + votes[STILL_HELD] + unanswered >= self.quorum:
            return RELEASED
        return NOT_OWNED

    def lock_extend(
        self, lock: Any, token: str, ttl_ms: int, max_hold_ms: int = 0, *, bounded: bool = False
    ) -> Requests[int]:
        started = time.monotonic()
        command = _script_command(
            scripts.LOCK_EXTEND, extend_keys(lock.keys), (token, ttl_ms, max_hold_ms)
        )
        replies = yield from self._all(command)
        return self._extend_outcome(f"extend of {lock.name!r}", replies, ttl_ms, started)

    def _extend_outcome(
        self, what: str, replies: Sequence[Any], ttl_ms: int, started: float
    ) -> int:
        """1 when a majority extended the lease in time, CAPPED when max_hold cut it on a
        majority, 0 when no majority can still hold it for this token; unavailable when
        that cannot be told (the caller repeats it)."""
        votes = Counter(r for r in replies if not isinstance(r, Failed))
        unanswered = len(replies) - sum(votes.values())
        held = votes[1] + votes[CAPPED]
        if held + unanswered < self.quorum:
            return 0
        if held < self.quorum or self._validity_ms(ttl_ms, started) <= 0:
            raise self._unavailable(what, replies)
        return 1 if votes[1] >= self.quorum else CAPPED

    def renew_many(self, renewals: Sequence[Any], *, bounded: bool = False) -> Requests[list]:
        """Every renewal's extend on every master in one round; per renewal, 1 when a
        majority extended it in time, CAPPED, 0 (lost), or a RedisUnavailable when
        too few masters answered to tell."""
        started = time.monotonic()
        commands = [
            _script_command(
                scripts.LOCK_EXTEND, extend_keys(r.keys), (r.token, r.ttl_ms, r.max_hold_ms)
            )
            for r in renewals
        ]
        per_master = yield Round([commands] * len(self.clients))
        outcomes: list = []
        for i, r in enumerate(renewals):
            try:
                outcomes.append(
                    self._extend_outcome(
                        f"renewal of {r.name!r}",
                        [replies[i] for replies in per_master],
                        r.ttl_ms,
                        started,
                    )
                )
            except RedisUnavailable as exc:  # unknown: the watchdog tries again soon
                outcomes.append(exc)
        return outcomes

    def lock_wait(self, lock: Any, seconds: float, *, bounded: bool = False) -> Requests[bool]:
        count = len(self.clients)
        home = key_slot(lock.keys.lock) % count
        deadline = time.monotonic() + seconds
        for step in range(count):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                return (yield MasterPop((home + step) % count, lock.keys.signal, remaining))
            except TRANSPORT_ERRORS:
                continue  # that master is down: wait on the next one
        return False

    def _majority_holder(self, replies: Sequence[Any]) -> list | None:
        """The inspect replies of the token a majority shows, or None."""
        held = [r for r in replies if not isinstance(r, Failed) and r]
        tokens = Counter(token_of(r[0]) for r in held)
        for token, votes in tokens.items():
            if votes >= self.quorum:
                return [r for r in held if token_of(r[0]) == token]
        if sum(not isinstance(r, Failed) for r in replies) < self.quorum:
            raise self._unavailable("inspect", replies)
        return None

    def lock_inspect(
        self, name: str, keys: LockKeys, *, bounded: bool = False
    ) -> Requests[LockInfo | None]:
        command = _script_command(scripts.LOCK_INSPECT, (keys.lock,), ())
        held = self._majority_holder((yield from self._all(command)))
        if held is None:
            return None
        infos = [info for reply in held if (info := lock_info(name, reply, self.alias))]
        best = max(infos, key=lambda info: info.fence or 0)
        remaining = [info.remaining for info in infos if info.remaining is not None]
        return replace(best, remaining=min(remaining) if remaining else None)

    def lock_token(self, keys: LockKeys, *, bounded: bool = False) -> Requests[str | None]:
        replies = yield from self._all(("GET", keys.lock))
        tokens = Counter(
            token_of(r) for r in replies if not isinstance(r, Failed) and r is not None
        )
        for token, votes in tokens.items():
            if votes >= self.quorum:
                return token
        if sum(not isinstance(r, Failed) for r in replies) < self.quorum:
            raise self._unavailable("read", replies)
        return None

    def force_release(
        self, info: LockInfo, keys: LockKeys, *, bounded: bool = False
    ) -> Requests[int]:
        command = _script_command(scripts.LOCK_RELEASE, release_keys(keys), force_argv(info))
        replies = yield from self._all(command)
        return self._release_outcome(f"force release of {info.name!r}", replies)

    def held_lock_names(self, *, bounded: bool = False) -> Requests[list[str]]:
        """Names in the held-locks index of any reachable master."""
        return (yield Tool(_held_lock_names))

    def inspect_many(
        self, chunk: Sequence[tuple[str, LockKeys]], *, bounded: bool = False
    ) -> Requests[list[LockInfo | None]]:
        infos = []
        for name, keys in chunk:
            infos.append((yield from self.lock_inspect(name, keys)))
        return infos

    def force_release_many(
        self, matches: Sequence[tuple[LockKeys, LockInfo]], *, bounded: bool = False
    ) -> Requests[list[int]]:
        results = []
        for keys, info in matches:
            results.append((yield from self.force_release(info, keys)))
        return results


def _held_lock_names(clients: Sequence[Any]) -> list[str]:
    """Names in the held-locks index of any reachable master."""
    from ..dashboard import held_lock_names

    names: set[str] = set()
    for client in clients:
        try:
            names.update(held_lock_names(client))
        except TRANSPORT_ERRORS:
            continue
    return sorted(names)
