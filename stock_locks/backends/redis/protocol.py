"""The Redis lock and semaphore scripts' calling convention: KEYS and ARGV built,
replies parsed, reply codes named. No I/O: the Redis backend (sync and asyncio)
and RedLock (the same scripts on N masters) build and parse here.

A script answers a reply code first. Each script's codes are an ``IntEnum``;
a code the enum does not know (a script of another version, a bug) raises
:class:`~stock_locks.exceptions.UnknownReply`, never read as a refusal or as
"Redis unavailable".
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...conf import settings
from ...exceptions import LockError, LockNotOwned
from ...holder import LockInfo, process_identity, thread_name
from ...keys import LockKeys, SemaphoreKeys
from ...scripts import LOCK_ACQUIRE, LOCK_RELEASE
from ..base import Attempt, LockSpec, ReleaseMode, _Codes

# How many released tokens a lock name remembers (in its lock key: the tombstone a
# release leaves, then the next holder's record), so that a repeated release (its
# first reply lost) still finds its own after this many more releases.
RELEASED_KEPT = 8


class AcquireReply(_Codes):
    """``lock_acquire.lua``'s first reply element."""

    REFUSED = 0  # {0, holder's pttl}
    GRANTED = 1  # {1, fence, count, state for the release (left out when ahead of the clock)}
    REENTRY_LOST = 2  # a re-entry whose token no longer holds the lock
    GIVEN_BACK = 3  # a token already given back: a late copy of an abandoned try


class SemaphoreReply(_Codes):
    """The semaphore acquire scripts' first reply element."""

    REFUSED = 0  # {0, wait ms, waiting, ticket}
    GRANTED = 1
    GIVEN_BACK = 2  # this holder id was given back


def decoded(value: Any) -> Any:
    """A reply decoded to ``str`` when it is ``bytes`` (clients may or may not decode)."""
    return value.decode() if isinstance(value, bytes) else value


def score_pairs(reply: Sequence[Any]) -> list[tuple[Any, float]]:
    """``ZRANGE ... WITHSCORES``'s reply as (member, score) pairs: flat in RESP2, pairs
    in RESP3 or once redis-py parsed it (which it does by version and protocol)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(member, float(score)) for member, score in reply]
    return [(member, float(score)) for member, score in zip(reply[::2], reply[1::2], strict=True)]


# -- the holder's record ------------------------------------------------------------------

# The holder's record (the lock key's value, lua/lib/lock_record.lua) is one string
# of fields separated by newlines: token, fence, count, ttl ms, acquired_at ms (Redis
# clock), thread, host, pid, watchdog ("1"/"0"), caller, then the name's state carried
# from grant to grant: the last fence, whether a refused try waits, until when the
# held-locks index lists it, the lease end (ms, Redis clock), and the tokens released
# lately. After a release the key holds a tombstone (an empty token, then the last
# fence, the index's end and the released tokens): the lock is free.
RECORD_FIELDS = (
    "token", "fence", "count", "ttl", "acquired_at", "thread", "host", "pid", "watchdog", "caller",
    "last", "waiting", "indexed", "until", "released",
)  # fmt: skip


def _field(text: str) -> str:
    """``text`` made safe as one field of a holder's record (no newline)."""
    return text.replace("\n", " ") if "\n" in text else text


@functools.lru_cache(maxsize=1024)
def _holder_tail(caller: str, watchdog: bool, identity: tuple[str, str]) -> str:
    host, pid = identity
    return f"{_field(host)}\n{pid}\n{int(watchdog)}\n{_field(caller)}"


def holder_argv(caller: str, watchdog: bool) -> str:
    """The fixed part of the holder's record, ``host \\n pid \\n watchdog \\n caller``: the
    tail of ``lock_acquire.lua``'s ARGV[5], after the thread (made once per process)."""
    return _holder_tail(caller, watchdog, process_identity())


def fence_retention_ms() -> int:
    """``FENCE_RETENTION`` in ms: how long a fencing counter outlives the moment the Redis
    clock passes its last fence (``lock_acquire.lua``)."""
    return max(1, int(settings.FENCE_RETENTION * 1000))


def acquire_argv(token: str, ttl_ms: int, count: int, holder: str, waited: bool) -> tuple[Any, ...]:
    """ARGV of ``lock_acquire.lua``; ``holder`` comes from :func:`holder_argv`."""
    thread = _field(thread_name())
    return (token, ttl_ms, count, int(waited), f"{thread}\n{holder}", fence_retention_ms())


def release_argv(
    token: str, count: int, mode: ReleaseMode = ReleaseMode.RELEASE
) -> tuple[Any, ...]:
    """ARGV of ``lock_release.lua``: the tombstone it leaves (the last fence and the
    released tokens) lives ``FENCE_RETENTION`` after the Redis clock passed the fence."""
    wake_ms = int(settings.WAKE_SIGNAL_TTL * 1000)
    return (token, count, wake_ms, fence_retention_ms(), RELEASED_KEPT, mode.value)


def extend_argv(token: str, ttl_ms: int, max_hold_ms: int, rule: str = "clock") -> tuple[Any, ...]:
    """ARGV of ``lock_extend.lua``; ``rule`` is the fence rule, ``"counter"`` for RedLock."""
    return (token, ttl_ms, max_hold_ms, rule, fence_retention_ms())


def acquire_keys(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, keys.fence, keys.index, keys.given_back)


def release_keys(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, keys.signal, keys.fence, keys.given_back)


def extend_keys(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, keys.index, keys.fence)


def token_of(record: Any) -> str | None:
    """The token of a holder's record (the lock key's value; None: free, also for the
    tombstone a release leaves, whose token is empty)."""
    if record is None:
        return None
    text: str = decoded(record)
    return text.split("\n", 1)[0] or None


def parse_record(record: Any) -> dict[str, str]:
    """The fields of a holder's record (a bare token, e.g. written by another
    client, has the token only). A tombstone (free) reads as an empty token."""
    values = decoded(record).split("\n", len(RECORD_FIELDS) - 1)
    return dict(zip(RECORD_FIELDS, values, strict=False))


def is_held(record: Any) -> bool:
    """Whether a lock key's value is a holder's record (not None, not a tombstone)."""
    return token_of(record) is not None


def lock_attempt(name: str, reply: Sequence[Any]) -> Attempt:
    """An :class:`Attempt` from ``lock_acquire.lua``'s reply.

    Raises :class:`LockNotOwned` for a re-entry whose token no longer holds the
    lock, :class:`LockError` for a token already given back.
    """
    code = AcquireReply.of(reply[0])
    if code is AcquireReply.GRANTED:
        return Attempt(True, fence=int(reply[1]), count=int(reply[2]))
    if code is AcquireReply.REENTRY_LOST:
        raise LockNotOwned(
            f"cannot re-enter {name!r}: this owner's token no longer holds it "
            "(its lease ran out or it was force-released)",
            name=name,
        )
    if code is AcquireReply.GIVEN_BACK:
        raise LockError(f"lock {name!r}: this try's token was already given back", name=name)
    pttl = int(reply[1])
    # The holder's lease bounds the wait; -1 (no expiry): unknown.
    return Attempt(False, wait=(pttl + 1) / 1000 if pttl > 0 else None)


def lock_info(name: str, reply: Sequence[Any], backend: str = "default") -> LockInfo | None:
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


def force_argv(info: LockInfo) -> tuple[Any, ...]:
    """ARGV of an operator's release of ``info``'s hold."""
    return release_argv(info.token, 1, ReleaseMode.FORCE)


# -- semaphores ----------------------------------------------------------------------------


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


def semaphore_attempt(name: str, reply: Sequence[Any], fair: bool) -> Attempt:
    code = SemaphoreReply.of(reply[0])
    if code is SemaphoreReply.GIVEN_BACK:
        raise LockError(
            f"semaphore {name!r}: this holder id was given back; acquire again", name=name
        )
    if code is SemaphoreReply.GRANTED:
        return Attempt(True)
    ticket = (int(reply[3]) or None) if fair else None
    return Attempt(False, wait=int(reply[1]) / 1000, ticket=ticket)


def grace_ms() -> int:
    return int(settings.FAIR_QUEUE_GRACE * 1000)


# -- commands packed once ------------------------------------------------------------------


def bulk(data: bytes) -> bytes:
    """``data`` as one RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


class CommandHead:
    """``EVALSHA sha numkeys key...`` of one script on fixed KEYS, packed once in the
    wire format (RESP); a call packs only its ARGV after it."""

    __slots__ = ("count", "data")

    def __init__(self, sha: str, keys: Sequence[str]) -> None:
        fixed = (b"EVALSHA", sha.encode(), str(len(keys)).encode(), *(k.encode() for k in keys))
        self.count = len(fixed)
        self.data = b"".join(bulk(item) for item in fixed)

    def pack(self, encode: Any, argv: Sequence[Any]) -> bytes:
        """The whole command: this head, then ``argv`` encoded by ``encode`` (bytes, str
        and int, what the lock scripts take, encoded here as ``encode`` would, UTF-8)."""
        parts = [b"*%d\r\n" % (self.count + len(argv)), self.data]
        for arg in argv:
            kind = type(arg)
            if kind is str:
                data = arg.encode()
            elif kind is int:
                data = b"%d" % arg
            elif kind is bytes:
                data = arg
            else:
                data = encode(arg)
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        return b"".join(parts)


@dataclass(frozen=True, slots=True)
class RedisLockSpec(LockSpec):
    """A lock's spec on Redis, with what its scripts take that never changes: the KEYS
    of acquire and release and their packed ``EVALSHA`` heads."""

    acquire_keys: tuple[str, ...] = ()
    release_keys: tuple[str, ...] = ()
    acquire_head: CommandHead | None = None
    release_head: CommandHead | None = None


def lock_spec(name: str, keys: LockKeys, ttl_ms: int, caller: str, watchdog: bool) -> RedisLockSpec:
    acquiring, releasing = acquire_keys(keys), release_keys(keys)
    return RedisLockSpec(
        name, keys, ttl_ms, caller, watchdog,
        acquire_keys=acquiring,
        release_keys=releasing,
        acquire_head=CommandHead(LOCK_ACQUIRE.sha, acquiring),
        release_head=CommandHead(LOCK_RELEASE.sha, releasing),
    )  # fmt: skip
