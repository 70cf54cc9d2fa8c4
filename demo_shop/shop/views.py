"""The shop's JSON API and its one HTML page.

GET  /api/products/                 products with their stock
POST /api/orders/                   {"items": [{"sku": "TEA", "qty": 1}]}
                                    201 order | 400 bad input | 409 out of stock or
                                    cap_exceeded | 503 Redis down
                                    (header Idempotency-Key: a retry returns the first order, 200;
                                    copies in flight at once are served one after the other)
GET  /api/orders/<id>/              the order
POST /api/orders/<id>/pay/          200 paid | 409 cancelled or expired
POST /api/orders/<id>/cancel/       200 cancelled, stock back | 409 paid
POST /api/sale/order/               one unit of the flash sale's SKU, behind the waiting room
                                    (flash_queue.py): 201 order | 429 waiting (JSON: place,
                                    ETA) | 409 sold out | 503 Redis down

The stock strategy is the server's (settings SHOP_STRATEGY, SHOP_SKU_STRATEGIES);
a body naming one is a 400 unless the demo-only SHOP_STRATEGY_FROM_REQUEST is on
(see services.choose_strategy). A fenced write refused because a newer lock
holder wrote first is a 409 "stale_fence": nothing changed, try again.

Purchase caps (settings STOCK_LOCKS["CAPS"]) count against the customer: the
signed-in user ("user:<id>"), else for a guest the e-mail in the header
X-Customer-Email (a real shop would use an address it verified), else the
session ("session:<key>", created on the first order). A cart past a cap is a
409 "cap_exceeded" with the cap, its limit and what the customer already holds.
"""

from __future__ import annotations

import contextlib
import re

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from stock_locks import locked
from stock_locks.exceptions import (
    BackendUnavailable,
    CapExceeded,
    ContentionError,
    InvalidQuantity,
    LockTimeout,
    OutOfStock,
    ReservationError,
    StaleFencingToken,
)
from stock_locks.stock import strategy_names
from stock_locks.waitingroom import release_admission, room_for, waiting_room

from .flash_queue import LANES, SALE_EVENT
from .models import Order, Product
from .services import (
    BadRequest,
    cancel_order,
    default_strategy,
    parse_order_body,
    pay_order,
    place_order,
    refresh_order,
)

IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,80}")  # fullmatch: "$" would allow a "\n"


def error(http_status: int, code: str, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": code, "message": message, **extra}, status=http_status)


def stale_fence(exc: StaleFencingToken) -> JsonResponse:
    return error(
        409,
        "stale_fence",
        f"a newer holder of the stock lock wrote first ({exc}); nothing changed, try again",
    )


def unavailable(exc: BackendUnavailable) -> JsonResponse:
    """503: the stock service did not answer. No order was written; a reserve whose reply
    was lost may hold units in Redis until the same request (Idempotency-Key) is sent
    again or the sweeper gives them back, so the message says so (``exc``'s own)."""
    response = error(503, "unavailable", f"the stock service did not answer: {exc}")
    response["Retry-After"] = "1"
    return response


GUEST_EMAIL = re.compile(r"[^@\s{}]{1,64}@[^@\s{}]{1,80}")


def customer_of(request: HttpRequest) -> str:
    """Who an order's units count against under the caps (see the module's docstring)."""
    if request.user.is_authenticated:
        return f"user:{request.user.pk}"
    email = request.headers.get("X-Customer-Email", "").strip().lower()
    if GUEST_EMAIL.fullmatch(email):
        return f"guest:{email}"
    if request.session.session_key is None:
        request.session.save()
    return f"session:{request.session.session_key}"


def shop_page(request: HttpRequest):
    context = {
        "products": Product.objects.all(),
        "default_strategy": default_strategy(),
        # The picker only where the request may pick (demo only).
        "strategies": strategy_names() if settings.SHOP_STRATEGY_FROM_REQUEST else [],
    }
    return render(request, "shop/index.html", context)


@require_GET
def products(request: HttpRequest) -> JsonResponse:
    rows = Product.objects.values("sku", "name", "price", "stock")
    return JsonResponse({"products": [{**row, "price": str(row["price"])} for row in rows]})


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    try:
        cart, strategy = parse_order_body(request.body)
    except BadRequest as exc:
        return error(400, "bad_request", str(exc))
    key = request.headers.get("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        return error(400, "bad_request", "Idempotency-Key: 1-80 of A-Z a-z 0-9 _ . : -")
    try:
        order, created = place_order(cart, strategy, key, customer=customer_of(request))
    except CapExceeded as exc:
        return error(
            409,
            "cap_exceeded",
            str(exc),
            sku=exc.sku,
            cap=exc.cap,
            limit=exc.limit,
            bought=exc.bought,
            requested=exc.requested,
        )
    except OutOfStock as exc:
        return error(
            409,
            "out_of_stock",
            str(exc),
            sku=exc.sku,
            requested=exc.requested,
            available=exc.available,
        )
    except InvalidQuantity as exc:
        return error(400, "bad_request", str(exc), sku=exc.sku)
    except BackendUnavailable as exc:  # (the one "did not answer" error, cause chained)
        return unavailable(exc)
    except ContentionError as exc:
        return error(409, "contention", str(exc), attempts=exc.attempts)
    except StaleFencingToken as exc:
        return stale_fence(exc)
    except LockTimeout as exc:
        return error(423, "locked", str(exc), lock=exc.name)
    except ReservationError as exc:
        return error(409, "conflict", str(exc))
    body = order.as_dict()
    body["retries"] = getattr(order, "retries", 0)
    return JsonResponse(body, status=201 if created else 200)


def _order_or_404(order_id: int) -> Order | JsonResponse:
    order = Order.objects.filter(pk=order_id).first()
    return order if order is not None else error(404, "not_found", f"no order {order_id}")


@require_GET
def order_detail(request: HttpRequest, order_id: int) -> JsonResponse:
    order = _order_or_404(order_id)
    if isinstance(order, JsonResponse):
        return order
    return JsonResponse(refresh_order(order).as_dict())


@csrf_exempt
@require_POST
@locked("order:{order_id}")  # waits STOCK_LOCKS["DECORATOR_TIMEOUT"], then 423
def pay(request: HttpRequest, order_id: int) -> JsonResponse:
    return _transition(order_id, pay_order)


@csrf_exempt
@require_POST
@locked("order:{order_id}")
def cancel(request: HttpRequest, order_id: int) -> JsonResponse:
    return _transition(order_id, cancel_order)


def _transition(order_id: int, action) -> JsonResponse:
    order = _order_or_404(order_id)
    if isinstance(order, JsonResponse):
        return order
    try:
        return JsonResponse(action(order).as_dict())
    except ReservationError as exc:
        return error(409, "conflict", str(exc), status=exc.status)
    except StaleFencingToken as exc:
        return stale_fence(exc)
    except LockTimeout as exc:
        return error(423, "locked", str(exc), lock=exc.name)
    except BackendUnavailable as exc:  # (the one "did not answer" error, cause chained)
        return unavailable(exc)


def sale_lane(request: HttpRequest) -> str | None:
    """The lane a buyer of the demo's flash sale claims (header X-Demo-Lane). Demo only:
    a real shop puts its signed-in members in the first lane (the default)."""
    lane = request.headers.get("X-Demo-Lane")
    return lane if lane in LANES else None


@csrf_exempt
@require_POST
@waiting_room(SALE_EVENT, lane=sale_lane)
def sale_order(request: HttpRequest) -> JsonResponse:
    """One unit of the flash sale's SKU for an admitted buyer, who then leaves the
    waiting room (its slot goes to the next at once), ordered or not."""
    sku = room_for(SALE_EVENT).spec.skus[0]
    try:
        order, _ = place_order({sku: 1}, default_strategy(), customer=customer_of(request))
        response = JsonResponse(order.as_dict(), status=201)
    except OutOfStock as exc:
        response = error(409, "out_of_stock", str(exc), sku=exc.sku, available=exc.available)
    except BackendUnavailable as exc:
        return unavailable(exc)
    with contextlib.suppress(BackendUnavailable):  # (else its slot lapses after session_ttl)
        release_admission(request, SALE_EVENT, response)
    return response
