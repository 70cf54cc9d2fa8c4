"""The strategy interface: reserve a cart all-or-nothing, commit it, release it.

Cart checks live in :mod:`.cart`, the stock table's statements in
:mod:`.table`, the reservation rows in :mod:`.ledger`; a strategy decides how
the units are taken (a Redis script, an optimistic transaction, a lock, the
database alone) and, for strategies with Redis counters, keeps them in step.
"""

from __future__ import annotations

import datetime as dt
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, IntegrityError, connections, router, transaction

from .. import metrics, scripts
from ..backends.redis.client import get_redis
from ..backends.redis.errors import REDIS_OR_OS_ERRORS
from ..exceptions import CapExceeded, OutOfStock, RedisUnavailable, StaleFencingToken
from ..keys import StockKeys
from ..models import Reservation
from . import expiry
from .caps import NOBODY, Buyer, buyer_of, cap_book
from .caps_postgres import again_if_caps_function_gone, prepare_caps_function
from .cart import Cart, check_order_ref, check_ttl, normalize_cart
from .clock import server_clock_ms
from .ledger import (
    commit_in_db,
    existing_reservation,
    lock_caps_of,
    new_reservation,
    release_in_db,
    repeat_of,
)
from .registry import get_strategy
from .soldout import units_back
from .table import StockTable

log = logging.getLogger("stock_locks.stock")


class StockStrategy(ABC):
    """One way to sell stock without overselling.

    ``reserve`` takes every line of a cart or none; ``commit`` makes a
    reservation final (paid); ``release`` puts its units back. All three are
    idempotent by order ref: repeating one never moves stock twice, and each
    is safe to retry after an error whose outcome was not seen.
    """

    #: Whether the strategy needs Redis to reserve (for HTTP 503 when it is down).
    uses_redis = True
    #: Whether the strategy keeps stock counters in Redis beside the database.
    has_counters = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.stock = StockTable()

    def reserve(
        self,
        order_ref: str,
        cart: Mapping[str, int],
        *,
        ttl: float | None = None,
        customer: str | int | None = None,
        fresh_ref: bool = False,
    ) -> Reservation:
        """Reserve every line of ``cart`` for ``order_ref``, or nothing.

        ``ttl``: seconds the units are held unpaid. The reservation's
        ``expires_at`` is then set from the Redis clock (the database's when
        Redis cannot be reached and the strategy does not need it) and an
        expiry is scheduled on the delay queue; the sweeper expires it if the
        queue lost it. Without ``ttl`` the reservation holds until released.

        ``customer``: who the units count against under the purchase caps
        (``STOCK_LOCKS["CAPS"]``, :mod:`stock_locks.stock.caps`), decided in the
        same step that takes the stock: :class:`CapExceeded` refuses the whole
        cart (nothing taken); :class:`CustomerRequired` when a line is capped and
        no customer is named.

        ``fresh_ref``: the caller promises ``order_ref`` was made for this call
        (no earlier attempt, no copy in flight). The ``lua`` strategy then refuses
        a SKU this process saw sold out without any round trip; otherwise it first
        asks Redis whether an earlier attempt of the ref holds units (one
        ``EXISTS``), which answers a retry or a duplicate with them.

        Returns the reservation; ``reservation.created`` is False when the
        order ref already had one (nothing moved then), ``reservation.retries``
        counts optimistic retries. Raises :class:`OutOfStock` naming the first
        short line, :class:`InvalidQuantity` for a bad cart, ttl or unknown SKU,
        :class:`ReservationError` when the ref was used for other lines or its
        reservation was released,
        :class:`~stock_locks.exceptions.RedisUnavailable` when Redis did not answer
        (nothing written to the database; a Redis step whose reply was lost may
        have taken the units there: a retry with the same ref moves stock once and
        says, or the sweeper gives them back after ``ORPHAN_GRACE``). Blocks at most
        for the strategy's lock or retry budget.
        """
        ref, lines, ttl_ms = self.validate(order_ref, cart, ttl)
        buyer = buyer_of(customer, lines)
        with self.recording_outcome(ref):
            self.refuse_known_short(ref, lines, fresh_ref)
            return self.after_reserve(self.do_reserve(ref, lines, ttl_ms, buyer), ttl_ms)

    def refuse_known_short(self, order_ref: str, lines: Cart, fresh_ref: bool) -> None:
        """Raise OutOfStock for a cart this process already knows Redis would refuse
        (``lua``'s sold-out cache); nothing here."""
        return None

    def warm_up(self) -> None:
        """Open what this strategy uses in this process now (its database connection,
        its metrics; Redis and listeners for the strategies that use them), so that the
        first reserve does not pay for it: e.g. in a worker just forked, before its
        first request; with purchase caps configured, the capped write's database
        function too. Optional; raises what opening them raises."""
        metrics.prepare()
        connections[router.db_for_write(Reservation)].ensure_connection()
        if cap_book().caps:
            prepare_caps_function()
        if self.uses_redis:
            get_redis().ping()

    def recording_outcome(self, order_ref: str) -> OutcomeRecorder:
        """Around a reserve's decision: record its refusal (metrics, ``stock_refused``)
        or its failure (Redis unavailable, the database's error)."""
        return OutcomeRecorder(self.name, order_ref)

    async def areserve(
        self,
        order_ref: str,
        cart: Mapping[str, int],
        *,
        ttl: float | None = None,
        customer: str | int | None = None,
        fresh_ref: bool = False,
    ) -> Reservation:
        """:meth:`reserve` for async views. This strategy is bound to the database, so
        all of it runs in Django's thread for sync code (``sync_to_async``); the
        ``lua`` strategy answers in the event loop instead."""
        return await sync_to_async(self.reserve)(
            order_ref, cart, ttl=ttl, customer=customer, fresh_ref=fresh_ref
        )

    @staticmethod
    def validate(
        order_ref: str, cart: Mapping[str, int], ttl: float | None
    ) -> tuple[str, Cart, int | None]:
        """(order ref, normalized lines, ttl in ms) of a reserve; InvalidQuantity or
        ReservationError for bad input (no I/O)."""
        return check_order_ref(order_ref), normalize_cart(cart), check_ttl(ttl)

    def after_reserve(self, reservation: Reservation, ttl_ms: int | None) -> Reservation:
        """After a reserve: record it, schedule a new reservation's expiry."""
        metrics.reserved(self.name, reservation.created, reservation.retries, reservation.units)
        if reservation.created and ttl_ms is not None:
            expiry.schedule(reservation)
        return reservation

    @abstractmethod
    def do_reserve(
        self, order_ref: str, lines: Cart, ttl_ms: int | None, buyer: Buyer = NOBODY
    ) -> Reservation:
        """Reserve checked ``lines`` for ``buyer`` (within its caps); ``ttl_ms`` sets
        ``expires_at`` (see :meth:`due`)."""

    def reserve_once(
        self,
        order_ref: str,
        lines: Cart,
        ttl_ms: int | None,
        take: Callable[[], None],
        *,
        checked: bool = False,
        buyer: Buyer = NOBODY,
    ) -> Reservation:
        """The database reservation every DB-side strategy makes: ``take()`` the
        units and insert the row in one transaction, unless the order ref already
        has one (then that one, nothing moved). A duplicate request racing this one
        (the same order ref in flight at once) is answered with the row it wrote:
        caught by the unique order ref, or by a refused ``take()`` when its row took
        the last units meanwhile. ``checked``: the caller already looked for a
        repeat."""
        repeat = None if checked else repeat_of(order_ref, lines)
        if repeat is not None:
            return repeat
        expires_at = self.due(ttl_ms)

        def write() -> Reservation:
            with transaction.atomic():
                counted = lock_caps_of(buyer, lines)
                take()
                return new_reservation(
                    order_ref, lines, self.name, expires_at=expires_at, buyer=buyer,
                    counted=counted,
                )  # fmt: skip

        try:
            reservation = again_if_caps_function_gone(router.db_for_write(Reservation), write)
        except IntegrityError:
            return existing_reservation(order_ref, lines)
        except (OutOfStock, CapExceeded, StaleFencingToken):
            # Waiting on the stock row (or the SKU lock), a twin may have taken the units
            # (or the customer's allowance) and committed its row: both answer that row,
            # not "order" and "sold out".
            if (row := repeat_of(order_ref, lines)) is not None:
                return row
            raise
        self.follow_in_redis(lines, -1)
        return reservation

    def due(self, ttl_ms: int | None, now_ms: int | None = None) -> dt.datetime | None:
        """When a reservation made now with ``ttl_ms`` expires: server clock, never ours.

        ``now_ms`` is the Redis clock when the caller already read it.
        """
        if ttl_ms is None:
            return None
        if now_ms is None:
            now_ms = server_clock_ms()
        return dt.datetime.fromtimestamp((now_ms + ttl_ms) / 1000, tz=dt.UTC)

    def commit(self, order_ref: str) -> bool:
        """Make the reservation final: its units stay sold.

        Returns True when it was committed now, False when it already was.
        Raises :class:`ReservationError` when it was released (or never made).
        Works whichever strategy made the reservation (the row's own does the
        work); safe to retry.
        """
        reservation, committed_now = commit_in_db(check_order_ref(order_ref))
        strategy_of(reservation, self).after_commit(reservation)
        expiry.forget(reservation)
        return committed_now

    def release(self, order_ref: str) -> bool:
        """Put the reservation's units back.

        True when they went back now, False when it was already released.
        Raises :class:`ReservationError` when it is committed or unknown. The
        database is written first; once it has the units back the call
        succeeds even if Redis cannot be reached (its counters catch up through
        the sweeper). Works whichever strategy made the reservation; safe to retry.
        """
        reservation, released_now = release_in_db(self.stock, check_order_ref(order_ref))
        strategy_of(reservation, self).after_release(reservation, released_now)
        expiry.forget(reservation)
        return released_now

    def after_commit(self, reservation: Reservation) -> None:  # noqa: B027 (a hook)
        """What a strategy does beyond the database once a reservation is committed."""

    def after_release(self, reservation: Reservation, released_now: bool) -> None:
        """What a strategy does beyond the database once a reservation is released
        (``released_now``: by this call; False on a repeat)."""
        if released_now:
            self.follow_in_redis(reservation.lines, +1)

    def follow_in_redis(self, lines: Cart, sign: int) -> None:
        """For a strategy without counters: move the loaded Redis counters of ``lines``
        as the database just moved them (after the commit), so that a ``lua`` or
        ``watch`` counter of the same SKU stays in line. Relative, best effort: what
        Redis being down makes it miss, the sweeper corrects."""
        if self.has_counters:
            return
        keys = StockKeys()
        counters = [keys.counter(sku) for sku in lines]
        args = [value for sku, qty in lines.items() for value in (sku, "", sign * qty)]

        def move() -> None:
            try:
                scripts.STOCK_CORRECT([keys.versions, *counters], args, client=get_redis())
                if sign > 0:
                    units_back(lines)
            except REDIS_OR_OS_ERRORS as exc:
                log.info("Redis counters of %s not moved (%s); the sweeper will", list(lines), exc)

        transaction.on_commit(move)

    @abstractmethod
    def available(self, sku: str) -> int:
        """Units of ``sku`` that can be reserved now."""


class OutcomeRecorder:
    """:meth:`StockStrategy.recording_outcome` (a class, not a generator: a refusal passes
    through it on every sold-out attempt of a sale)."""

    __slots__ = ("strategy", "order_ref")

    def __init__(self, strategy: str, order_ref: str) -> None:
        self.strategy, self.order_ref = strategy, order_ref

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, refusal: Any, _tb: Any) -> None:
        if kind is None:
            return
        if issubclass(kind, OutOfStock):
            metrics.refused(
                self.strategy, self.order_ref, refusal.sku, refusal.requested, refusal.available
            )
        elif issubclass(kind, CapExceeded):
            metrics.capped(refusal.sku)
        elif issubclass(kind, RedisUnavailable):
            metrics.failed("unavailable")
        elif issubclass(kind, DatabaseError):
            deadlock = getattr(getattr(refusal, "__cause__", None), "sqlstate", None) == "40P01"
            metrics.failed("deadlock" if deadlock else "database")


def strategy_of(reservation: Reservation, default: StockStrategy) -> StockStrategy:
    """The strategy that made ``reservation`` (``default`` when it is that one, or
    when that name is no longer registered)."""
    if reservation.strategy == default.name:
        return default
    try:
        return get_strategy(reservation.strategy)
    except ValueError:
        log.warning(
            "reservation %r was made by strategy %r, which is no longer registered; "
            "finishing it with %r",
            reservation.order_ref,
            reservation.strategy,
            default.name,
        )
        return default
