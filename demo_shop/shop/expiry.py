"""Unpaid orders expire with their stock reservation.

``place_order`` reserves with ``ttl=ORDER_TTL``: the library records the due
time (Redis clock) on the reservation, schedules its expiry on the delay
queue and, should Redis lose that item, its sweeper expires the reservation
anyway. Once the units are back it sends ``reservation_expired``; the
receiver below marks the order EXPIRED with a conditional update from
PENDING, so a second report, or a pay that saw the refused commit first,
changes nothing. A worker killed between the release and this receiver sends
nothing: ``pay_order`` and ``refresh_order`` then find the reservation
released and mark the order expired themselves.
"""

from __future__ import annotations

import logging

from django.dispatch import receiver
from django.utils import timezone

from stock_locks.signals import reservation_expired
from stock_locks.stock.stress import stress_cleanup

log = logging.getLogger("demo_shop.expiry")


@receiver(reservation_expired, dispatch_uid="demo_shop.shop.order_expired")
def order_expired(sender: object, order_ref: str, lines: dict[str, int], **kwargs: object) -> None:
    from .models import Order

    now = timezone.now()
    marked = Order.objects.filter(ref=order_ref, status=Order.Status.PENDING).update(
        status=Order.Status.EXPIRED, cancelled_at=now, updated_at=now
    )
    if marked:
        log.info("order %s expired unpaid; its stock is back: %s", order_ref, lines)


@receiver(stress_cleanup, dispatch_uid="demo_shop.shop.forget_stress_orders")
def forget_stress_orders(sender: object, order_refs: list[str], **kwargs: object) -> None:
    """oversell_stress over HTTP made orders; it removes its reservations and rows after."""
    from .models import Order

    Order.objects.filter(ref__in=order_refs).delete()
