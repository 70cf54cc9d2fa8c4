"""What the Redis strategies share: hot counters loaded from the database, the
Redis half of reserve/commit/release, and settling it when the database half
fails.

The database stays the system of record. A counter is created only from the
database's quantity (``SET NX``, so a loader never overwrites a counter that
is already selling), never invented; the reservation record written beside
the counters makes the Redis half of release happen once.

A lost reply is not a lost unit. The Redis half is given back only when the
database is known to have refused (an OutOfStock from its guarded write, a
duplicate order ref); when the answer is unknown (a connection cut while the
script or the commit ran, an interrupt) the row is looked up first, and when
even that is impossible nothing is given back: a retry with the same order
ref finds its record and goes on to the database, and the sweeper settles a
record whose request never came back (:mod:`stock_locks.stock.reconcile`).
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError, IntegrityError, connection

from .. import scripts
from ..backends.redis.backend import shared_backend
from ..backends.redis.errors import REDIS_FAILURES
from ..backends.redis.requests import Command, Requests, script
from ..conf import settings
from ..exceptions import (
    CapExceeded,
    InvalidQuantity,
    OutOfStock,
    RedisUnavailable,
    StaleFencingToken,
)
from ..keys import StockKeys
from ..models import Reservation
from . import groupcommit
from .base import StockStrategy
from .caps import NOBODY, Buyer
from .cart import Cart
from .groupcommit import Confirmation, GroupCommit
from .ledger import certainly_not_written, existing_reservation, held_for, repeat_of
from .reconcile.restore import load_missing_counters, restore_after_data_loss
from .soldout import units_back

log = logging.getLogger("stock_locks.stock")

# stock_release.lua's replies
RELEASED, NO_RECORD, DATA_LOST = 1, 0, 4


def unanswered_reserve(exc: RedisUnavailable, order_ref: str) -> RedisUnavailable:
    """The error of a reserve whose Redis step got no answer: it says what is known.
    The step may have run (a reply lost) and taken the units in Redis; nothing was
    written to the database. A retry with the same order ref moves stock once and
    answers; without one, the sweeper gives the units back after ``ORPHAN_GRACE``."""
    return RedisUnavailable(
        f"Redis did not answer the reservation of {order_ref!r} ({exc}): nothing was "
        "written to the database, and Redis may have taken its units. Retry with the same "
        "order ref to learn the outcome (stock moves once); without a retry they go back "
        f"within ORPHAN_GRACE ({settings.ORPHAN_GRACE} s) and the next sweep.",
        backend=exc.backend,
    )


class RedisStockStrategy(StockStrategy):
    """A strategy whose counters in Redis answer first, then the database confirms."""

    has_counters = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.backend = shared_backend()
        self.redis = self.backend.client
        self.keys = StockKeys()
        self.group_commit = GroupCommit(self.redis, self.keys, self.stock)

    @abstractmethod
    def reserve_in_redis(
        self, order_ref: str, lines: Cart, job: Confirmation | None = None, buyer: Buyer = NOBODY
    ) -> tuple[bool, int, int, Any]:
        """Take the lines from the counters: (took, now in ms on the Redis clock,
        retries, joined).

        ``took`` is False when ``order_ref`` already has a record (nothing
        moved: an earlier attempt of this order took the units). ``joined`` is the
        reply of the group commit's join when the Redis step joined it for ``job``
        (None when it did not: the caller joins itself). The ``buyer``'s caps are
        counted in the same step. Raises OutOfStock or CapExceeded (nothing taken)
        or redis-py's errors.
        """

    def do_reserve(
        self, order_ref: str, lines: Cart, ttl_ms: int | None, buyer: Buyer = NOBODY
    ) -> Reservation:
        job = (
            Confirmation(order_ref, lines, self.name, ttl_ms, customer=buyer.customer)
            if settings.GROUP_COMMIT
            else None
        )
        try:
            took, now_ms, retries, joined = self.reserve_in_redis(order_ref, lines, job, buyer)
        except RedisUnavailable as exc:
            raise unanswered_reserve(exc, order_ref) from exc
        return self.reserve_in_database(
            order_ref, lines, ttl_ms, took, now_ms, retries, job=job, joined=joined, buyer=buyer
        )

    def reserve_in_database(
        self, order_ref: str, lines: Cart, ttl_ms: int | None, took: bool, now_ms: int,
        retries: int, job: Confirmation | None = None, joined: Any = None,
        buyer: Buyer = NOBODY,
    ) -> Reservation:  # fmt: skip
        """The database half of a reserve whose Redis half answered ``took``: with
        ``job``, in a batch with the reservations taken meanwhile (:mod:`.groupcommit`;
        ``joined`` is the Redis step's join, if it made one); else alone, counting
        the ``buyer``'s caps in its transaction."""
        if not took:
            repeat = repeat_of(order_ref, lines)
            if repeat is not None:
                return repeat
            # The record is an earlier attempt's whose database step never happened
            # (or is running now, in a duplicate request): the database decides.
        expires_at = self.due(ttl_ms, now_ms)

        def write_alone() -> Reservation:
            return self.stock.take_and_record(
                order_ref, lines, self.name, retries, expires_at, buyer
            )

        try:
            if took and job is not None and (joined is not None or groupcommit.applies()):
                return self.group_commit.confirm(job, write_alone, retries, joined)
            return write_alone()
        except IntegrityError:
            return self._duplicate(order_ref, lines, took)
        except (OutOfStock, CapExceeded, InvalidQuantity, StaleFencingToken):
            # A duplicate request (the same order ref, in flight at once) may have written
            # the row meanwhile, with the units this record holds: both answer that row.
            if not took:
                if (row := repeat_of(order_ref, lines)) is not None:
                    return row
                raise  # (the record is a request's still in flight, or the sweeper's)
            if (row := held_for(order_ref, lines)) is not None:
                row.created, row.retries = False, 0
                return row
            # The database, the truth, refused: what this call took in Redis goes back.
            self.undo_in_redis(order_ref, lines)
            raise
        except BaseException as exc:
            alone = job is None or not job.taken_by_leader  # (no batch may write it still)
            if took and alone and certainly_not_written(exc) and not connection.in_atomic_block:
                # The units go back now, not once the database can be asked again (in a
                # storm of killed connections it could not, and they stayed unsellable
                # until ORPHAN_GRACE and the next sweep).
                self.undo_in_redis(order_ref, lines)
                raise
            row = self._settle_unknown(order_ref, lines, took)
            if row is not None and isinstance(exc, DatabaseError):
                return row  # the commit happened; only its reply was lost
            raise

    def _duplicate(self, order_ref: str, lines: Cart, took: bool) -> Reservation:
        """The database already has ``order_ref``: that row wins."""
        if took and held_for(order_ref, lines) is None:
            self.undo_in_redis(order_ref, lines)  # this call's take stands for nothing
        return existing_reservation(order_ref, lines)

    def _settle_unknown(self, order_ref: str, lines: Cart, took: bool) -> Reservation | None:
        """After the database step failed without a known answer: the row if it was
        written (the Redis half stays, it is that row's); else the Redis half goes
        back if this call ``took`` it (one it found is a duplicate request's, which may
        still be writing its row). When the database cannot be asked, nothing is given
        back."""
        if connection.in_atomic_block:
            log.warning("reserve %r failed inside the caller's transaction; "
                        "the sweeper settles its Redis half", order_ref)  # fmt: skip
            return None
        try:
            connection.close_if_unusable_or_obsolete()
            row = Reservation.objects.filter(order_ref=order_ref).first()
        except DatabaseError as exc:
            log.warning(
                "reserve %r: the database cannot be asked whether it wrote the reservation "
                "(%s); the sweeper settles its Redis half",
                order_ref,
                exc,
            )
            return None
        if row is None:
            if took:
                self.undo_in_redis(order_ref, lines)
            return None
        row.created, row.retries = True, 0
        return row

    def undo_in_redis(self, order_ref: str, lines: Cart) -> None:
        """Give back what the Redis half took for ``order_ref``; if Redis cannot be
        reached, the record stays and the sweeper gives its units back."""
        try:
            self.release_in_redis(order_ref, lines)
        except REDIS_FAILURES as exc:
            log.warning(
                "could not give back %s for %r in Redis (%s); the sweeper will",
                lines,
                order_ref,
                exc,
            )

    def release_in_redis(self, order_ref: str, lines: Iterable[str]) -> int:
        """The Redis half of a release: RELEASED, NO_RECORD or DATA_LOST (nothing moved)."""
        skus = list(lines)
        keys = [
            self.keys.record(order_ref),
            self.keys.index,
            self.keys.loaded,
            self.keys.versions,
            *map(self.keys.counter, skus),
        ]
        outcome: int = self.backend.run(script(scripts.STOCK_RELEASE, keys, [order_ref, *skus]))
        units_back(skus)
        return outcome

    def after_release(self, reservation: Reservation, released_now: bool) -> None:
        try:
            self.release_in_redis(reservation.order_ref, reservation.lines)
        except REDIS_FAILURES as exc:
            log.warning(
                "released %r in the database; Redis unreachable (%s), the sweeper gives "
                "its units back there",
                reservation.order_ref,
                exc,
            )

    def after_commit(self, reservation: Reservation) -> None:
        keys = [self.keys.record(reservation.order_ref), self.keys.index]
        try:
            self.backend.run(script(scripts.STOCK_COMMIT, keys, [reservation.order_ref]))
        except REDIS_FAILURES as exc:
            # Harmless: the sweeper closes the record; a release is refused by the database.
            log.warning(
                "committed %r; its Redis record stays until the sweeper: %s",
                reservation.order_ref,
                exc,
            )

    def available(self, sku: str) -> int:
        key = self.keys.counter(sku)
        value = self.backend.run(self._read(key))
        if value is None:
            return self.load_counters([sku])[sku]
        return int(value)

    @staticmethod
    def _read(key: str) -> Requests[Any]:
        return (yield Command(("GET", key), key))

    def load_counters(self, skus: list[str]) -> dict[str, int]:
        """Create missing counters from the database; their values now.

        Raises :class:`InvalidQuantity` for a SKU the database does not have.
        """
        values = load_missing_counters(skus, self.redis)
        log.info("loaded stock counters from the database: %s", values)
        return values

    def restore_after_data_loss(self) -> None:
        """Redis lost its data: rebuild what the counters need from the database."""
        restore_after_data_loss(self.redis)
