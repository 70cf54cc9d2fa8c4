"""Checking what a caller asks to reserve: the cart, the order ref, the hold time.

Every check raises :class:`InvalidQuantity` with a message a shop can show,
before anything is read or written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..conf import settings
from ..exceptions import InvalidQuantity

Cart = dict[str, int]
MAX_ORDER_REF = 100  # characters, the Reservation.order_ref column
MAX_SKU = 100  # characters


def check_text(value: Any, what: str, longest: int) -> str:
    """``value`` if it is a non-empty string of at most ``longest`` characters that a
    database and Redis can store (no NUL, no lone surrogate), else InvalidQuantity."""
    if not isinstance(value, str) or not value or len(value) > longest:
        raise InvalidQuantity(
            f"{what} is a non-empty string of at most {longest} characters: {value!r}"
        )
    if "\x00" in value:
        raise InvalidQuantity(f"{what} contains a NUL character: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidQuantity(
            f"{what} is not valid Unicode (a lone surrogate): {value!r}"
        ) from None
    return value


def normalize_cart(cart: Any) -> Cart:
    """The cart as ``{sku: qty}`` in SKU order, or :class:`InvalidQuantity`.

    Rejects a non-mapping, an empty cart, more than ``MAX_CART_LINES`` lines,
    a SKU that is not a non-empty string (or holds a NUL or a lone surrogate),
    and a quantity that is not an int (bools included) between 1 and
    ``MAX_LINE_QUANTITY``. SKU order is the order every strategy takes locks
    and row locks in, so carts cannot deadlock.
    """
    if not isinstance(cart, Mapping):
        raise InvalidQuantity(f"a cart maps SKU to quantity, got {type(cart).__name__}")
    if not cart:
        raise InvalidQuantity("the cart is empty")
    if len(cart) > settings.MAX_CART_LINES:
        raise InvalidQuantity(
            f"the cart has {len(cart)} lines; at most {settings.MAX_CART_LINES} are allowed"
        )
    limit = settings.MAX_LINE_QUANTITY
    lines: Cart = {}
    for sku, qty in cart.items():
        check_text(sku, "a SKU", MAX_SKU)
        if isinstance(qty, bool) or not isinstance(qty, int):
            raise InvalidQuantity(
                f"the quantity of {sku!r} must be an integer, got {qty!r}", sku=sku
            )
        if not 1 <= qty <= limit:
            raise InvalidQuantity(
                f"the quantity of {sku!r} must be between 1 and {limit}, got {qty}", sku=sku
            )
        lines[sku] = qty
    return lines if len(lines) == 1 else dict(sorted(lines.items()))


def check_order_ref(order_ref: Any) -> str:
    return check_text(order_ref, "an order ref", MAX_ORDER_REF)


def check_ttl(ttl: Any) -> int | None:
    """A reservation's hold time in seconds as whole ms (None: it does not expire)."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise InvalidQuantity(f"ttl must be a positive number of seconds, got {ttl!r}")
    return max(1, int(ttl * 1000))


def unknown_sku(sku: str) -> InvalidQuantity:
    return InvalidQuantity(f"unknown SKU {sku!r}", sku=sku)
