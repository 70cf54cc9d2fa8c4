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
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, NamedTuple, cast

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, ProgrammingError, connections, models, router, transaction
from django.db.models.functions import Collate
from django.utils import timezone

from ..conf import settings
from ..exceptions import OutOfStock
from ..fencing import stale
from ..models import Reservation
from .caps import (
    NOBODY,
    Buyer,
    Cap,
    Purchase,
    caps_for,
    check_purchases,
    counting_since,
    hold_caps,
    holds_of,
)
from .caps_postgres import (
    ADVISORY_LOCKS,
    CAPS_OVER,
    advisory_keys,
    again_if_caps_function_gone,
    caps_function_gone,
    caps_function_installed,
    caps_over_args,
)
from .cart import Cart, unknown_sku
from .ledger import lock_caps_of, new_reservation

log = logging.getLogger("stock_locks.stock")


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
        connection = connections[db]
        if len(lines) == 1 and connection.vendor == "postgresql":
            [sku] = lines
            customer = buyer.customer if buyer.caps else ""
            capped = {order_ref: list(buyer.caps)} if buyer.caps else {}
            order = Order(order_ref, lines, strategy, expires_at, customer)
            inserted = self._take_and_record_in_one_statement(db, sku, [order], capped)
            if order_ref not in inserted:  # (a capped refusal's check found its row)
                raise IntegrityError(f"order ref {order_ref!r} has a reservation already")
            pk, created_at = inserted[order_ref]
            return recorded(pk, created_at, order_ref, lines, strategy, retries, expires_at,
                            db, customer)  # fmt: skip

        def write() -> Reservation:
            with transaction.atomic(using=db):
                # The caps, the stock rows, then the reservation's: the order of the
                # one-statement path and of the group commit's batches. (Row first, a
                # duplicate request writing the same ref in a batch deadlocked with it:
                # each waited for a lock the other took first.)
                counted = lock_caps_of(buyer, lines)
                self.take_conditionally(lines)
                return new_reservation(
                    order_ref, lines, strategy, retries, expires_at, buyer, counted=counted
                )

        return again_if_caps_function_gone(db, write)

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
        self,
        db: str,
        sku: str,
        orders: list[Order],
        capped: Mapping[str, Sequence[Cap]] | None = None,
    ) -> dict[str, tuple[int, dt.datetime]]:
        """Reservations whose carts all ask for one SKU, in one statement (a
        data-modifying CTE): one guarded decrement of their sum, and their rows
        inserted only if it took. Returns ``{order ref: (id, created_at)}``; raises
        :class:`OutOfStock` when the sum is not there and ``IntegrityError`` when a
        ref already has a row (nothing written either way).

        With ``capped`` (order ref -> its caps), the decrement's WHERE also calls
        :data:`~stock_locks.stock.caps_postgres.CAPS_OVER`: it locks the (cap, customer) pairs,
        then counts each customer's units, and the units are taken only if no cap
        would pass its max. The hot row stays locked for one statement, as without
        caps, and the count's plan is the function's, made once per connection. When
        that writes nothing, :meth:`_take_and_record_in_one_transaction` names the
        refusal (or writes, if what refused it has changed since)."""
        if capped and not caps_function_installed(db):
            return self._take_and_record_in_one_transaction(db, orders, capped)
        res, table, sku_col, qty_col = self._columns(db)
        total = sum(order.lines[sku] for order in orders)
        insert, returning, rows = _reservation_rows(res, orders)
        guard, guard_params = "", []
        if capped:
            # A subquery: evaluated once, before the row is locked. Called in the WHERE
            # itself, a write that waited for the hot row ran it again on the row's new
            # version while holding the row (PostgreSQL rechecks a waiting UPDATE's WHERE).
            # The (cap, customer) locks it took keep its count right until commit anyway.
            guard = f" AND NOT (SELECT {CAPS_OVER}(%s::bigint[], %s::jsonb))"
            now_ms = int(timezone.now().timestamp() * 1000)
            purchases = [(o.customer, o.lines, capped[o.ref]) for o in orders if o.ref in capped]
            guard_params = caps_over_args(purchases, now_ms)
        sql = (
            f"WITH taken AS (UPDATE {table} SET {qty_col} = {qty_col} - %s "
            f"WHERE {sku_col} = %s AND {qty_col} >= %s{guard} RETURNING 1) "
            f"{insert} CROSS JOIN taken {returning}"
        )
        params: list[Any] = [total, sku, total, *guard_params, *rows]
        connection = connections[db]
        # Autocommit makes the statement its own transaction; inside the caller's
        # transaction a savepoint keeps a duplicate-ref error from aborting it.
        scope = transaction.atomic(using=db) if connection.in_atomic_block else nullcontext()
        try:
            with scope, connection.cursor() as cursor:
                cursor.execute(sql, params)
                inserted = {ref: (pk, created) for ref, pk, created in cursor.fetchall()}
        except ProgrammingError as exc:
            if not (capped and caps_function_gone(db, exc)):
                raise
            return self._take_and_record_in_one_transaction(db, orders, capped)
        if inserted:
            return inserted
        if capped:  # nothing written: the checks one at a time say why
            return self._take_and_record_in_one_transaction(db, orders, capped)
        raise OutOfStock(sku, total, self.level(sku))  # (nothing taken, nothing to undo)

    def take_and_record_many(self, batch: list[Order]) -> dict[str, tuple[int, dt.datetime]]:
        """Several reservations (:class:`Order`), in
        one transaction on PostgreSQL: their RESERVED rows and their units, one
        guarded decrement per SKU for their sum, and their customers' purchase caps
        counted. One commit, and one wait on each hot row, for all of them.

        Carts of one and the same SKU (a flash sale's) are one round trip, and a ref
        that already has a row fails them all (``IntegrityError``). Other batches
        skip such refs, and lock their customers' caps, then take their SKUs in SKU
        order, before inserting rows, as every other write does (no two writes can
        deadlock). Returns ``{order ref: (id, created_at)}`` of the rows inserted.
        Raises :class:`OutOfStock` (or :class:`InvalidQuantity`) when a SKU has less
        than the sum, or CapExceeded when a reservation would pass a cap: nothing is
        written.
        """
        db = router.db_for_write(Reservation)
        skus = {sku for order in batch for sku in order.lines}
        capped = {order.ref: caps_for(order.lines) for order in batch if order.customer}
        capped = {ref: caps for ref, caps in capped.items() if caps}
        one_sku = len(skus) == 1 and all(len(order.lines) == 1 for order in batch)
        connection = connections[db]
        if one_sku and connection.vendor == "postgresql":
            [sku] = skus
            return self._take_and_record_in_one_statement(db, sku, batch, capped)
        return self._take_and_record_in_one_transaction(db, batch, capped)

    def _held_query(
        self, res: dict[str, str], purchases: list[Purchase], now_ms: int
    ) -> tuple[str, list[Any]]:
        """SELECT (customer, lines, created_at) of the purchases' customers'
        reservations holding stock (not released) in the widest window of their caps.
        (``<>``, not ``IN (reserved, committed)``: a planner with stale statistics took
        the status index for it and read every open reservation of the sale.)"""
        sql = (
            f"SELECT {res['customer']}, {res['lines']}, {res['created_at']} FROM {res['table']} "
            f"WHERE {res['customer']} = ANY(%s) AND {res['status']} <> %s"
        )
        params: list[Any] = [
            sorted({customer for customer, _, _ in purchases}),
            Reservation.Status.RELEASED.value,
        ]
        if (since := counting_since(purchases, now_ms)) is not None:
            sql += f" AND {res['created_at']} >= %s"
            params.append(since)
        return sql, params

    def _take_and_record_in_one_transaction(
        self, db: str, batch: list[Order], capped: Mapping[str, Sequence[Cap]]
    ) -> dict[str, tuple[int, dt.datetime]]:
        """:meth:`take_and_record_many` in one transaction, in the order of every other
        write: the caps' locks, the stock rows (SKU order), the customers'
        reservations (read after the locks: a statement sees what was committed
        before it ran), the rows inserted (a ref that has one already is skipped and
        its units go back). The statements go in one query where the connection can
        (:func:`together`), else one at a time; the replies are checked once all are
        in, each refusal named as a write one at a time would; a refusal rolls
        everything back."""
        res, table, sku_col, qty_col = self._columns(db)
        totals = _units(order.lines for order in batch)
        now_ms = int(timezone.now().timestamp() * 1000)
        purchases = [(o.customer, o.lines, capped[o.ref]) for o in batch if o.ref in capped]
        insert, returning, rows = _reservation_rows(res, batch)
        connection = connections[db]
        postgresql = connection.vendor == "postgresql"
        statements: list[tuple[str, list[Any]]] = []
        if purchases and postgresql:
            statements.append((ADVISORY_LOCKS, [advisory_keys(holds_of(purchases))]))
        statements.append((
            f"SELECT {res['order_ref']} FROM {res['table']} WHERE {res['order_ref']} = ANY(%s)",
            [[order.ref for order in batch]],
        ))  # fmt: skip
        statements += [
            (f"UPDATE {table} SET {qty_col} = {qty_col} - %s "
             f"WHERE {sku_col} = %s AND {qty_col} >= %s", [totals[sku], sku, totals[sku]])
            for sku in sorted(totals)
        ]  # fmt: skip
        if purchases:
            statements.append(self._held_query(res, purchases, now_ms))
        statements.append((
            f"{insert} ON CONFLICT ({res['order_ref']}) DO NOTHING {returning}",
            rows,
        ))  # fmt: skip
        with transaction.atomic(using=db):
            if purchases and not postgresql:
                hold_caps(purchases)
            replies = together(connection, statements) if sends_together(connection) else [
                one_at_a_time(connection, sql, params) for sql, params in statements
            ]  # fmt: skip
            if purchases and postgresql:
                replies.pop(0)  # (the locks)
            (_, existing), *takes, (_, written) = replies
            held = takes.pop()[1] if purchases else []
            for sku, (taken, _) in zip(sorted(totals), takes, strict=True):
                if taken == 0:
                    raise self._refusal(sku, totals[sku], None)
            have_rows = {ref for (ref,) in existing}
            pending = [
                (o.customer, o.lines, capped[o.ref])
                for o in batch
                if o.ref in capped and o.ref not in have_rows
            ]
            # (Django has jsonb loaded as text: its fields parse it.)
            bought = [(c, json.loads(lines), made) for c, lines, made in held]
            check_purchases(pending, bought, now_ms)
            inserted = {ref: (pk, created) for ref, pk, created in written}
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
        """In the caller's transaction: ``stock += qty`` per line, in SKU order (a
        reservation's lines come back from jsonb shorter keys first)."""
        for sku in sorted(lines):
            self.objects.filter(**{self.sku: sku}).update(
                **{self.qty: models.F(self.qty) + lines[sku]}
            )

    def in_sku_order(self, rows: models.QuerySet) -> models.QuerySet:
        """``rows`` ordered as ``sorted()`` orders SKUs (code points, the order every
        writer takes rows in): PostgreSQL compares them byte by byte ("C"), not by
        its collation's rules; SQLite does by default."""
        column: Any = models.F(self.sku)
        if connections[rows.db].vendor == "postgresql":
            column = Collate(column, "C")
        return rows.order_by(column)


def together(connection: Any, statements: list[tuple[str, list[Any]]]) -> list[tuple[int, list]]:
    """Run ``statements`` (sql, params) as one query string: one round trip, each
    statement with its own snapshot. Per statement, (rowcount, rows). Only where
    :func:`sends_together` (a cursor that binds parameters itself)."""
    sql = "; ".join(statement for statement, _ in statements)
    params = [param for _, values in statements for param in values]
    replies = []
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        while True:
            rows = cursor.fetchall() if cursor.description is not None else []
            replies.append((cursor.rowcount, rows))
            if not cursor.nextset():
                return replies


def one_at_a_time(connection: Any, sql: str, params: list[Any]) -> tuple[int, list]:
    """(rowcount, rows) of one statement."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount, cursor.fetchall() if cursor.description is not None else []


def sends_together(connection: Any) -> bool:
    """Whether ``connection`` is PostgreSQL through psycopg 3 with client-side binding
    (Django's default): several statements then go in one query, each reply read
    back. (Server-side binding allows one statement per query; psycopg2 returns the
    last reply only.)"""
    if connection.vendor != "postgresql":
        return False
    connection.ensure_connection()
    psycopg = sys.modules.get("psycopg")
    return (
        psycopg is not None
        and isinstance(connection.connection, psycopg.Connection)
        and issubclass(connection.connection.cursor_factory, psycopg.ClientCursor)
    )


def _units(carts: Iterable[Cart]) -> dict[str, int]:
    """The units of every SKU in ``carts``, summed."""
    totals: dict[str, int] = {}
    for lines in carts:
        for sku, qty in lines.items():
            totals[sku] = totals.get(sku, 0) + qty
    return totals


def _reservation_rows(res: dict[str, str], orders: list[Order]) -> tuple[str, str, list[Any]]:
    """The RESERVED rows of ``orders``: an ``INSERT INTO ... SELECT`` of them from one
    jsonb parameter, a RETURNING of (order ref, id, created_at), and the parameters.
    (One parameter for any number of rows: the statement's text and the driver's
    parse of it stay the same from batch to batch, where a VALUES list of six
    parameters a row grew past what psycopg keeps parsed.)"""
    columns = ("order_ref", "lines", "strategy", "status", "customer", "created_at", "updated_at")
    insert = (
        f"INSERT INTO {res['table']} ({', '.join(res[c] for c in columns)}, {res['expires_at']}) "
        "SELECT v.ref, v.lines, v.strategy, %s, v.customer, now(), now(), v.expires_at "
        "FROM jsonb_to_recordset(%s::jsonb) AS v(ref text, lines jsonb, strategy text, "
        "customer text, expires_at timestamptz)"
    )
    returning = f"RETURNING {res['order_ref']}, {res['id']}, {res['created_at']}"
    rows = [
        {"ref": ref, "lines": lines, "strategy": strategy, "customer": customer,
         "expires_at": expires_at.isoformat() if expires_at is not None else None}
        for ref, lines, strategy, expires_at, customer in orders
    ]  # fmt: skip
    return insert, returning, [Reservation.Status.RESERVED.value, json.dumps(rows)]


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
