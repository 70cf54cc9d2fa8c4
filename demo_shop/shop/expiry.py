"""Unpaid orders expire: a delay-queue item per order, handled by Celery beat's drain.

Placing an order schedules ``shop.expire_order`` ``ORDER_TTL`` seconds later
(Redis clock); paying or cancelling it removes that item. The handler takes
the same lock as the pay and cancel views, and cancels the order only if it
is still unpaid, releasing its stock through its strategy. Delivered twice, or
racing a payment, it still restores the stock once: the order's status and the
reservation's are both checked under locks, and release is idempotent.
"""

from __future__ import annotations

import logging
from typing import Any

from stock_locks import DelayQueue, Lock
from stock_locks.delayqueue import handler

log = logging.getLogger("demo_shop.expiry")

EXPIRE_ORDER = "shop.expire_order"
QUEUE = "default"


def expiry_id(order_id: int) -> str:
    return f"expire-order-{order_id}"


def schedule_expiry(order_id: int, ttl: float) -> None:
    DelayQueue(QUEUE).schedule(EXPIRE_ORDER, {"order": order_id}, delay=ttl, id=expiry_id(order_id))


def forget_expiry(order_id: int) -> None:
    """Best effort: a leftover item finds the order paid or cancelled and does nothing."""
    try:
        DelayQueue(QUEUE).cancel(expiry_id(order_id))
    except Exception as exc:  # Redis down: harmless, see above
        log.warning("could not cancel the expiry of order %s: %s", order_id, exc)


@handler(EXPIRE_ORDER)
def expire_order(payload: dict[str, Any]) -> None:
    from .models import Order
    from .services import cancel_order

    order_id = payload["order"]
    with Lock(f"order:{order_id}", ttl=30, timeout=30):  # the pay and cancel views' lock
        order = Order.objects.filter(pk=order_id).first()
        if order is None or order.status != Order.Status.PENDING:
            return
        cancel_order(order, status=Order.Status.EXPIRED)
        log.info("order %s expired unpaid; its stock is back", order_id)
