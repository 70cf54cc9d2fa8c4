"""Reservations that expire unpaid: scheduled on the delay queue, backed by the database.

A reservation made with a ``ttl`` has its due time in the database
(``Reservation.expires_at``, from the Redis clock) and an item on the delay
queue (``RESERVATION_QUEUE``, id ``reservation:<order ref>``) whose handler,
:func:`expire_reservation`, releases it through the strategy that made it and
sends :data:`stock_locks.signals.reservation_expired`. The delay queue is the
fast path; the database row is the truth: when Redis loses the item (a
restart without persistence, a flushed cache), the sweeper finds the overdue
row and expires it the same way. Either path, delivered twice or racing a
payment, releases the units once: the release is conditional on the row's
state, under its lock.
"""

from __future__ import annotations

import datetime as dt
import logging

from .. import metrics
from ..backends.redis.errors import REDIS_ERRORS
from ..conf import settings
from ..delayqueue import DelayQueue, handler
from ..exceptions import RedisUnavailable, ReservationError
from ..models import Reservation
from ..signals import reservation_expired
from .clock import server_clock_ms
from .registry import get_strategy

log = logging.getLogger("stock_locks.stock.expiry")

# What a best-effort queue call may meet: Redis down, or refusing while a cluster fails over.
QUEUE_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, RedisUnavailable, OSError)

EXPIRE_TASK = "stock_locks.expire_reservation"


def item_id(order_ref: str) -> str:
    return f"reservation:{order_ref}"


def schedule(reservation: Reservation) -> None:
    """Put the reservation's expiry on the delay queue; best effort (the sweeper backs it)."""
    try:
        DelayQueue(settings.RESERVATION_QUEUE).schedule(
            EXPIRE_TASK,
            {"order_ref": reservation.order_ref},
            eta=reservation.expires_at,
            id=item_id(reservation.order_ref),
        )
    except QUEUE_ERRORS as exc:
        log.warning(
            "could not schedule the expiry of %r (%s); the sweeper expires it when due",
            reservation.order_ref,
            exc,
        )


def forget(reservation: Reservation) -> None:
    """Drop the expiry item of a reservation that was paid or released; best effort
    (a leftover item finds the reservation no longer open and does nothing). No
    round trip for a reservation made without a ttl: it has no item."""
    if reservation.expires_at is None:
        return
    try:
        DelayQueue(settings.RESERVATION_QUEUE).cancel(item_id(reservation.order_ref))
    except QUEUE_ERRORS as exc:
        log.info("could not drop the expiry item of %r: %s", reservation.order_ref, exc)


@handler(EXPIRE_TASK)
def _expire_item(payload: dict) -> None:
    expire_reservation(payload["order_ref"])


def expire_reservation(order_ref: str, now: dt.datetime | None = None) -> bool:
    """Release ``order_ref``'s units if it is still RESERVED and due; True when this call did.

    ``now`` defaults to the Redis clock (the database's when Redis is down).
    Sends :data:`~stock_locks.signals.reservation_expired` after the release.
    Safe to call twice and to race a payment: the release is decided under
    the row's lock, so only one caller releases.
    """
    if now is None:
        now = dt.datetime.fromtimestamp(server_clock_ms() / 1000, tz=dt.UTC)
    reservation = Reservation.objects.filter(order_ref=order_ref).first()
    if reservation is None or reservation.status != Reservation.Status.RESERVED:
        return False
    if reservation.expires_at is None or reservation.expires_at > now:
        return False  # not due (or never set to expire)
    try:
        released = get_strategy(reservation.strategy).release(order_ref)
    except ReservationError:  # paid meanwhile
        return False
    except ValueError:  # its strategy is no longer registered: any strategy releases it
        released = get_strategy().release(order_ref)
    if released:
        log.info("reservation %r expired unpaid; its units are back", order_ref)
        metrics.expired()
        reservation_expired.send(sender=Reservation, order_ref=order_ref, lines=reservation.lines)
    return released


def overdue(now: dt.datetime, grace: float, limit: int) -> list[str]:
    """Order refs of open reservations due more than ``grace`` seconds before ``now``."""
    cutoff = now - dt.timedelta(seconds=grace)
    rows = Reservation.objects.filter(
        status=Reservation.Status.RESERVED, expires_at__lte=cutoff
    ).order_by("expires_at")
    return list(rows.values_list("order_ref", flat=True)[:limit])
