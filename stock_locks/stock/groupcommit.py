"""Group commit: reservations Redis took at the same moment are written to the
database by one transaction.

In a flash sale every yes of the reserve script must reach the database (the
reservation row and the guarded decrement of the SKU's row) before the buyer
hears it. Written one transaction each, the yeses queue on the hot row's lock
and pass it on one commit at a time. Instead each yes is queued in Redis
(``lib/confirm_join.lua``: inside the ``lua`` strategy's reserve script, in a
script of its own for ``watch``); a caller that finds no one leading leads: it
writes its own reservation alone, as without this module, then hands the lead
to the caller at the head of the queue. That caller takes the queued
reservations (its own first) as a batch, writes them in one transaction
(:meth:`~stock_locks.stock.table.StockTable.take_and_record_many`), answers each
caller on its reply list and hands the lead on in turn
(``stock_confirm_pass.lua``). While one batch commits, the next one queues.

Safety stays with the database: a reservation is written by a transaction that
inserts its row (unique by order ref) and takes its units, so one written twice
(by a leader, and by its caller who stopped waiting) moves stock once. A batch
the database refuses as a whole (a SKU short of the sum), or that fails, is
answered ``alone``: each caller then writes its own, and only the short ones are
refused. Liveness is the deadline's: a caller waits at most
``GROUP_COMMIT_WAIT`` seconds for its answer, then takes its entry back out of
the queue and writes its own; a leader drops entries whose caller's deadline
(on the Redis clock) has passed, and a leader's lead is a lease of the same
length, so a leader that died holds up the others for at most that long.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, router

from .. import scripts
from ..backends.redis.errors import REDIS_ERRORS
from ..backends.redis.wakeup import wait_for_item
from ..conf import settings
from ..exceptions import StockLocksError
from ..keys import StockKeys
from ..models import Reservation
from .cart import Cart
from .ledger import held_for
from .table import Order, StockTable, recorded

log = logging.getLogger("stock_locks.stock")

# stocklib/confirm_join.lua's and stock_confirm_pass.lua's replies
LEADS, NAME_HEAD = 1, 3
# A reply list outlives its caller's wait by this much, then Redis drops it.
REPLY_TTL_MS = 60_000
ALONE, TAKEN = "alone", "taken"


@dataclass(frozen=True)
class Confirmation:
    """A reservation Redis takes, to be written to the database; ``now_ms`` (the Redis
    clock when it was queued) is known once it is."""

    order_ref: str
    lines: Cart
    strategy: str
    ttl_ms: int | None
    now_ms: int | None = None
    customer: str = ""  # who it counts against under the purchase caps ('' none)
    #: This caller's token, should it lead (set by :meth:`join_args`).
    token: str = field(default="", compare=False)
    #: Whether a leader took its queue entry and this caller stopped waiting for the
    #: answer: that leader's batch may still write the row (set by ``confirm``).
    taken_by_leader: bool = field(default=False, compare=False)

    @property
    def expires_at(self) -> dt.datetime | None:
        return self.due(self.now_ms)

    def due(self, now_ms: int | None) -> dt.datetime | None:
        """The reservation's ``expires_at`` had it been queued at ``now_ms``."""
        if self.ttl_ms is None or now_ms is None:
            return None
        return dt.datetime.fromtimestamp((now_ms + self.ttl_ms) / 1000, tz=dt.UTC)

    def encode(self) -> str:
        job = [self.order_ref, self.lines, self.strategy, self.ttl_ms]
        return json.dumps([*job, self.customer] if self.customer else job)

    @classmethod
    def decode(cls, entry: bytes | str) -> Confirmation:
        """From a queue entry, ``"<deadline ms> <now ms> <encoded>"``."""
        _, now_ms, encoded = _text(entry).split(" ", 2)
        ref, lines, strategy, ttl_ms, *customer = json.loads(encoded)
        return cls(ref, lines, strategy, ttl_ms, int(now_ms), *customer)

    def join_args(self) -> list[Any]:
        """The arguments of a join (lib/confirm_join.lua): job, token, lease and wait in ms.
        Made when a join is sent, not before (most attempts of a sale are refusals)."""
        if not self.token:
            object.__setattr__(self, "token", secrets.token_hex(8))
        wait = _ms(float(settings.GROUP_COMMIT_WAIT))
        return [self.encode(), self.token, wait, wait]


def _text(entry: bytes | str) -> str:
    return entry.decode() if isinstance(entry, bytes) else entry


def queued_ms(entry: bytes | str) -> int:
    """The Redis clock, in ms, when queue entry ``entry`` was queued (the leader
    derives the reservation's ``expires_at`` from it too)."""
    return int(_text(entry).split(" ", 2)[1])


def applies() -> bool:
    """Whether a reservation's database half may go through group commit now: the
    setting is on, the database is PostgreSQL, and the caller is not inside a
    transaction of its own (its reservation must be written in that transaction).
    Async views do not use it (waiting for a batch in the one thread of an event
    loop's database calls would hold up all of them). Asked when a join is about
    to be sent, not for every attempt."""
    if not settings.GROUP_COMMIT:
        return False
    connection = connections[router.db_for_write(Reservation)]
    return connection.vendor == "postgresql" and not connection.in_atomic_block


class GroupCommit:
    """The group commit of one Redis client's stock keys."""

    def __init__(self, redis: Any, keys: StockKeys, stock: StockTable) -> None:
        self.redis = redis
        self.keys = keys
        self.stock = stock

    def confirm(
        self,
        job: Confirmation,
        write_alone: Callable[[], Reservation],
        retries: int = 0,
        joined: Any = None,
    ) -> Reservation:
        """Write ``job`` to the database, in a batch with whatever else is queued, or
        alone by ``write_alone()`` (when this caller leads first, when its batch was
        refused or failed, when no answer came in time, or when Redis cannot be
        reached). ``joined``: the reply of the join the reserve script made (1: this
        caller leads; else its queue entry); None: join now. Returns the
        reservation (``retries`` set); raises what ``write_alone`` raises.

        Blocks for the transaction that carries ``job``; waits at most
        ``GROUP_COMMIT_WAIT`` seconds for another caller's.
        """
        deadline = time.monotonic() + float(settings.GROUP_COMMIT_WAIT)
        if joined is None:
            try:
                reply = scripts.STOCK_CONFIRM_JOIN(
                    [self.keys.confirm_queue, self.keys.confirm_leader],
                    job.join_args(),
                    client=self.redis,
                )
            except REDIS_ERRORS as exc:
                log.info("group commit unreachable (%s): %r writes its own", exc, job.order_ref)
                return write_alone()
            joined = reply[1] if reply[0] == 0 else LEADS
        if joined == LEADS:  # no one led: this caller writes its own, then hands over
            try:
                return write_alone()
            finally:
                self._pass(job.token, None, {})
        answer = self._await_answer(job, joined, deadline)
        if answer.startswith("lead "):
            answer = self._lead(answer, job)
        if answer.startswith("ok "):
            _, pk, created = answer.split(" ", 2)
            return recorded(
                int(pk), dt.datetime.fromisoformat(created), job.order_ref, job.lines,
                job.strategy, retries, job.due(queued_ms(joined)), router.db_for_write(Reservation),
                job.customer,
            )  # fmt: skip
        if answer == TAKEN:
            object.__setattr__(job, "taken_by_leader", True)  # (as join_args sets token)
            return self._written_alone_or_by_leader(job, write_alone, retries)
        return write_alone()

    def _written_alone_or_by_leader(
        self, job: Confirmation, write_alone: Callable[[], Reservation], retries: int
    ) -> Reservation:
        """A caller that stopped waiting after a leader took its entry writes its own.
        If the leader's batch wrote it meanwhile (the unique order ref refuses a second
        row, and the second write's decrement rolls back with it), that row is this
        call's reservation: ``created``, as if the answer had come."""
        try:
            return write_alone()
        except IntegrityError:
            row = held_for(job.order_ref, job.lines)
            if row is None:
                raise
            row.created, row.retries = True, retries
            return row

    def _await_answer(self, job: Confirmation, entry: bytes, deadline: float) -> str:
        """The caller's answer: ``ok <id> <created_at>``, ``lead <token>`` or ``alone``
        (also when Redis failed it); ``taken`` when it stopped waiting after a leader
        had taken its entry (its batch may have written it)."""
        key = self.keys.confirm_reply(job.order_ref)
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                message = wait_for_item(self.redis, key, remaining)
                if message:  # b"": a cluster failover cut the wait; look again
                    return message.decode()
                if message is None:
                    break
            # No answer in time: take the entry back, then read what may have come
            # meanwhile. A leader that popped it already may still write it; the
            # row's unique order ref lets one of the two writes win.
            taken = not self.redis.lrem(self.keys.confirm_queue, 1, entry)
            message = self.redis.lpop(key)
        except REDIS_ERRORS as exc:
            log.info("group commit: no answer for %r (%s); it writes its own", job.order_ref, exc)
            return ALONE
        if message is None:
            return TAKEN if taken else ALONE
        return _text(message)

    def _lead(self, message: str, job: Confirmation) -> str:
        """Lead the batch ``message`` brought (``lead <token>``, the entry then at the
        head of the queue, the batch's entries: the caller's own first, unless its
        deadline dropped it): write it, answer its callers, pass the lead on; the
        caller's own answer."""
        header, head, *entries = message.split("\n")
        batch = [Confirmation.decode(entry) for entry in entries]
        answers = dict.fromkeys((j.order_ref for j in batch), ALONE)
        try:
            answers = self._write(batch)
        finally:  # whatever happened, the others hear it and the lead moves on
            own = answers.pop(job.order_ref, ALONE)
            self._pass(header.split(" ", 1)[1], head.encode() or None, answers)
        return own

    def _write(self, batch: list[Confirmation]) -> dict[str, str]:
        """Write ``batch`` in one transaction: the answer for each order ref."""
        answers = dict.fromkeys((job.order_ref for job in batch), ALONE)
        orders = {job.order_ref: job for job in batch}  # one per ref
        try:
            inserted = self.stock.take_and_record_many(
                [
                    Order(j.order_ref, j.lines, j.strategy, j.expires_at, j.customer)
                    for j in orders.values()
                ]  # fmt: skip
            )
        except (StockLocksError, IntegrityError, DatabaseError) as exc:
            # Refused or failed as a whole: each caller writes its own (the database
            # then refuses only the short ones), and its error is its own.
            log.info("group commit: a batch of %d is written one by one (%s)", len(batch), exc)
            return answers
        for ref, (pk, created) in inserted.items():
            answers[ref] = f"ok {pk} {created.isoformat()}"
        return answers

    def _pass(self, token: str, head: bytes | None, answers: dict[str, str]) -> None:
        """Deliver ``answers`` and pass the lead on: with the next batch to the caller
        whose entry heads the queue (``head``, as last seen), or to no one when the
        queue is empty. When Redis cannot be reached, the callers stop waiting at
        their deadline and the lease ends the lead."""
        keys = self.keys
        try:
            for _ in range(8):
                head_reply = (
                    keys.confirm_reply(Confirmation.decode(head).order_ref)
                    if head
                    else keys.confirm_queue
                )
                reply = scripts.STOCK_CONFIRM_PASS(
                    [keys.confirm_queue, keys.confirm_leader, head_reply,
                     *map(keys.confirm_reply, answers)],
                    [token, _ms(float(settings.GROUP_COMMIT_WAIT)),
                     int(settings.GROUP_COMMIT_BATCH), head or b"", secrets.token_hex(8),
                     REPLY_TTL_MS, *answers.values()],
                    client=self.redis,
                )  # fmt: skip
                if reply[0] != NAME_HEAD:
                    return
                head, answers = reply[1], {}
        except REDIS_ERRORS as exc:
            log.warning("group commit: answers of %d or the lead lost (%s)", len(answers), exc)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
