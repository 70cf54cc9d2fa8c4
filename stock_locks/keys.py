"""Every Redis key shape stock_locks uses, built in one place.

A key is ``<prefix>:<kind>:{<name>}[:<part>]``. The braces are a Redis Cluster
hash tag: every key one script touches shares the same ``{<name>}``, so they all
land in one slot and the scripts run unchanged on a cluster.

A name goes into the tag escaped (:func:`escape_name`): ``%``, ``{`` and ``}``
become ``%25``, ``%7B`` and ``%7D``. A ``}`` in a name would otherwise end the
tag early (a name starting with ``}`` makes an empty tag, and Redis then hashes
each whole key: CROSSSLOT). Names without those characters are unchanged, and
:func:`unescape_name` gives the original back (the dashboard shows it).

Held locks are also listed in an index (``LockKeys.index``, a sorted set: lock
key -> lease end in ms on the Redis clock), kept by the lock scripts, so the
dashboard reads the held locks without walking the keyspace. On one Redis
server that is one key, ``<prefix>:locks``; on a Redis Cluster it is one key per
hash slot, ``<prefix>:locks:{<tag>}``, whose tag is chosen to hash to the
lock's own slot (:func:`slot_tag`), so a script still touches one slot only.

Semaphores and delay queues in use are listed in a registry per kind
(:func:`registry_key`, a sorted set: name -> last use in ms on the Redis clock),
so the dashboard finds them without walking the keyspace either
(``stock_locks.backends.redis.registry``).
"""

from __future__ import annotations

import binascii
import re
from typing import NamedTuple

from .conf import settings

SLOTS = 16384  # Redis Cluster hash slots


class LockKeys(NamedTuple):
    lock: str  # the holder's record (expires with the lease), then a tombstone (the last
    # fence, the tokens released lately; expires FENCE_RETENTION after the clock passed it)
    fence: str  # a fencing counter ahead of the clock (and RedLock's counter)
    signal: str  # wake-up list a release pushes to; waiters BLPOP it
    index: str  # type: ignore[assignment]  # zset of locks in use (key -> listed until, ms) in its slot
    given_back: str  # tries given up (a zset: each FENCE_RETENTION, pruned on write)


_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}
_UNESCAPE = re.compile("%(25|7B|7D)")
_UNESCAPES = {"25": "%", "7B": "{", "7D": "}"}


def escape_name(name: str) -> str:
    """``name`` made safe inside a hash tag: no ``{`` or ``}``; reversible."""
    if "%" in name or "{" in name or "}" in name:
        return "".join(_ESCAPES.get(c, c) for c in name)
    return name


def unescape_name(text: str) -> str:
    """The original name of an :func:`escape_name` result."""
    if "%" not in text:
        return text
    return _UNESCAPE.sub(lambda m: _UNESCAPES[m.group(1)], text)


def _checked(name: object, kind: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind} name must be a non-empty string, got {name!r}")
    return escape_name(name)


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster hash slot of ``key`` (its hash tag's, when it has one)."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % SLOTS


def prefix() -> str:
    return settings.key_prefix()


def lock_base(name: str) -> str:
    return f"{settings.key_prefix()}:lock:{{{_checked(name, 'lock')}}}"


def lock_keys(name: str, cluster: bool = False) -> LockKeys:
    """The keys of lock ``name``. ``cluster``: the client is a Redis Cluster
    client (the held-locks index is then per hash slot)."""
    base = lock_base(name)
    index = lock_index_key(key_slot(base)) if cluster else lock_index_key()
    return LockKeys(base, f"{base}:fence", f"{base}:signal", index, f"{base}:given_back")


def lock_name_of(key: str) -> str | None:
    """The lock name of a lock key (an index member), or None for another key."""
    head = f"{settings.key_prefix()}:lock:{{"
    if key.startswith(head) and key.endswith("}"):
        return unescape_name(key[len(head) : -1])
    return None


def lock_index_key(slot: int | None = None) -> str:
    """The held-locks index: the one of a single server (``slot`` None), or of a cluster slot."""
    if slot is None:
        return f"{settings.key_prefix()}:locks"
    return f"{settings.key_prefix()}:locks:{{{slot_tag(slot)}}}"


def lock_scan_pattern() -> str:
    """SCAN pattern matching every lock key (not its side keys)."""
    return f"{settings.key_prefix()}:lock:{{*}}"


# -- a hash tag for every slot ------------------------------------------------------
#
# CRC16 (XMODEM: initial value 0, no final xor) is linear over GF(2) for messages
# of one length: crc(a ^ b) == crc(a) ^ crc(b). A tag is TAG_LENGTH characters,
# each 0x40 plus 5 free bits ('@', 'A'..'Z', '[', '\', ']', '^', '_': never a
# brace). The slot of a tag is then the slot of the all-'@' tag xor the slots of
# its set free bits, so a tag for any slot is found by solving a small linear
# system once (Gaussian elimination), with no search.

TAG_LENGTH = 4
_TAG_BASE = 0x40
_TAG_BITS = 5


def _slot_basis() -> list[tuple[int, int]]:
    """Reduced rows (slot bits, tag bits) spanning every slot."""
    rows: list[tuple[int, int]] = []
    for position in range(TAG_LENGTH):
        for bit in range(_TAG_BITS):
            delta = bytearray(TAG_LENGTH)
            delta[position] = 1 << bit
            vector = binascii.crc_hqx(bytes(delta), 0) % SLOTS
            choice = 1 << (position * _TAG_BITS + bit)
            for pivot_vector, pivot_choice in rows:
                if vector ^ pivot_vector < vector:  # shares the pivot's top bit
                    vector ^= pivot_vector
                    choice ^= pivot_choice
            if vector:
                rows.append((vector, choice))
                rows.sort(reverse=True)
    if len(rows) != SLOTS.bit_length() - 1:
        raise RuntimeError("tag alphabet does not reach every hash slot")
    return rows


_BASIS = _slot_basis()
_BASE_SLOT = binascii.crc_hqx(bytes([_TAG_BASE] * TAG_LENGTH), 0) % SLOTS
_tags: dict[int, str] = {}


def slot_tag(slot: int) -> str:
    """A short hash tag (no braces) whose key slot is ``slot``."""
    tag = _tags.get(slot)
    if tag is not None:
        return tag
    if not 0 <= slot < SLOTS:
        raise ValueError(f"a hash slot is 0..{SLOTS - 1}, got {slot!r}")
    target, choice = slot ^ _BASE_SLOT, 0
    for vector, row_choice in _BASIS:
        if target ^ vector < target:
            target ^= vector
            choice ^= row_choice
    chars = [
        _TAG_BASE | (choice >> (position * _TAG_BITS)) & ((1 << _TAG_BITS) - 1)
        for position in range(TAG_LENGTH)
    ]
    tag = _tags[slot] = bytes(chars).decode()
    return tag


def timeline_key() -> str:
    """The metrics timeline's base key; the bucket of second ``s`` is ``<base>:<s>``,
    of the ten seconds from ``t * 10`` ``<base>:10s:<t>``, and the processes'
    heartbeats are the hash :func:`heartbeats_key`."""
    return f"{settings.key_prefix()}:metrics:{{metrics}}:timeline"


def heartbeats_key() -> str:
    """Hash ``role|host|pid`` -> when that process was last seen (ms, Redis clock),
    written by the metrics flush beside the timeline (same slot)."""
    return f"{timeline_key()}:processes"


class StockKeys:
    """Stock keys, all under one hash tag (``STOCK_HASH_TAG``) so a cart is one slot.

    ``counter(sku)``: units of ``sku`` left to sell (string integer, no expiry).
    ``record(ref)``: the reservation of order ``ref`` as a hash sku -> qty.
    ``index``: sorted set of open reservation records, scored by creation ms.
    ``loaded``: hash (epoch, run_id, loaded_at) written when the counters were built
    from the database; its absence means Redis lost its data.
    ``versions``: hash sku -> version, bumped by every script that moves that SKU's
    counter, so a reader can tell that a counter did not move between two reads.
    ``cap_usage(cap, customer)``: hash order ref -> ``units:ms``, the customer's
    reservations under a purchase cap; ``record(ref) + ":caps"``: hash usage key ->
    units, the caps a record counts under (:mod:`stock_locks.stock.caps`).
    ``confirm_queue``, ``confirm_leader``, ``confirm_reply(ref)``: the group commit's
    queue of reservations waiting for the database, its leader, and the answer list
    of one waiting caller (:mod:`stock_locks.stock.groupcommit`).
    """

    def __init__(self) -> None:
        self.base = f"{settings.key_prefix()}:stock:{{{settings.STOCK_HASH_TAG}}}"
        self.index = f"{self.base}:reservations"
        self.loaded = f"{self.base}:loaded"
        self.versions = f"{self.base}:versions"
        self._counter = f"{self.base}:avail:"
        self._record = f"{self.base}:res:"
        self.confirm_queue = f"{self.base}:confirm"
        self.confirm_leader = f"{self.base}:confirm:leader"
        self._confirm_reply = f"{self.base}:confirm:reply:"
        self._cap = f"{self.base}:cap:"

    def counter(self, sku: str) -> str:
        return self._counter + sku

    def record(self, order_ref: str) -> str:
        return self._record + order_ref

    def cap_usage(self, cap: str, customer: str) -> str:
        """Hash order ref -> ``units:ms`` of ``customer``'s reservations under ``cap``."""
        return f"{self._cap}{cap}:{customer}"

    def confirm_reply(self, order_ref: str) -> str:
        return self._confirm_reply + order_ref

    def counter_pattern(self) -> str:
        return self._counter + "*"

    def sku_from_counter(self, key: str) -> str:
        return key[len(self._counter) :]


class SemaphoreKeys(NamedTuple):
    holders: str  # zset: holder id -> lease expiry (ms, Redis clock)
    meta: str  # hash: "limit", "waiting" (until when a refused caller sleeps, ms), id -> JSON
    signal: str  # wake-up list of the plain semaphore
    queue: str  # fair: zset waiter id -> ticket (arrival order)
    alive: str  # fair: zset waiter id -> when its place in the queue lapses (ms)
    ticket: str  # fair: ticket counter
    wake_prefix: str  # fair: + waiter id = that waiter's own wake-up list


def semaphore_keys(name: str) -> SemaphoreKeys:
    base = f"{settings.key_prefix()}:sem:{{{_checked(name, 'semaphore')}}}"
    return SemaphoreKeys(
        base, f"{base}:meta", f"{base}:signal", f"{base}:queue", f"{base}:alive",
        f"{base}:ticket", f"{base}:wake:",
    )  # fmt: skip


SEMAPHORES = "sem"  # the registry of semaphores (registry_key)
DELAY_QUEUES = "dq"  # the registry of delay queues


def registry_key(kind: str) -> str:
    """The registry of ``kind`` (:data:`SEMAPHORES`, :data:`DELAY_QUEUES`): a sorted set,
    name -> when it was last used (ms, Redis clock). One key per kind (its own hash tag)."""
    return f"{settings.key_prefix()}:registry:{{{kind}}}"


class DelayQueueKeys(NamedTuple):
    due: str  # zset: item id -> due time (ms, Redis clock)
    items: str  # hash: item id -> JSON {"task", "payload"}
    attempts: str  # hash: item id -> deliveries so far
    errors: str  # hash: item id -> last error
    inflight: str  # zset: item id -> visibility deadline (ms)
    dead: str  # zset: item id -> when it was given up (ms)
    signal: str  # list a schedule pushes when it moves the next due time earlier


def delay_queue_keys(name: str) -> DelayQueueKeys:
    base = f"{settings.key_prefix()}:dq:{{{_checked(name, 'delay queue')}}}"
    return DelayQueueKeys(
        f"{base}:due", f"{base}:items", f"{base}:attempts", f"{base}:errors",
        f"{base}:inflight", f"{base}:dead", f"{base}:signal",
    )  # fmt: skip


class WaitingRoomKeys(NamedTuple):
    """The keys of one waiting room (one sale event), all under the event's hash tag;
    their contents are described in ``stock_locks/lua/lib/waitingroom.lua``."""

    state: str  # hash: born, counters per lane, the admission bucket, the rate meter
    visitors: str  # hash: visitor id -> ticket
    tickets: str  # hash: ticket -> "<lane>:<place>:<visitor id>"
    polled: str  # zset: waiting ticket -> last poll (ms, Redis clock)
    active: str  # zset: admitted ticket -> last request (ms, Redis clock)
    lanes: tuple[str, ...]  # one list of tickets per lane, highest priority first
    prequeues: tuple[str, ...]  # one set of tickets per lane, joined before the start
    log: str  # list: the latest tickets admitted, oldest first

    def script_keys(self) -> list[str]:
        """The KEYS of the visit and admit scripts, in their order."""
        return [self.state, self.visitors, self.tickets, self.polled, self.active,
                *self.lanes, *self.prequeues, self.log]  # fmt: skip


def waiting_room_keys(event: str, lanes: int) -> WaitingRoomKeys:
    """The keys of the waiting room of ``event`` (its slug) with ``lanes`` lanes."""
    base = f"{settings.key_prefix()}:wr:{{{_checked(event, 'waiting room')}}}"
    return WaitingRoomKeys(
        f"{base}:state", f"{base}:visitors", f"{base}:tickets", f"{base}:polled",
        f"{base}:active", tuple(f"{base}:lane:{i}" for i in range(1, lanes + 1)),
        tuple(f"{base}:pre:{i}" for i in range(1, lanes + 1)), f"{base}:log",
    )  # fmt: skip
