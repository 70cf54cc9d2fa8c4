"""The reservation ledger: one :class:`~stock_locks.models.Reservation` row per order ref.

The row, unique by order ref, is what makes reserve, commit and release
idempotent: a state moves only from RESERVED, under the row's lock, so a
payment and an expiry racing each other cannot both win, and a retried call
finds the state its first attempt left.
"""

from __future__ import annotations

import datetime as dt

from django.db import DatabaseError, InterfaceError, connection, transaction
from django.utils import timezone

from ..exceptions import ReservationError
from ..models import Reservation
from .caps import NOBODY, Buyer, Purchase, count_in_database, hold_caps
from .cart import Cart


def new_reservation(
    order_ref: str,
    lines: Cart,
    strategy: str,
    retries: int = 0,
    expires_at: dt.datetime | None = None,
    buyer: Buyer = NOBODY,
    *,
    counted: bool = False,
) -> Reservation:
    """Insert the RESERVED row (in the caller's transaction, after it locked the
    buyer's caps with :func:`lock_caps_of` and took the stock rows); IntegrityError
    if the ref exists. With caps, the buyer's are counted first, unless ``counted``
    (:func:`lock_caps_of` did); CapExceeded: the caller's transaction must roll
    back."""
    if not counted:
        count_in_database([purchase_of(buyer, lines)], timezone.now(), held=True)
    reservation = Reservation.objects.create(
        order_ref=order_ref, lines=lines, strategy=strategy, expires_at=expires_at,
        customer=buyer.customer,
    )  # fmt: skip
    reservation.created = True
    reservation.retries = retries
    return reservation


def purchase_of(buyer: Buyer, lines: Cart) -> Purchase:
    """What ``buyer`` buys with ``lines``, as the caps count it."""
    return buyer.customer, lines, list(buyer.caps)


def lock_caps_of(buyer: Buyer, lines: Cart) -> bool:
    """In the caller's transaction, before its stock rows: lock ``buyer``'s caps
    (:func:`~.caps.hold_caps`; nothing without caps). Returns whether that counted
    them too (PostgreSQL: one statement; raises CapExceeded); pass it on to
    :func:`new_reservation`."""
    return hold_caps([purchase_of(buyer, lines)]) if buyer.caps else False


def repeat_of(order_ref: str, lines: Cart) -> Reservation | None:
    """The reservation ``order_ref`` already has (``created`` False), or None.

    Raises :class:`ReservationError` when the ref was used for other lines, or
    when its reservation was released (expired or cancelled): a retry must
    not bring it back, and must not be told it holds units it does not.
    """
    reservation = Reservation.objects.filter(order_ref=order_ref).first()
    if reservation is None:
        return None
    if reservation.lines != lines:
        raise ReservationError(
            f"order ref {order_ref!r} already reserved other lines: {reservation.lines}",
            order_ref=order_ref,
            status=reservation.status,
        )
    if reservation.status == Reservation.Status.RELEASED:
        raise ReservationError(
            f"the reservation {order_ref!r} was released (cancelled or expired); "
            "reserve again under a new order ref",
            order_ref=order_ref,
            status=reservation.status,
        )
    reservation.created = False
    reservation.retries = 0
    return reservation


def held_for(order_ref: str, lines: Cart) -> Reservation | None:
    """The row of ``order_ref`` if it holds exactly ``lines`` now (RESERVED), else None."""
    row = Reservation.objects.filter(order_ref=order_ref).first()
    if row is None or row.status != Reservation.Status.RESERVED or row.lines != lines:
        return None
    return row


def existing_reservation(order_ref: str, lines: Cart) -> Reservation:
    """Like :func:`repeat_of`, but a missing row means another request is still writing
    it: :class:`ReservationError` ("in flight")."""
    reservation = repeat_of(order_ref, lines)
    if reservation is None:
        raise ReservationError(
            f"a reservation for {order_ref!r} is in flight; retry shortly", order_ref=order_ref
        )
    return reservation


def locked_reservation(order_ref: str) -> Reservation:
    """The reservation row, locked for this transaction; not COMMITTED.

    Raises :class:`ReservationError` when there is none or it is committed.
    """
    reservation = Reservation.objects.select_for_update().filter(order_ref=order_ref).first()
    if reservation is None:
        raise ReservationError(f"no reservation for {order_ref!r}", order_ref=order_ref)
    if reservation.status == Reservation.Status.COMMITTED:
        raise ReservationError(
            f"reservation {order_ref!r} is committed (paid); its stock cannot go back",
            order_ref=order_ref,
            status=reservation.status,
        )
    return reservation


def mark(reservation: Reservation, status: str) -> None:
    reservation.status = status
    reservation.save(update_fields=["status", "updated_at"])


def release_in_db(stock, order_ref: str) -> tuple[Reservation, bool]:
    """Mark the reservation RELEASED and put its units back (``stock`` is the
    :class:`~stock_locks.stock.table.StockTable`), in one transaction.

    Returns the reservation and whether it was released by this call.
    """
    with transaction.atomic():
        reservation = locked_reservation(order_ref)
        if reservation.status == Reservation.Status.RELEASED:
            return reservation, False
        stock.put_back(reservation.lines)
        mark(reservation, Reservation.Status.RELEASED)
    return reservation, True


def commit_in_db(order_ref: str) -> tuple[Reservation, bool]:
    """Mark the reservation COMMITTED; returns it and whether this call committed it.

    Raises :class:`ReservationError` when it is released or unknown.
    """
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().filter(order_ref=order_ref).first()
        if reservation is None or reservation.status == Reservation.Status.RELEASED:
            raise ReservationError(
                f"reservation {order_ref!r} cannot be committed: "
                f"{'released' if reservation else 'unknown'}",
                order_ref=order_ref,
                status=reservation.status if reservation else None,
            )
        if reservation.status == Reservation.Status.COMMITTED:
            return reservation, False
        mark(reservation, Reservation.Status.COMMITTED)
    return reservation, True


def certainly_not_written(exc: BaseException) -> bool:
    """Whether the failed database step that raised ``exc`` certainly wrote nothing: the
    server answered the statement (or the COMMIT) with an error of its own (an
    SQLSTATE: the statement failed, and with it the transaction; a session killed by
    an operator or a failover answers 57P01), or the driver refused to send it on a
    connection it knew was closed (psycopg's "the connection is closed", Django's
    "connection already closed"). A connection lost with no answer (a reply lost, a
    timeout) is not certain: the commit may have happened."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, DatabaseError) or connection.vendor != "postgresql":
        return False
    cause = exc.__cause__
    return bool(getattr(cause, "sqlstate", None)) or _NOT_SENT in str(cause)


_NOT_SENT = "the connection is closed"  # psycopg, raised before sending anything
