"""Placing, paying and cancelling orders on top of a stock strategy.

Views parse and answer HTTP; everything that moves stock happens here.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from stock_locks.conf import settings as stock_settings
from stock_locks.exceptions import InvalidQuantity, ReservationError
from stock_locks.stock import get_strategy, normalize_cart, strategy_names

from .expiry import forget_expiry, schedule_expiry
from .models import Order, OrderLine, Product

log = logging.getLogger("demo_shop.orders")


class BadRequest(Exception):
    """The request body is malformed; the message says what is wrong."""


def parse_order_body(body: bytes) -> tuple[dict[str, int], str]:
    """``{"items": [{"sku": ..., "qty": ...}], "strategy": ...}`` -> (cart, strategy).

    Raises BadRequest for malformed JSON, a missing or wrong ``items`` list, a
    line without a SKU, a missing, boolean, non-integer or non-positive qty, a
    SKU named twice, an oversize cart, and an unknown strategy.
    """
    try:
        data = json.loads(body or b"")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest('the body must be a JSON object with an "items" list')
    items = data.get("items")
    if not isinstance(items, list) or not items:
        raise BadRequest('"items" must be a non-empty list of {"sku": ..., "qty": ...}')
    cart: dict[str, Any] = {}
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"items[{position}] must be an object with sku and qty")
        sku, qty = item.get("sku"), item.get("qty")
        if not isinstance(sku, str) or not sku:
            raise BadRequest(f"items[{position}].sku must be a non-empty string")
        if "qty" not in item:
            raise BadRequest(f"items[{position}] ({sku}) has no qty")
        if sku in cart:
            raise BadRequest(f"SKU {sku!r} appears twice; send one line per SKU")
        cart[sku] = qty
    strategy = data.get("strategy") or stock_settings.STRATEGY
    if strategy not in strategy_names():
        raise BadRequest(
            f"unknown strategy {strategy!r}; choose one of {', '.join(strategy_names())}"
        )
    try:
        return normalize_cart(cart), strategy
    except InvalidQuantity as exc:
        raise BadRequest(str(exc)) from None


def place_order(
    cart: dict[str, int], strategy_name: str, key: str | None = None, ttl: float | None = None
) -> tuple[Order, bool]:
    """Reserve the cart, create the order and schedule its expiry; (order, created).

    ``key`` (an Idempotency-Key) makes a retried request return the first
    order instead of buying twice. The order expires unpaid after ``ttl``
    seconds (default ``settings.ORDER_TTL``). Raises what the strategy raises
    (OutOfStock, InvalidQuantity, RedisUnavailable, ...), and redis-py's errors
    when the expiry cannot be scheduled; nothing is kept then.
    """
    ref = f"shop-{key}" if key else f"shop-{uuid.uuid4().hex}"
    if key:
        existing = Order.objects.filter(ref=ref).first()
        if existing is not None:
            bought = dict(existing.lines.values_list("sku", "qty"))
            if bought != cart:
                raise ReservationError(
                    f"Idempotency-Key {key!r} was used for another cart: {bought}",
                    order_ref=ref,
                    status=existing.status,
                )
            return existing, False
    ttl = settings.ORDER_TTL if ttl is None else ttl
    strategy = get_strategy(strategy_name)
    reservation = strategy.reserve(ref, cart)
    try:
        with transaction.atomic():
            expires_at = timezone.now() + dt.timedelta(seconds=ttl)
            order, created = Order.objects.get_or_create(
                ref=ref, defaults={"strategy": strategy_name, "expires_at": expires_at}
            )
            if created:
                products = {p.sku: p for p in Product.objects.filter(sku__in=cart)}
                OrderLine.objects.bulk_create(
                    OrderLine(order=order, product=products[sku], sku=sku, qty=qty,
                              price=products[sku].price)
                    for sku, qty in reservation.lines.items()
                )  # fmt: skip
                schedule_expiry(order.pk, ttl)  # fails -> the order is rolled back
    except BaseException:
        if reservation.created:
            _give_back(strategy, ref)
        raise
    order.retries = reservation.retries
    return order, created


def _give_back(strategy, ref: str) -> None:
    try:
        strategy.release(ref)
    except Exception as exc:  # the original error is the one to report
        log.error("order %s failed and its reservation could not be released: %s", ref, exc)


def pay_order(order: Order) -> Order:
    """Mark the order paid; idempotent. ReservationError when it was cancelled or expired."""
    if order.status == Order.Status.PAID:
        return order
    if order.status != Order.Status.PENDING:
        raise ReservationError(
            f"order {order.pk} is {order.status}", order_ref=order.ref, status=order.status
        )
    get_strategy(order.strategy).commit(order.ref)
    order.status, order.paid_at = Order.Status.PAID, timezone.now()
    order.save(update_fields=["status", "paid_at", "updated_at"])
    forget_expiry(order.pk)
    return order


def cancel_order(order: Order, status: str = Order.Status.CANCELLED) -> Order:
    """Cancel an unpaid order and put its stock back; idempotent. ReservationError when paid."""
    if order.status in (Order.Status.CANCELLED, Order.Status.EXPIRED):
        return order
    if order.status == Order.Status.PAID:
        raise ReservationError(
            f"order {order.pk} is paid", order_ref=order.ref, status=order.status
        )
    get_strategy(order.strategy).release(order.ref)
    order.status, order.cancelled_at = status, timezone.now()
    order.save(update_fields=["status", "cancelled_at", "updated_at"])
    if status != Order.Status.EXPIRED:
        forget_expiry(order.pk)
    return order
