"""Placing, paying and cancelling orders on top of a stock strategy.

Views parse and answer HTTP; everything that moves stock happens here.
"""

from __future__ import annotations

import json
import logging
import unicodedata
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from stock_locks.conf import settings as stock_settings
from stock_locks.exceptions import InvalidQuantity, ReservationError
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy, normalize_cart, strategy_names

from .models import Order, OrderLine, Product

log = logging.getLogger("demo_shop.orders")


class BadRequest(Exception):
    """The request body is malformed; the message says what is wrong."""


_NOT_GIVEN = object()


def parse_order_body(body: bytes) -> tuple[dict[str, int], str]:
    """``{"items": [{"sku": ..., "qty": ...}]}`` -> (cart, the strategy that sells it).

    Raises BadRequest for malformed JSON, a missing or wrong ``items`` list, a
    line without a SKU, a SKU with a NUL, control character or lone surrogate,
    a missing, boolean, non-integer or non-positive qty, a SKU named twice, an
    oversize cart, and a ``"strategy"`` the server does not take (see
    :func:`choose_strategy`).
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
        if not printable(sku):
            raise BadRequest(
                f"items[{position}].sku has a character a SKU cannot hold "
                "(NUL, a control character or a lone surrogate)"
            )
        if "qty" not in item:
            raise BadRequest(f"items[{position}] ({sku}) has no qty")
        if sku in cart:
            raise BadRequest(f"SKU {sku!r} appears twice; send one line per SKU")
        cart[sku] = qty
    try:
        cart = normalize_cart(cart)
    except InvalidQuantity as exc:
        raise BadRequest(str(exc)) from None
    return cart, choose_strategy(cart, data.get("strategy", _NOT_GIVEN))


def printable(text: str) -> bool:
    """No NUL or other control character, and encodable as UTF-8 (no lone surrogate).

    PostgreSQL refuses NUL in text and no driver can send a lone surrogate: such
    a SKU would fail deep in the database or Redis client (HTTP 500), not as bad input.
    """
    return not any(unicodedata.category(char) in ("Cc", "Cs") for char in text)


def choose_strategy(cart: dict[str, int], requested: Any = _NOT_GIVEN) -> str:
    """The stock strategy that sells ``cart``: the server's decision.

    - ``settings.SHOP_SKU_STRATEGIES`` (``{sku: strategy}``) names the strategy
      of a SKU; every other SKU is sold by ``settings.SHOP_STRATEGY`` (default
      ``STOCK_LOCKS["STRATEGY"]``). A cart whose SKUs are sold by different
      strategies is refused (BadRequest): one order, one strategy; order them apart.
    - ``requested`` is the body's ``"strategy"``. It is refused (BadRequest)
      unless ``settings.SHOP_STRATEGY_FROM_REQUEST`` is on (the demo's flash
      sale compares strategies over HTTP; off by default, never in production);
      then it must name a registered strategy and overrides the settings.
    """
    if requested is not _NOT_GIVEN:
        if not settings.SHOP_STRATEGY_FROM_REQUEST:
            raise BadRequest(
                "this shop chooses the stock strategy itself (settings); "
                'remove "strategy" from the request'
            )
        if not isinstance(requested, str) or requested not in strategy_names():
            raise BadRequest(
                f"unknown strategy {requested!r}; choose one of {', '.join(strategy_names())}"
            )
        return requested
    default = default_strategy()
    per_sku = getattr(settings, "SHOP_SKU_STRATEGIES", None) or {}
    chosen = {sku: per_sku.get(sku, default) for sku in cart}
    if len(set(chosen.values())) > 1:
        sold_by = ", ".join(f"{sku}: {name}" for sku, name in chosen.items())
        raise BadRequest(
            f"the cart mixes SKUs sold by different stock strategies ({sold_by}); "
            "order them separately"
        )
    return next(iter(chosen.values()))


def default_strategy() -> str:
    """The strategy of every SKU not in SHOP_SKU_STRATEGIES."""
    return getattr(settings, "SHOP_STRATEGY", None) or stock_settings.STRATEGY


def place_order(
    cart: dict[str, int],
    strategy_name: str,
    key: str | None = None,
    ttl: float | None = None,
    customer: str | None = None,
) -> tuple[Order, bool]:
    """Reserve the cart for ``ttl`` seconds and create the order; (order, created).

    ``key`` (an Idempotency-Key) makes a retried request return the first
    order instead of buying twice. The reservation expires unpaid after
    ``ttl`` seconds (default ``settings.ORDER_TTL``): the library schedules
    that, from the Redis clock, and the order's ``expires_at`` is the
    reservation's (when the delay queue acts). Its expiry marks the order
    EXPIRED (see expiry.py). ``customer`` is who the units count against under
    the purchase caps (settings STOCK_LOCKS["CAPS"]). Raises what the strategy
    raises (OutOfStock, CapExceeded, InvalidQuantity, RedisUnavailable, ...);
    nothing is kept then.

    Copies of one key in flight at once (a double click, a client retrying on
    its timeout) get one answer: the library answers a repeated order ref with
    the reservation it holds, and the order's unique ref makes one order of it.
    """
    ref = f"shop-{key}" if key else f"shop-{uuid.uuid4().hex}"
    return _place(ref, cart, strategy_name, key, ttl, customer)


def _place(
    ref: str,
    cart: dict[str, int],
    strategy_name: str,
    key: str | None,
    ttl: float | None,
    customer: str | None,
) -> tuple[Order, bool]:
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
    # A ref made up here cannot repeat: a SKU seen sold out is refused without Redis.
    reservation = strategy.reserve(ref, cart, ttl=ttl, customer=customer, fresh_ref=not key)
    try:
        with transaction.atomic():
            # The reservation's row lock: an expiry releasing it now waits for this
            # order to exist (so its signal finds it), or went first (seen below).
            status = (
                Reservation.objects.select_for_update()
                .filter(order_ref=ref)
                .values_list("status", flat=True)
                .first()
            )
            order, created = Order.objects.get_or_create(
                ref=ref,
                defaults={"strategy": strategy_name, "expires_at": reservation.expires_at},
            )
            if created:
                products = {p.sku: p for p in Product.objects.filter(sku__in=cart)}
                OrderLine.objects.bulk_create(
                    OrderLine(order=order, product=products[sku], sku=sku, qty=qty,
                              price=products[sku].price)
                    for sku, qty in reservation.lines.items()
                )  # fmt: skip
    except BaseException:
        if reservation.created:
            _give_back(strategy, ref)
        raise
    if status == Reservation.Status.RELEASED:  # expired before the order was written
        order = settle(order, Order.Status.EXPIRED)
    order.retries = reservation.retries
    return order, created


def _give_back(strategy, ref: str) -> None:
    try:
        strategy.release(ref)
    except Exception as exc:  # the original error is the one to report
        log.error("order %s failed and its reservation could not be released: %s", ref, exc)


def pay_order(order: Order) -> Order:
    """Mark the order paid (its reservation committed); idempotent.

    Raises ReservationError when the order was cancelled or expired (its
    reservation released: the order is marked so), and what the strategy
    raises when the commit did not happen. A commit that happened but whose
    answer was lost (Redis down or a lost reply after the database committed)
    counts as done: the reservation row is the truth.
    """
    if order.status == Order.Status.PAID:
        return order
    if order.status != Order.Status.PENDING:
        raise ReservationError(
            f"order {order.pk} is {order.status}", order_ref=order.ref, status=order.status
        )
    try:
        get_strategy(order.strategy).commit(order.ref)
    except ReservationError:
        if reservation_status(order.ref) != Reservation.Status.RELEASED:
            raise
        # Its stock went back (the payment window passed): the order is expired.
        order = settle(order, Order.Status.EXPIRED)
        raise ReservationError(
            f"order {order.pk} is {order.status}: its reservation was released",
            order_ref=order.ref,
            status=order.status,
        ) from None
    except Exception as exc:
        if reservation_status(order.ref) != Reservation.Status.COMMITTED:
            raise
        log.warning("order %s: committed in the database, then %r; paid", order.pk, exc)
    return settle(order, Order.Status.PAID)  # the commit dropped the expiry item


def cancel_order(order: Order) -> Order:
    """Cancel an unpaid order and put its stock back; idempotent.

    Raises ReservationError when the order is paid (or its reservation was
    committed: the order is marked paid), and what the strategy raises when
    nothing was released. A release the database did (the units are back)
    counts as done even when the strategy then failed to answer.
    """
    if order.status in (Order.Status.CANCELLED, Order.Status.EXPIRED):
        return order
    if order.status == Order.Status.PAID:
        raise ReservationError(
            f"order {order.pk} is paid", order_ref=order.ref, status=order.status
        )
    try:
        get_strategy(order.strategy).release(order.ref)
    except ReservationError:
        if reservation_status(order.ref) != Reservation.Status.COMMITTED:
            raise
        order = settle(order, Order.Status.PAID)  # its commit's answer was lost
        raise ReservationError(
            f"order {order.pk} is paid", order_ref=order.ref, status=order.status
        ) from None
    except Exception as exc:
        if reservation_status(order.ref) != Reservation.Status.RELEASED:
            raise  # nothing changed: the caller may say so
        log.warning("order %s: released in the database, then %r; cancelled", order.pk, exc)
    # A leftover expiry item finds the reservation released and does nothing.
    return settle(order, Order.Status.CANCELLED)


def refresh_order(order: Order) -> Order:
    """The order as its reservation says it is: a PENDING order whose reservation
    was released (its expiry's signal was lost with a killed worker) is EXPIRED."""
    pending = order.status == Order.Status.PENDING
    if pending and reservation_status(order.ref) == Reservation.Status.RELEASED:
        return settle(order, Order.Status.EXPIRED)
    return order


def reservation_status(order_ref: str) -> str | None:
    """What the database says of the order's reservation (None: no row)."""
    return Reservation.objects.filter(order_ref=order_ref).values_list("status", flat=True).first()


def settle(order: Order, status: str) -> Order:
    """Move a PENDING order to ``status`` (once: a conditional update); the order as stored."""
    now = timezone.now()
    stamp = {Order.Status.PAID: "paid_at"}.get(status, "cancelled_at")
    Order.objects.filter(pk=order.pk, status=Order.Status.PENDING).update(
        status=status, updated_at=now, **{stamp: now}
    )
    order.refresh_from_db()
    return order
