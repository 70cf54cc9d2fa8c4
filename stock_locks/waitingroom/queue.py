"""The waiting room in Redis: one list per priority lane, admission by one script.

A visitor (a session key or a user id) gets a ticket, a per-event sequence
number, the first time it arrives; arriving again finds the same ticket, never
a second place (the visitors hash, written by the same script that hands out the
ticket, so a repeated call after a lost reply gets the same ticket). Tickets go
to the end of their lane's list; before the sale's start they go to the lane's
pre-queue set instead, which the first script run after the start empties into
the list in a random order (``SPOP``), once.

Admission is a step of the same script (``stock_locks/lua/lib/waitingroom.lua``),
run by every visit (and by :meth:`WaitingRoom.admit`): lapsed sessions are
dropped, then visitors are taken from the head of the highest non-empty lane
while fewer than ``max_active`` (and than the units left times the factor) are
admitted and the admission bucket has a token. A head that stopped polling for
``queue_ttl`` is dropped on the way. The step is atomic on the Redis clock, so
every web process may run it at once; a repeated call is one more step within
the same limits, and a ticket admitted is in the admitted set, whoever gets the
reply. Every call is one round trip.

Redis losing the room's state (a restart without persistence, a failover to a
stale replica) must not double the admitted: passes issued before the loss are
taken without Redis for up to the pass refresh. So each process remembers the
state (``born``) it last saw per room: a pass of another state is renewed in
Redis (and refused there) instead, and a step that finds the state gone after
the start, in a process that saw it before, makes it with a hold of one pass
refresh during which nobody is admitted.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .. import scripts
from ..backends.redis.backend import RedisBackend, shared_backend
from ..backends.redis.requests import Pipeline, script
from ..conf import settings
from ..exceptions import UnknownReply
from ..keys import WaitingRoomKeys, waiting_room_keys
from .remaining import units_left
from .spec import RoomSpec

# waitingroom_visit.lua's codes, and the states a visitor is told
UNKNOWN, WAITING, ADMITTED, SOLD_OUT, PREQUEUE, NOT_OPEN = range(6)
STATES = {
    UNKNOWN: "unknown",
    WAITING: "waiting",
    ADMITTED: "admitted",
    SOLD_OUT: "sold_out",
    PREQUEUE: "waiting",  # (a place is drawn at the start: ``prequeue`` is True)
    NOT_OPEN: "not_open",
}
MIN_POLL = 2.0  # seconds: the shortest poll interval a visitor is advised
MAX_POLL = 30.0  # seconds: the longest

_born_seen: dict[str, int] = {}  # event slug -> the room state this process saw last


class Status(NamedTuple):
    """Where a visitor stands.

    ``state``: "waiting", "admitted", "sold_out" (waiting, but nothing is left: the
    place is kept should units come back), "not_open" (the pre-queue opens later)
    or "unknown" (no place; only when asked not to join). ``ticket``: its ticket (0
    without one); ``born``: when the room's Redis state was made (ms), which a pass
    carries. ``ahead``: visitors ahead (an upper bound: abandoned ones not reached
    yet count; None before the start). ``eta``: seconds until its turn at the measured
    pace (None when unknown). ``poll_after``: seconds until it should ask again.
    ``prequeue``: joined before the start; ``starts_in``: seconds until the start
    (or the pre-queue's opening).
    """

    state: str
    ticket: int
    born: int
    ahead: int | None = None
    eta: float | None = None
    poll_after: float = MIN_POLL
    prequeue: bool = False
    starts_in: float = 0.0


class RoomStats(NamedTuple):
    """What an operator sees of a room (one round trip, :meth:`WaitingRoom.stats`)."""

    waiting: int  # visitors with a place (an upper bound: see Status.ahead)
    prequeued: int
    admitted: int  # holding a slot now
    admitted_total: int
    abandoned_waiting: int
    abandoned_admitted: int
    left: int
    sold_out: bool
    tickets: int  # handed out so far
    admitted_per_second: float  # over the last 10 to 20 s of admission steps (0: none)


class WaitingRoom:
    """The waiting room of one sale event (:class:`RoomSpec`), on the Redis that
    stock_locks uses (or ``backend``). Cheap to make; thread-safe."""

    def __init__(self, spec: RoomSpec, *, backend: RedisBackend | None = None) -> None:
        self.spec = spec
        self.backend = backend or shared_backend()
        self.keys: WaitingRoomKeys = waiting_room_keys(spec.slug, len(spec.lanes))
        self._script_keys = self.keys.script_keys()

    def pass_refresh(self) -> float:
        """Seconds an admission pass is taken without asking Redis after it is issued."""
        return min(settings.WAITING_ROOM_PASS_REFRESH, self.spec.session_ttl / 3)

    def fresh_below(self) -> int:
        """Below this many units left, they are read for every call, not reused for
        ``WAITING_ROOM_STOCK_INTERVAL``: what the room may let in within one interval
        (a room-full, a bucket, the interval's admissions) could take them all, and a
        reused figure would admit visitors to units already gone."""
        spec = self.spec
        per_second = spec.admit_per_minute / 60
        bucket = max(1, math.ceil(per_second))
        within = spec.max_active + bucket + per_second * settings.WAITING_ROOM_STOCK_INTERVAL
        return math.ceil(within / spec.stock_factor)

    def known_born(self) -> int | None:
        """The room state (its ``born``, ms) this process saw last; None before any call."""
        return _born_seen.get(self.spec.slug)

    def _saw(self, born: int) -> None:
        if born:
            _born_seen[self.spec.slug] = born

    def _limits(self, remaining: int | None) -> list[Any]:
        spec = self.spec
        left = units_left(spec.skus, self.fresh_below()) if remaining is None else remaining
        hold = int(self.pass_refresh() * 1000) if spec.slug in _born_seen else 0
        return [
            spec.start_ms, spec.max_active, spec.admit_per_minute, repr(spec.stock_factor),
            left, int(spec.queue_ttl * 1000), int(spec.session_ttl * 1000), hold,
            settings.WAITING_ROOM_MAX_POPS,
        ]  # fmt: skip

    def visit(
        self, visitor: str, *, lane: str | None = None, join: bool = True,
        remaining: int | None = None,
    ) -> Status:  # fmt: skip
        """A visitor's request: join (``join``) or find its place, one admission step,
        then its :class:`Status`. ``lane``: its lane's name (None: the last one); a
        visitor keeps the lane it joined in. ``remaining``: the units left of the
        event's SKUs (None: read them, :mod:`.remaining`; -1: no stock limit).

        Blocking: one round trip (two when the units left are read). Safe to
        repeat: the same visitor gets the same ticket. Raises
        :class:`~stock_locks.exceptions.RedisUnavailable` when Redis did not answer
        (the call may have run: a repeat finds its ticket) and ValueError for an
        empty visitor id or an unknown lane.
        """
        if not isinstance(visitor, str) or not visitor:
            raise ValueError(f"a visitor id is a non-empty string, got {visitor!r}")
        lane_number = self.spec.lane_number(lane)
        limits = self._limits(remaining)
        argv = [visitor, lane_number, 1 if join else 0, self.spec.opens_ms, *limits]
        reply = self.backend.run(script(scripts.WAITINGROOM_VISIT, self._script_keys, argv))
        return self._status(reply)

    def _status(self, reply: list[Any]) -> Status:
        code, ticket, born, ahead, rate, until = (int(value) for value in reply)
        self._saw(born)
        if code not in STATES:
            raise UnknownReply(f"waiting room {self.spec.slug!r}: unknown visit reply {reply!r}")
        state = STATES[code]
        if code in (WAITING, SOLD_OUT):
            eta = self._eta(ahead, rate) if code == WAITING else None
            poll = eta / 4 if eta is not None else MAX_POLL
            poll = max(MIN_POLL, min(MAX_POLL, poll, self.spec.queue_ttl / 3))
            return Status(state, ticket, born, ahead, eta, poll)
        if code in (PREQUEUE, NOT_OPEN):
            seconds = until / 1000
            poll = max(MIN_POLL, min(MAX_POLL, seconds / 2, self.spec.queue_ttl / 3))
            return Status(state, ticket, born, None, None, poll, code == PREQUEUE, seconds)
        return Status(state, ticket, born)

    def _eta(self, ahead: int, rate_milli: int) -> float:
        """Seconds for ``ahead`` places at the measured pace (places per 1000 s), or the
        event's admission rate while nothing was measured."""
        per_second = rate_milli / 1000 if rate_milli > 0 else self.spec.admit_per_minute / 60
        return max(0.1, round((ahead + 1) / per_second, 1))

    def admit(self, *, remaining: int | None = None) -> int:
        """One admission step (as every visit runs): the number admitted.

        Blocking: one round trip (two when the units left are read). Safe from
        every process at once and to repeat. Raises
        :class:`~stock_locks.exceptions.RedisUnavailable` when Redis did not answer.
        """
        argv = self._limits(remaining)
        reply = self.backend.run(script(scripts.WAITINGROOM_ADMIT, self._script_keys, argv))
        self._saw(int(reply[1]))
        return int(reply[0])

    def touch(self, ticket: int, born: int) -> bool:
        """Whether the admitted ``ticket`` (of the state ``born``) still holds its slot;
        if so its session restarts now. Blocking: one round trip. Raises
        :class:`~stock_locks.exceptions.RedisUnavailable`."""
        keys = [self.keys.state, self.keys.active]
        argv = [ticket, born, int(self.spec.session_ttl * 1000)]
        held = bool(self.backend.run(script(scripts.WAITINGROOM_TOUCH, keys, argv)))
        if held:
            self._saw(born)
        return held

    def leave(self, visitor: str, *, ticket: int | None = None) -> bool:
        """``visitor`` leaves (its order is paid, or it gives up): its slot, or its place,
        is free at once. ``ticket``: the ticket its pass names, which leaves even when
        the visitor's id changed since (a guest who logged in). Whether it had a slot
        or a place. Blocking: one round trip; safe to repeat. Raises
        :class:`~stock_locks.exceptions.RedisUnavailable`."""
        k = self.keys
        keys = [k.state, k.visitors, k.tickets, k.polled, k.active]
        argv = [visitor, "" if ticket is None else ticket]
        return bool(self.backend.run(script(scripts.WAITINGROOM_LEAVE, keys, argv)))

    def stats(self) -> RoomStats:
        """The room's figures now. Blocking: one round trip. Raises
        :class:`~stock_locks.exceptions.RedisUnavailable`."""
        k = self.keys
        commands: list[tuple[Any, ...]] = [
            ("HGETALL", k.state), ("ZCARD", k.polled), ("ZCARD", k.active), ("TIME",),
            *(("SCARD", pre) for pre in k.prequeues),
        ]  # fmt: skip
        replies = self.backend.run(_pipeline(commands, k.state))
        state = {_text(key): int(float(value)) for key, value in replies[0].items()}
        seconds, micros = (int(part) for part in replies[3])
        now_ms = seconds * 1000 + micros // 1000
        since = now_ms - state.get("m_t0", now_ms)
        rate = (state.get("admitted", 0) - state.get("m_a0", 0)) * 1000 / since if since else 0.0
        return RoomStats(
            waiting=int(replies[1]),
            prequeued=sum(int(count) for count in replies[4:]),
            admitted=int(replies[2]),
            admitted_total=state.get("admitted", 0),
            abandoned_waiting=state.get("abandoned_waiting", 0),
            abandoned_admitted=state.get("abandoned_admitted", 0),
            left=state.get("left", 0),
            sold_out=bool(state.get("sold_out", 0)),
            tickets=state.get("seq", 0),
            admitted_per_second=round(rate, 2),
        )

    def admitted_log(self) -> list[int]:
        """The tickets admitted, in the order they were (the latest 10,000). Blocking: one
        round trip. Raises :class:`~stock_locks.exceptions.RedisUnavailable`."""
        log = self.keys.log
        replies = self.backend.run(_pipeline([("LRANGE", log, 0, -1)], log))
        return [int(ticket) for ticket in replies[0]]

    def clear(self) -> None:
        """Forget the room's Redis state (every place and slot): after the sale, or to
        run it again. Blocking: one round trip."""
        self.backend.run(_pipeline([("DEL", *self._script_keys)], self.keys.state))
        _born_seen.pop(self.spec.slug, None)


def forget_seen() -> None:
    """Forget the room states this process saw (tests: after flushing Redis)."""
    _born_seen.clear()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pipeline(commands: list[tuple[Any, ...]], key: str) -> Any:
    return (yield Pipeline(commands, key))
