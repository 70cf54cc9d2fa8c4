"""The strategy interface, cart validation, and the database steps every strategy shares.

Stock lives in the project's model (``STOCK_MODEL``, with ``STOCK_SKU_FIELD``
and ``STOCK_QUANTITY_FIELD``): the quantity is the number of units still to
sell, so a reservation takes units from it at once and a release puts them
back. The app's own :class:`~stock_locks.models.Reservation` row, unique by
order ref, is what makes reserve, commit and release idempotent.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, models, router, transaction

from ..conf import settings
from ..exceptions import InvalidQuantity, OutOfStock, ReservationError
from ..models import Reservation

Cart = dict[str, int]
MAX_ORDER_REF = 100  # characters, the Reservation.order_ref column


def normalize_cart(cart: Any) -> Cart:
    """The cart as ``{sku: qty}`` in SKU order, or :class:`InvalidQuantity`.

    Rejects a non-mapping, an empty cart, more than ``MAX_CART_LINES`` lines,
    a SKU that is not a non-empty string, and a quantity that is not an int
    (bools included) between 1 and ``MAX_LINE_QUANTITY``. SKU order is the
    order every strategy takes locks and row locks in, so carts cannot deadlock.
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
    for sku, qty in cart.items():
        if not isinstance(sku, str) or not sku or len(sku) > 100:
            raise InvalidQuantity(f"a SKU is a non-empty string of at most 100 characters: {sku!r}")
        if isinstance(qty, bool) or not isinstance(qty, int):
            raise InvalidQuantity(
                f"the quantity of {sku!r} must be an integer, got {qty!r}", sku=sku
            )
        if not 1 <= qty <= limit:
            raise InvalidQuantity(
                f"the quantity of {sku!r} must be between 1 and {limit}, got {qty}", sku=sku
            )
    return dict(sorted(cart.items()))


def check_order_ref(order_ref: Any) -> str:
    if not isinstance(order_ref, str) or not order_ref or len(order_ref) > MAX_ORDER_REF:
        raise InvalidQuantity(
            f"an order ref is a non-empty string of at most {MAX_ORDER_REF} characters: "
            f"{order_ref!r}"
        )
    return order_ref


class StockModel:
    """The configured stock model and its fields, with the queries strategies share."""

    def __init__(self) -> None:
        label = settings.STOCK_MODEL
        if not label:
            raise ImproperlyConfigured(
                'STOCK_LOCKS["STOCK_MODEL"] is not set; name the model that holds stock, '
                'e.g. "shop.Product"'
            )
        try:
            self.model: type[models.Model] = apps.get_model(label)
        except (LookupError, ValueError) as exc:
            raise ImproperlyConfigured(f'STOCK_LOCKS["STOCK_MODEL"] = {label!r}: {exc}') from None
        self.sku = settings.STOCK_SKU_FIELD
        self.qty = settings.STOCK_QUANTITY_FIELD
        self.objects = self.model._default_manager

    def levels(self, skus: list[str]) -> dict[str, int]:
        """Units left per SKU, for the SKUs that exist."""
        rows = self.objects.filter(**{f"{self.sku}__in": skus}).values_list(self.sku, self.qty)
        return dict(rows)

    def level(self, sku: str) -> int:
        """Units left of one SKU; :class:`InvalidQuantity` when the SKU is unknown."""
        levels = self.levels([sku])
        if sku not in levels:
            raise unknown_sku(sku)
        return levels[sku]

    def take_conditionally(self, lines: Cart) -> None:
        """In the caller's transaction: ``stock -= qty WHERE stock >= qty`` per line.

        Raises :class:`OutOfStock` (or :class:`InvalidQuantity` for an unknown
        SKU) at the first line that cannot be taken; the caller rolls back.
        """
        for sku, qty in lines.items():
            taken = self.objects.filter(**{self.sku: sku, f"{self.qty}__gte": qty}).update(
                **{self.qty: models.F(self.qty) - qty}
            )
            if not taken:
                raise OutOfStock(sku, qty, self.level(sku))

    def take_and_record(
        self, order_ref: str, lines: Cart, strategy: str, retries: int = 0
    ) -> Reservation:
        """In one transaction: take every line (``stock >= qty``) and insert the
        RESERVED row. Raises :class:`OutOfStock` (nothing taken) and
        ``IntegrityError`` when the order ref already has a row.

        On PostgreSQL a one-line cart (the flash-sale case) is one statement, a
        data-modifying CTE, instead of three ORM queries: the hot row stays
        locked for one round trip, and the ORM's CPU cost per sale (which caps a
        2-core web host long before the database does) goes away. Longer carts
        take their rows one by one in SKU order, so two carts cannot deadlock.
        """
        db = router.db_for_write(Reservation)
        if len(lines) == 1 and connections[db].vendor == "postgresql":
            return self._take_and_record_in_one_statement(db, order_ref, lines, strategy, retries)
        with transaction.atomic(using=db):
            reservation = new_reservation(order_ref, lines, strategy, retries)
            self.take_conditionally(lines)
        return reservation

    def _take_and_record_in_one_statement(
        self, db: str, order_ref: str, lines: Cart, strategy: str, retries: int
    ) -> Reservation:
        [(sku, qty)] = lines.items()
        q = connections[db].ops.quote_name
        res = {f.name: q(f.column) for f in Reservation._meta.concrete_fields}
        product = self.model._meta
        sku_col = q(product.get_field(self.sku).column)
        qty_col = q(product.get_field(self.qty).column)
        sql = (
            f"WITH taken AS (UPDATE {q(product.db_table)} SET {qty_col} = {qty_col} - %s "
            f"WHERE {sku_col} = %s AND {qty_col} >= %s RETURNING 1) "
            f"INSERT INTO {q(Reservation._meta.db_table)} ({res['order_ref']}, {res['lines']}, "
            f"{res['strategy']}, {res['status']}, {res['created_at']}, {res['updated_at']}) "
            f"SELECT %s, %s::jsonb, %s, %s, now(), now() FROM taken "
            f"RETURNING {res['id']}, {res['created_at']}"
        )
        params = [
            qty,
            sku,
            qty,
            order_ref,
            json.dumps(lines),
            strategy,
            Reservation.Status.RESERVED,
        ]
        connection = connections[db]
        # Autocommit makes the statement its own transaction; inside the caller's
        # transaction a savepoint keeps a duplicate-ref error from aborting it.
        scope = transaction.atomic(using=db) if connection.in_atomic_block else nullcontext()
        with scope, connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:  # nothing was taken, so nothing to roll back
            raise OutOfStock(sku, qty, self.level(sku))
        reservation = Reservation(
            id=row[0], order_ref=order_ref, lines=lines, strategy=strategy,
            status=Reservation.Status.RESERVED, created_at=row[1], updated_at=row[1],
        )  # fmt: skip
        reservation._state.adding, reservation._state.db = False, db
        reservation.created, reservation.retries = True, retries
        return reservation

    def put_back(self, lines: Cart) -> None:
        """In the caller's transaction: ``stock += qty`` per line."""
        for sku, qty in lines.items():
            self.objects.filter(**{self.sku: sku}).update(**{self.qty: models.F(self.qty) + qty})


def unknown_sku(sku: str) -> InvalidQuantity:
    return InvalidQuantity(f"unknown SKU {sku!r}", sku=sku)


class StockStrategy(ABC):
    """One way to sell stock without overselling.

    ``reserve`` takes every line of a cart or none; ``commit`` makes a
    reservation final (paid); ``release`` puts its units back. All three are
    idempotent by order ref: repeating one never moves stock twice.
    """

    #: Whether the strategy needs Redis (for HTTP 503 when it is down).
    uses_redis = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.stock = StockModel()

    def reserve(self, order_ref: str, cart: Mapping[str, int]) -> Reservation:
        """Reserve every line of ``cart`` for ``order_ref``, or nothing.

        Returns the reservation; ``reservation.created`` is False when the
        order ref already had one (nothing moved then), ``reservation.retries``
        counts optimistic retries. Raises :class:`OutOfStock` naming the first
        short line, :class:`InvalidQuantity` for a bad cart or unknown SKU,
        :class:`~stock_locks.exceptions.RedisUnavailable` when Redis is down
        (nothing reserved). Blocks at most for the strategy's lock or retry budget.
        """
        return self.do_reserve(check_order_ref(order_ref), normalize_cart(cart))

    @abstractmethod
    def do_reserve(self, order_ref: str, lines: Cart) -> Reservation: ...

    def reserve_once(
        self, order_ref: str, lines: Cart, take: Callable[[], None], *, checked: bool = False
    ) -> Reservation:
        """The database reservation every DB-side strategy makes: ``take()`` the
        units and insert the row in one transaction, unless the order ref already
        has one (then that one, nothing moved; a racing duplicate is caught by
        the unique order ref and rolled back). ``checked``: the caller already
        looked for a repeat."""
        repeat = None if checked else repeat_of(order_ref, lines)
        if repeat is not None:
            return repeat
        try:
            with transaction.atomic():
                take()
                return new_reservation(order_ref, lines, self.name)
        except IntegrityError:
            return existing_reservation(order_ref, lines)

    def commit(self, order_ref: str) -> bool:
        """Make the reservation final: its units stay sold.

        Returns True when it was committed now, False when it already was.
        Raises :class:`ReservationError` when it was released (or never made).
        """
        return commit_in_db(check_order_ref(order_ref))

    def release(self, order_ref: str) -> bool:
        """Put the reservation's units back. True when they went back now,
        False when it was already released. Raises :class:`ReservationError`
        when it is committed or unknown."""
        return release_in_db(self.stock, check_order_ref(order_ref))[1]

    @abstractmethod
    def available(self, sku: str) -> int:
        """Units of ``sku`` that can be reserved now."""


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


def release_in_db(stock: StockModel, order_ref: str) -> tuple[Reservation, bool]:
    """Mark the reservation RELEASED and put its units back, in one transaction.

    Returns the reservation and whether it was released by this call.
    """
    with transaction.atomic():
        reservation = locked_reservation(order_ref)
        if reservation.status == Reservation.Status.RELEASED:
            return reservation, False
        stock.put_back(reservation.lines)
        mark(reservation, Reservation.Status.RELEASED)
    return reservation, True


def mark(reservation: Reservation, status: str) -> None:
    reservation.status = status
    reservation.save(update_fields=["status", "updated_at"])


def commit_in_db(order_ref: str) -> bool:
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
            return False
        mark(reservation, Reservation.Status.COMMITTED)
    return True


def new_reservation(order_ref: str, lines: Cart, strategy: str, retries: int = 0) -> Reservation:
    """Insert the RESERVED row (in the caller's transaction); IntegrityError if the ref exists."""
    reservation = Reservation.objects.create(order_ref=order_ref, lines=lines, strategy=strategy)
    reservation.created = True
    reservation.retries = retries
    return reservation


def repeat_of(order_ref: str, lines: Cart) -> Reservation | None:
    """The reservation ``order_ref`` already has (``created`` False), or None.

    Raises :class:`ReservationError` when the ref was used for other lines.
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
    reservation.created = False
    reservation.retries = 0
    return reservation


def existing_reservation(order_ref: str, lines: Cart) -> Reservation:
    """Like :func:`repeat_of`, but a missing row means another request is still writing
    it: :class:`ReservationError` ("in flight")."""
    reservation = repeat_of(order_ref, lines)
    if reservation is None:
        raise ReservationError(
            f"a reservation for {order_ref!r} is in flight; retry shortly", order_ref=order_ref
        )
    return reservation
