"""The project's stock table and the statements every strategy writes it with.

Stock lives in the project's model (``STOCK_MODEL``, with ``STOCK_SKU_FIELD``
and ``STOCK_QUANTITY_FIELD``): the quantity is the number of units still to
sell, so a reservation takes units from it at once and a release puts them
back. Every write here is relative and guarded in one statement
(``stock = stock - q WHERE stock >= q``), never an absolute value computed
from an earlier read: two strategies on one SKU, an admin restock or a
release racing a reserve can never make it oversell.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any, NamedTuple, cast

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, models, router, transaction
from django.utils import timezone

from ..conf import settings
from ..exceptions import OutOfStock
from ..fencing import stale
from ..models import Reservation
from .caps import (
    ADVISORY_LOCKS,
    NOBODY,
    Buyer,
    Cap,
    advisory_keys,
    caps_for,
    check_purchases,
    count_in_database,
    counting_since,
    holds_of,
)
from .cart import Cart, unknown_sku
from .ledger import new_reservation


class Order(NamedTuple):
    """One reservation a statement writes (``customer``: '' when uncapped)."""

    ref: str
    lines: Cart
    strategy: str
    expires_at: dt.datetime | None
    customer: str = ""


class StockTable:
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

    def levels(self, skus: list[str] | None = None) -> dict[str, int]:
        """Units left per SKU, for the SKUs that exist (every SKU when ``skus`` is None)."""
        rows = self.objects.all()
        if skus is not None:
            rows = rows.filter(**{f"{self.sku}__in": skus})
        return dict(rows.values_list(self.sku, self.qty))

    def level(self, sku: str) -> int:
        """Units left of one SKU; :class:`InvalidQuantity` when the SKU is unknown."""
        levels = self.levels([sku])
        if sku not in levels:
            raise unknown_sku(sku)
        return levels[sku]

    def take_conditionally(self, lines: Cart, fences: dict[str, int] | None = None) -> None:
        """In the caller's transaction: ``stock -= qty WHERE stock >= qty`` per line.

        With ``fences`` (SKU -> fencing token of the lock held on it), each
        statement also requires the row's stored fence not to be newer and
        stores the token: a lock holder paused past its lease is refused once
        the newer holder has written; writing first, it overwrites nothing (the
        write is relative), and neither can take units that are not there.

        Raises :class:`OutOfStock` (or :class:`InvalidQuantity` for an unknown
        SKU, :class:`StaleFencingToken`) at the first line that cannot be
        taken; the caller rolls back.
        """
        for sku, qty in lines.items():
            rows = self.objects.filter(**{self.sku: sku, f"{self.qty}__gte": qty})
            changes: dict[str, Any] = {self.qty: models.F(self.qty) - qty}
            if fences is not None:
                rows = rows.filter(fence__lte=fences[sku])
                changes["fence"] = fences[sku]
            if not rows.update(**changes):
                raise self._refusal(sku, qty, fences)

    def _refusal(self, sku: str, qty: int, fences: dict[str, int] | None) -> Exception:
        row = self.objects.filter(**{self.sku: sku}).values(self.qty, "fence" if fences else "pk")
        row = row.first()
        if row is None:
            return unknown_sku(sku)
        if fences is not None and row["fence"] > fences[sku]:
            return stale(f"{self.model.__name__} {sku!r}", fences[sku], row["fence"])
        return OutOfStock(sku, qty, row[self.qty])

    def take_and_record(
        self,
        order_ref: str,
        lines: Cart,
        strategy: str,
        retries: int = 0,
        expires_at: dt.datetime | None = None,
        buyer: Buyer = NOBODY,
    ) -> Reservation:
        """In one transaction: take every line (``stock >= qty``), count the buyer's
        caps and insert the RESERVED row. Raises :class:`OutOfStock` or
        :class:`CapExceeded` (nothing taken) and ``IntegrityError`` when the order
        ref already has a row.

        On PostgreSQL a one-line cart (the flash-sale case) is one statement, a
        data-modifying CTE, instead of three ORM queries: the hot row stays
        locked for one round trip, and the ORM's CPU cost per sale (which caps a
        2-core web host long before the database does) goes away. Longer carts
        take their rows one by one in SKU order, so two carts cannot deadlock.
        """
        db = router.db_for_write(Reservation)
        if len(lines) == 1 and not buyer.caps and connections[db].vendor == "postgresql":
            [sku] = lines
            order = Order(order_ref, lines, strategy, expires_at)
            inserted = self._take_and_record_in_one_statement(db, sku, [order])
            pk, created_at = inserted[order_ref]
            return recorded(pk, created_at, order_ref, lines, strategy, retries, expires_at, db)
        with transaction.atomic(using=db):
            # The stock rows first, then the reservation's: the order of the one-statement
            # path and of the group commit's batches. (Row first, a duplicate request
            # writing the same ref in a batch deadlocked with it: each waited for a lock
            # the other took first.)
            self.take_conditionally(lines)
            reservation = new_reservation(order_ref, lines, strategy, retries, expires_at, buyer)
        return reservation

    def _columns(self, db: str) -> tuple[dict[str, str], str, str, str]:
        """Quoted names: the reservation table's columns by field name, and the stock
        table, its SKU column and its quantity column."""
        q = connections[db].ops.quote_name
        res = {f.name: q(f.column) for f in Reservation._meta.concrete_fields}
        product = self.model._meta
        sku_col = q(cast(models.Field, product.get_field(self.sku)).column)
        qty_col = q(cast(models.Field, product.get_field(self.qty)).column)
        res["table"] = q(Reservation._meta.db_table)
        return res, q(product.db_table), sku_col, qty_col

    def _take_and_record_in_one_statement(
        self, db: str, sku: str, orders: list[Order]
    ) -> dict[str, tuple[int, dt.datetime]]:
        """Reservations whose carts all ask for one SKU, in one statement (a
        data-modifying CTE): one guarded decrement of their sum, and their rows
        inserted only if it took. Returns ``{order ref: (id, created_at)}``; raises
        :class:`OutOfStock` when the sum is not there and ``IntegrityError`` when a
        ref already has a row (nothing written either way)."""
        res, table, sku_col, qty_col = self._columns(db)
        total = sum(order.lines[sku] for order in orders)
        into, values, returning, rows = _reservation_rows(res, orders)
        sql = (
            f"WITH taken AS (UPDATE {table} SET {qty_col} = {qty_col} - %s "
            f"WHERE {sku_col} = %s AND {qty_col} >= %s RETURNING 1) "
            f"{into} SELECT v.* FROM (VALUES {values}) AS v CROSS JOIN taken {returning}"
        )
        params: list[Any] = [total, sku, total, *rows]
        connection = connections[db]
        # Autocommit makes the statement its own transaction; inside the caller's
        # transaction a savepoint keeps a duplicate-ref error from aborting it.
        scope = transaction.atomic(using=db) if connection.in_atomic_block else nullcontext()
        with scope, connection.cursor() as cursor:
            cursor.execute(sql, params)
            inserted = {ref: (pk, created) for ref, pk, created in cursor.fetchall()}
        if not inserted:  # nothing was taken, so nothing to roll back
            raise OutOfStock(sku, total, self.level(sku))
        return inserted

    def take_and_record_many(self, batch: list[Order]) -> dict[str, tuple[int, dt.datetime]]:
        """Several reservations (:class:`Order`), in
        one transaction on PostgreSQL: their RESERVED rows and their units, one
        guarded decrement per SKU for their sum, and their customers' purchase caps
        counted. One commit, and one wait on each hot row, for all of them.

        Carts of one and the same SKU (a flash sale's) are one statement, and a ref
        that already has a row fails them all (``IntegrityError``). Other batches
        skip such refs, and take their SKUs in SKU order before inserting rows, as
        every other write does (no two writes can deadlock). Returns ``{order ref:
        (id, created_at)}`` of the rows inserted. Raises :class:`OutOfStock` (or
        :class:`InvalidQuantity`) when a SKU has less than the sum, or CapExceeded
        when a reservation would pass a cap: nothing is written.
        """
        db = router.db_for_write(Reservation)
        skus = {sku for order in batch for sku in order.lines}
        capped = {order.ref: caps_for(order.lines) for order in batch if order.customer}
        capped = {ref: caps for ref, caps in capped.items() if caps}
        if len(skus) == 1 and not capped and all(len(order.lines) == 1 for order in batch):
            [sku] = skus
            return self._take_and_record_in_one_statement(db, sku, batch)
        if capped and connections[db].vendor == "postgresql":
            return self._take_and_record_pipelined(db, batch, capped)
        res, table, sku_col, qty_col = self._columns(db)
        take = (
            f"UPDATE {table} SET {qty_col} = {qty_col} - %s "
            f"WHERE {sku_col} = %s AND {qty_col} >= %s"
        )
        give = f"UPDATE {table} SET {qty_col} = {qty_col} + %s WHERE {sku_col} = %s"
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            # The stock rows first (in SKU order), then the reservations' rows: the order
            # of every other write. (Rows first, a caller that stopped waiting for this
            # batch and wrote its own row deadlocked with it: it held a stock row this
            # batch waited for, and waited for the row this batch had inserted.)
            cursor.execute(
                f"SELECT {res['order_ref']} FROM {res['table']} WHERE {res['order_ref']} = ANY(%s)",
                [[order.ref for order in batch]],
            )
            have_rows = {ref for (ref,) in cursor.fetchall()}
            pending = [order for order in batch if order.ref not in have_rows]
            if not pending:
                return {}
            totals = _units(order.lines for order in pending)
            for sku in sorted(totals):
                cursor.execute(take, [totals[sku], sku, totals[sku]])
                if cursor.rowcount == 0:
                    raise self._refusal(sku, totals[sku], None)
            # (then the caps: CapExceeded rolls the batch back, to be written one by one)
            purchases = [(o.customer, o.lines, capped[o.ref]) for o in pending if o.ref in capped]
            count_in_database(purchases, timezone.now())
            into, values, returning, params = _reservation_rows(res, pending)
            cursor.execute(
                f"{into} VALUES {values} ON CONFLICT ({res['order_ref']}) DO NOTHING {returning}",
                params,
            )
            inserted = {ref: (pk, created) for ref, pk, created in cursor.fetchall()}
            # A ref whose row a concurrent request committed meanwhile: its units go back.
            back = _units(order.lines for order in pending if order.ref not in inserted)
            for sku in sorted(back):
                cursor.execute(give, [back[sku], sku])
        return inserted

    def _take_and_record_pipelined(
        self, db: str, batch: list[Order], capped: dict[str, list[Cap]]
    ) -> dict[str, tuple[int, dt.datetime]]:
        """:meth:`take_and_record_many` of a capped batch on PostgreSQL: its statements
        sent at once (psycopg's pipeline mode), in the order of every other write: the
        stock rows (SKU order), the caps' advisory locks, the customers' reservations
        (read after the locks: a statement sees what was committed before it ran),
        the rows inserted. The replies are checked once they are all in; a refusal
        rolls everything back. The hot stock row stays locked for two round trips
        (this and the commit) where a statement at a time took six."""
        res, table, sku_col, qty_col = self._columns(db)
        totals = _units(order.lines for order in batch)
        now = timezone.now()
        now_ms = int(now.timestamp() * 1000)
        purchases = [(o.customer, o.lines, capped[o.ref]) for o in batch if o.ref in capped]
        held_sql = (
            f"SELECT {res['customer']}, {res['lines']}, {res['created_at']} FROM {res['table']} "
            f"WHERE {res['customer']} = ANY(%s) AND {res['status']} = ANY(%s)"
        )
        held_params: list[Any] = [
            sorted({customer for customer, _, _ in purchases}),
            [Reservation.Status.RESERVED.value, Reservation.Status.COMMITTED.value],
        ]
        if (since := counting_since(purchases, now_ms)) is not None:
            held_sql += f" AND {res['created_at']} >= %s"
            held_params.append(since)
        into, values, returning, rows = _reservation_rows(res, batch)
        connection = connections[db]
        with transaction.atomic(using=db):
            connection.ensure_connection()
            pg = connection.connection
            with pg.pipeline():
                existing = pg.cursor().execute(
                    f"SELECT {res['order_ref']} FROM {res['table']} "
                    f"WHERE {res['order_ref']} = ANY(%s)",
                    [[order.ref for order in batch]],
                )
                takes = [
                    (sku, pg.cursor().execute(
                        f"UPDATE {table} SET {qty_col} = {qty_col} - %s "
                        f"WHERE {sku_col} = %s AND {qty_col} >= %s",
                        [totals[sku], sku, totals[sku]],
                    ))
                    for sku in sorted(totals)
                ]  # fmt: skip
                pg.cursor().execute(ADVISORY_LOCKS, [advisory_keys(holds_of(purchases))])
                held = pg.cursor().execute(held_sql, held_params)
                insert = pg.cursor().execute(
                    f"{into} VALUES {values} ON CONFLICT ({res['order_ref']}) DO NOTHING "
                    f"{returning}",
                    rows,
                )
            for sku, take in takes:
                if take.rowcount == 0:
                    raise self._refusal(sku, totals[sku], None)
            have_rows = {ref for (ref,) in existing.fetchall()}
            pending = [
                (o.customer, o.lines, capped[o.ref])
                for o in batch
                if o.ref in capped and o.ref not in have_rows
            ]
            # (Django has jsonb loaded as text: its fields parse it.)
            bought = [(c, json.loads(lines), made) for c, lines, made in held.fetchall()]
            check_purchases(pending, bought, now_ms)
            inserted = {ref: (pk, created) for ref, pk, created in insert.fetchall()}
            # Refs whose rows were there already (or committed meanwhile): units go back.
            back = _units(order.lines for order in batch if order.ref not in inserted)
            with connection.cursor() as cursor:
                for sku in sorted(back):
                    cursor.execute(
                        f"UPDATE {table} SET {qty_col} = {qty_col} + %s WHERE {sku_col} = %s",
                        [back[sku], sku],
                    )
        return inserted

    def put_back(self, lines: Cart) -> None:
        """In the caller's transaction: ``stock += qty`` per line."""
        for sku, qty in lines.items():
            self.objects.filter(**{self.sku: sku}).update(**{self.qty: models.F(self.qty) + qty})


def _units(carts: Iterable[Cart]) -> dict[str, int]:
    """The units of every SKU in ``carts``, summed."""
    totals: dict[str, int] = {}
    for lines in carts:
        for sku, qty in lines.items():
            totals[sku] = totals.get(sku, 0) + qty
    return totals


def _reservation_rows(res: dict[str, str], orders: list[Order]) -> tuple[str, str, str, list[Any]]:
    """The RESERVED rows of ``orders`` for an INSERT: its ``INSERT INTO ...(columns)``,
    a VALUES list, a RETURNING of (order ref, id, created_at), and the parameters."""
    columns = ("order_ref", "lines", "strategy", "status", "customer", "created_at", "updated_at")
    into = f"INSERT INTO {res['table']} ({', '.join(res[c] for c in columns)}, {res['expires_at']})"
    row = "(%s, %s::jsonb, %s, %s, %s, now(), now(), %s::timestamptz)"
    returning = f"RETURNING {res['order_ref']}, {res['id']}, {res['created_at']}"
    params: list[Any] = []
    for ref, lines, strategy, expires_at, customer in orders:
        status = Reservation.Status.RESERVED
        params += [ref, json.dumps(lines), strategy, status, customer, expires_at]
    return into, ", ".join([row] * len(orders)), returning, params


def recorded(
    pk: int,
    created_at: dt.datetime,
    order_ref: str,
    lines: Cart,
    strategy: str,
    retries: int,
    expires_at: dt.datetime | None,
    db: str,
    customer: str = "",
) -> Reservation:
    """The RESERVED reservation a statement of ours just inserted, as a saved model
    instance (``created`` True), without reading it back."""
    reservation = Reservation(
        id=pk, order_ref=order_ref, lines=lines, strategy=strategy,
        status=Reservation.Status.RESERVED, created_at=created_at, updated_at=created_at,
        expires_at=expires_at, customer=customer,
    )  # fmt: skip
    reservation._state.adding, reservation._state.db = False, db
    reservation.created, reservation.retries = True, retries
    return reservation
