"""Purchase caps: at most N units per customer, decided in the same step as the stock.

A cap is named in ``STOCK_LOCKS["CAPS"]``::

    "CAPS": {
        "kettle-sale": {"skus": ["KETTLE"], "max": 2},                      # for ever
        "mugs-daily": {"skus": ["MUG-RED", "MUG-BLUE"], "max": 4, "period": 86400},
        "black-friday": {"skus": ["TV"], "max": 1, "since": "2026-11-27T00:00:00Z"},
    }

or set per SKU on the stock model: ``STOCK_LOCKS["STOCK_CAP_FIELD"]`` names an
integer field of it (NULL: no cap), counted over ``STOCK_CAP_WINDOW`` (a dict
with ``period`` and/or ``since``, as above; empty: for ever). Such a cap is
named ``sku.<SKU>`` and read again every ``STOCK_CAP_REFRESH`` seconds.

A customer's units under a cap are the units of the cap's SKUs in their
reservations that hold stock (RESERVED or COMMITTED: paid units count, released
or expired ones do not), made at or after the window's start: ``since`` (an
event's start), the last ``period`` seconds (a rolling window), the later of
the two, or for ever. The customer is what the shop names when it reserves
(``reserve(..., customer=...)``): a user id, or for guests a key the shop
chooses (a verified e-mail, a session); a cart touching a capped SKU without
one is refused (:class:`~stock_locks.exceptions.CustomerRequired`).

Where it is decided: the database is the system of record. Every strategy's
database step first locks each (cap, customer) it counts against (PostgreSQL:
advisory locks; elsewhere a :class:`~stock_locks.models.CapHold` row), then
takes the stock rows in SKU order (so two writes never deadlock), counts the
customer's units in the window and refuses with
:class:`~stock_locks.exceptions.CapExceeded` in the same transaction that
takes the stock and inserts the reservation: all or nothing. ``lua`` and
``watch`` also keep each customer's units per cap in Redis (a hash order ref
-> ``units:ms``) and check it in the same script or MULTI that takes the
counters, so a capped refusal never reaches the database; the database still
decides (what Redis lost, it re-learns from the rows).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.apps import apps
from django.db import connections, router
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..conf import settings
from ..exceptions import CapExceeded, CustomerRequired, InvalidQuantity
from ..models import CapHold, Reservation
from .caps_postgres import (
    ADVISORY_LOCKS,
    CAPS_OVER,
    advisory_keys,
    caps_function_installed,
    caps_over_args,
)
from .cart import Cart

MAX_CUSTOMER_LENGTH = 150  # the Reservation.customer column


@dataclass(frozen=True)
class Cap:
    """One configured cap: at most ``max`` units of ``skus`` per customer in the window."""

    name: str
    skus: frozenset[str]
    max: int
    period: int | None = None  # seconds: a rolling window
    since: dt.datetime | None = None  # the window starts no earlier

    @cached_property
    def skus_json(self) -> str:
        """Its SKUs, sorted, as a JSON array."""
        return json.dumps(sorted(self.skus))

    def units(self, lines: Mapping[str, int]) -> int:
        """Units of ``lines`` under this cap."""
        return sum(qty for sku, qty in lines.items() if sku in self.skus)

    def window_start_ms(self, now_ms: int) -> int:
        """Epoch ms from which purchases count (0: for ever), at ``now_ms``."""
        start = int(self.since.timestamp() * 1000) if self.since else 0
        if self.period:
            start = max(start, now_ms - self.period * 1000)
        return start

    def script_args(self) -> list[int]:
        """max, since (ms, 0: none), period (ms, 0: none): the reserve script's view."""
        since = int(self.since.timestamp() * 1000) if self.since else 0
        return [self.max, since, (self.period or 0) * 1000]


@dataclass(frozen=True)
class Buyer:
    """Who a reserve is for, and the caps its cart touches (none: nothing to count)."""

    customer: str = ""
    caps: tuple[Cap, ...] = ()

    def script_args(self, lines: Mapping[str, int]) -> list[int]:
        """Per cap: max, since ms, period ms, the cart's units under it."""
        return [value for cap in self.caps for value in (*cap.script_args(), cap.units(lines))]


NOBODY = Buyer()


def parse_caps(raw: Any) -> dict[str, Cap]:
    """``STOCK_LOCKS["CAPS"]`` as :class:`Cap` objects; ValueError naming what is wrong."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"CAPS must be a dict of cap name -> definition, got {raw!r}")
    caps = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not name or any(c in name for c in "{}: \n"):
            raise ValueError(f"cap name {name!r}: a non-empty string without braces, ':' or spaces")
        if not isinstance(spec, Mapping):
            raise ValueError(f"cap {name!r}: a dict with 'skus' and 'max', got {spec!r}")
        unknown = set(spec) - {"skus", "max", "period", "since"}
        if unknown:
            raise ValueError(f"cap {name!r}: unknown keys {sorted(unknown)}")
        skus, most = spec.get("skus"), spec.get("max")
        if isinstance(skus, str) or not isinstance(skus, Iterable) or not skus:
            raise ValueError(f"cap {name!r}: 'skus' must be a non-empty list of SKUs")
        if not all(isinstance(sku, str) and sku for sku in skus):
            raise ValueError(f"cap {name!r}: every SKU is a non-empty string")
        if isinstance(most, bool) or not isinstance(most, int) or most < 0:
            raise ValueError(f"cap {name!r}: 'max' must be an int >= 0, got {most!r}")
        period = spec.get("period")
        if period is not None and (isinstance(period, bool) or not isinstance(period, int)
                                   or period < 1):  # fmt: skip
            raise ValueError(f"cap {name!r}: 'period' is whole seconds >= 1, got {period!r}")
        since = spec.get("since")
        if since is not None:
            if isinstance(since, str):
                since = parse_datetime(since)
            if not isinstance(since, dt.datetime) or since.tzinfo is None:
                raise ValueError(f"cap {name!r}: 'since' is an aware datetime or ISO 8601 string")
        caps[name] = Cap(name, frozenset(skus), most, period, since)
    return caps


MODEL_CAP_PREFIX = "sku."  # a per-SKU cap read from the stock model: "sku.<SKU>"


class CapBook:
    """The caps in force: ``STOCK_LOCKS["CAPS"]`` and the per-SKU caps of the stock
    model's ``STOCK_CAP_FIELD``, by name and by SKU."""

    def __init__(self, caps: dict[str, Cap]) -> None:
        self.caps = dict(sorted(caps.items()))
        by_sku: dict[str, list[Cap]] = {}
        for cap in self.caps.values():  # (by name: the order of their locks)
            for sku in cap.skus:
                by_sku.setdefault(sku, []).append(cap)
        self.by_sku = {sku: tuple(caps) for sku, caps in by_sku.items()}

    def caps_for(self, lines: Iterable[str]) -> tuple[Cap, ...]:
        skus = tuple(lines)
        if len(skus) == 1:  # (every attempt of a flash sale: no sort, nothing built)
            return self.by_sku.get(skus[0], ())
        touched = {cap.name: cap for sku in skus for cap in self.by_sku.get(sku, ())}
        return tuple(touched[name] for name in sorted(touched))


NO_CAPS: dict[str, Cap] = {}  # (one object: cap_book() keys its cache by identity)
_settings_caps: tuple[int, dict[str, Cap]] | None = None
_model_caps: tuple[float, tuple[Any, ...], dict[str, Cap]] | None = None  # (read at, key, caps)
_book: tuple[tuple[int, int], CapBook] | None = None


def model_caps() -> dict[str, Cap]:
    """The stock model's per-SKU caps (``STOCK_CAP_FIELD``: a row's "at most N per
    customer", NULL for none), over ``STOCK_CAP_WINDOW``; read from the database at
    most every ``STOCK_CAP_REFRESH`` seconds per process (an edit takes effect
    within that). {} when the setting is empty."""
    global _model_caps
    field = settings.STOCK_CAP_FIELD
    if not field:
        return NO_CAPS
    key = (field, settings.STOCK_MODEL, id(settings.STOCK_CAP_WINDOW))  # (the settings' values)
    now = time.monotonic()
    if (
        _model_caps is not None
        and _model_caps[1] == key
        and now - _model_caps[0] < settings.STOCK_CAP_REFRESH
    ):
        return _model_caps[2]
    model = apps.get_model(settings.STOCK_MODEL)
    window = parse_cap_window(settings.STOCK_CAP_WINDOW)
    rows = model._default_manager.exclude(**{f"{field}__isnull": True}).values_list(
        settings.STOCK_SKU_FIELD, field
    )
    caps = {}
    for sku, most in rows:
        name = f"{MODEL_CAP_PREFIX}{sku}"
        caps[name] = Cap(name, frozenset([sku]), max(0, int(most)), window.period, window.since)
    _model_caps = (now, key, caps)
    return caps


def parse_cap_window(raw: Any) -> Cap:
    """``STOCK_CAP_WINDOW`` ({"period": s, "since": ISO 8601}, both optional) as a
    template cap; ValueError naming what is wrong."""
    if not isinstance(raw, Mapping) or set(raw) - {"period", "since"}:
        raise ValueError(f"STOCK_CAP_WINDOW takes 'period' and 'since' only, got {raw!r}")
    return parse_caps({"window": {"skus": ["-"], "max": 0, **raw}})["window"]


def cap_book() -> CapBook:
    """The caps in force (parsed once per value of ``CAPS``; the model's every
    ``STOCK_CAP_REFRESH`` seconds)."""
    global _settings_caps, _book
    raw = settings.CAPS
    if _settings_caps is None or _settings_caps[0] != id(raw):
        _settings_caps = (id(raw), parse_caps(raw))
    from_model = model_caps()
    key = (id(_settings_caps[1]), id(from_model))
    if _book is None or _book[0] != key:
        _book = (key, CapBook({**from_model, **_settings_caps[1]}))
    return _book[1]


def configured_caps() -> dict[str, Cap]:
    """The caps in force by name (``CAPS`` and the stock model's, see :func:`cap_book`)."""
    return cap_book().caps


def caps_for(lines: Iterable[str]) -> tuple[Cap, ...]:
    """The caps that touch any SKU of ``lines``, by name (the order of their locks)."""
    return cap_book().caps_for(lines)


def buyer_of(customer: Any, lines: Cart) -> Buyer:
    """The customer as text with the caps of ``lines`` (nobody when no line is capped:
    an uncapped reservation names no customer); raises CustomerRequired when a line
    is capped and no customer was named, InvalidQuantity for a bad one."""
    caps = caps_for(lines)
    if customer is None or customer == "":
        if caps:
            raise CustomerRequired(
                f"{sorted(caps[0].skus & set(lines))} are capped per customer ({caps[0].name!r}): "
                "reserve with customer=...",
                cap=caps[0].name,
            )
        return Buyer()
    if isinstance(customer, bool) or not isinstance(customer, (str, int)):
        raise InvalidQuantity(f"customer must be a string or an int, got {customer!r}")
    text = str(customer)
    # (Braces would break its Redis keys' hash tag; a control character or a lone
    # surrogate the database's JSON or the group commit's entries.)
    if len(text) > MAX_CUSTOMER_LENGTH or "{" in text or "}" in text or not text.isprintable():
        raise InvalidQuantity(
            f"customer {text[:40]!r}: at most {MAX_CUSTOMER_LENGTH} printable characters, no braces"
        )
    return Buyer(text, caps) if caps else Buyer()  # (no cap: nothing to count it against)


def exceeded(cap: Cap, lines: Mapping[str, int], bought: int) -> CapExceeded:
    """The refusal of ``lines`` under ``cap`` when the customer already holds ``bought``."""
    sku = min(sku for sku in lines if sku in cap.skus)
    return CapExceeded(sku=sku, cap=cap.name, limit=cap.max, bought=bought,
                       requested=cap.units(lines))  # fmt: skip


def cap_entries(entries: Mapping[Any, Any], cap: Cap, now_ms: int) -> tuple[int, list[Any]]:
    """(units in ``cap``'s window, order refs out of it for good) of a usage hash read
    from Redis (order ref -> ``units:ms``), as stock_reserve.lua counts them."""
    start = cap.window_start_ms(now_ms)
    used, gone = 0, []
    for ref, value in entries.items():
        units, _, made = (value.decode() if isinstance(value, bytes) else value).partition(":")
        if int(made) >= start:
            used += int(units)
        else:
            gone.append(ref)
    return used, gone


def _hold(holds: set[tuple[str, str]]) -> None:
    """Lock each (cap, customer) of ``holds`` until the transaction ends, in one order
    every writer shares (no deadlock). PostgreSQL: transaction-level advisory locks
    on a hash of the pair (:func:`advisory_keys`). SQLite serialises writing
    transactions already (the stock row was written first). Elsewhere: the pair's
    CapHold row, created when missing, locked FOR UPDATE."""
    vendor = connections[router.db_for_write(Reservation)].vendor
    if vendor == "sqlite":
        return
    pairs = sorted(holds)
    if vendor == "postgresql":
        with connections[router.db_for_write(Reservation)].cursor() as cursor:
            cursor.execute(ADVISORY_LOCKS, [advisory_keys(holds)])
        return
    CapHold.objects.bulk_create(
        [CapHold(cap=cap, customer=customer) for cap, customer in pairs], ignore_conflicts=True
    )
    list(
        CapHold.objects.select_for_update()
        .filter(cap__in={cap for cap, _ in pairs}, customer__in={c for _, c in pairs})
        .order_by("cap", "customer")
        .values_list("pk", flat=True)
    )


Purchase = tuple[str, Cart, Sequence[Cap]]  # (customer, lines, the caps of the lines)


def holds_of(purchases: list[Purchase]) -> set[tuple[str, str]]:
    """The (cap, customer) pairs ``purchases`` count against."""
    return {(cap.name, customer) for customer, _, caps in purchases for cap in caps}


def counting_since(purchases: list[Purchase], now_ms: int) -> dt.datetime | None:
    """The start of the widest window of the purchases' caps (None: for ever)."""
    earliest = min(cap.window_start_ms(now_ms) for _, _, caps in purchases for cap in caps)
    return dt.datetime.fromtimestamp(earliest / 1000, tz=dt.UTC) if earliest else None


def hold_caps(purchases: list[Purchase]) -> bool:
    """In the caller's transaction, before it takes any stock row: lock each (cap,
    customer) the purchases count against until the transaction ends. Every writer
    locks in this order (caps, stock rows in SKU order, reservation rows), so no two
    can deadlock.

    On PostgreSQL with :data:`CAPS_OVER` (migration 0006) the same statement counts
    them too: returns True when none passes a max. Else (False) the caller counts
    after its stock rows, with :func:`count_in_database` (``held=True``), which
    raises CapExceeded. Raises ProgrammingError when the function went missing
    since it was seen (:func:`~.caps_postgres.caps_function_gone`)."""
    holds = holds_of(purchases)
    if not holds:
        return False
    db = router.db_for_write(Reservation)
    if not caps_function_installed(db):
        _hold(holds)
        return False
    with connections[db].cursor() as cursor:
        cursor.execute(
            f"SELECT {CAPS_OVER}(%s::bigint[], %s::jsonb)",
            caps_over_args(purchases, int(timezone.now().timestamp() * 1000)),
        )
        over = cursor.fetchone()[0]
    # Over: the caller's count after its stock rows names the refusal (or passes, if a
    # release came since), so a sold-out SKU is still told first, as the other paths do.
    return not over


def count_in_database(purchases: list[Purchase], now: dt.datetime, *, held: bool = False) -> None:
    """In the caller's transaction, after its stock rows were taken: count each
    purchase ``(customer, lines, its caps)`` against its customer's caps, in order,
    each with the earlier ones of the list (not inserted yet), and raise CapExceeded
    for the first that passes a max (the caller's transaction rolls back).

    Each (cap, customer) is locked first (``held``: the caller did, with
    :func:`hold_caps`): two transactions of one customer count one after the other
    (the statement after the lock sees what the other committed). Then one query
    reads the customers' reservations holding stock in the widest window."""
    purchases = [p for p in purchases if p[2]]
    if not purchases:
        return
    if not held:
        _hold(holds_of(purchases))
    now_ms = int(now.timestamp() * 1000)
    rows = Reservation.objects.filter(
        customer__in={customer for customer, _, _ in purchases},
        status__in=[Reservation.Status.RESERVED, Reservation.Status.COMMITTED],
    )
    if (since := counting_since(purchases, now_ms)) is not None:
        rows = rows.filter(created_at__gte=since)
    check_purchases(purchases, rows.values_list("customer", "lines", "created_at"), now_ms)


def check_purchases(
    purchases: list[Purchase], rows: Iterable[tuple[str, Cart, dt.datetime]], now_ms: int
) -> None:
    """CapExceeded for the first of ``purchases`` that passes a max, counted with
    ``rows`` (customer, lines, created_at: the customers' reservations holding stock)
    and the earlier purchases of the list."""
    held: dict[str, list[tuple[Cart, int]]] = {}
    for customer, row_lines, created in rows:
        held.setdefault(customer, []).append((row_lines, int(created.timestamp() * 1000)))
    earlier: Counter[tuple[str, str]] = Counter()  # units of the list's earlier purchases
    for customer, lines, caps in purchases:
        for cap in caps:
            start = cap.window_start_ms(now_ms)
            bought = earlier[(cap.name, customer)] + sum(
                cap.units(row_lines) for row_lines, made in held.get(customer, ()) if made >= start
            )
            if bought + cap.units(lines) > cap.max:
                raise exceeded(cap, lines, bought)
        for cap in caps:
            earlier[(cap.name, customer)] += cap.units(lines)


@dataclass(frozen=True)
class Held:
    """A reservation holding stock (open or paid) counted under one cap now."""

    cap: Cap
    customer: str
    ref: str
    units: int
    made_ms: int  # its created_at, epoch ms
    status: str
    strategy: str

    @property
    def entry(self) -> str:
        """Its value in the customer's usage hash in Redis."""
        return f"{self.units}:{self.made_ms}"


def held_under_caps() -> list[Held]:
    """Every reservation with a customer that holds stock and counts under a configured
    cap in that cap's window now, once per such cap (one query)."""
    book = cap_book()
    caps = list(book.caps.values())
    if not caps:
        return []
    now_ms = int(timezone.now().timestamp() * 1000)
    earliest = min(cap.window_start_ms(now_ms) for cap in caps)
    rows = Reservation.objects.exclude(customer="").filter(
        status__in=[Reservation.Status.RESERVED, Reservation.Status.COMMITTED],
        created_at__gte=dt.datetime.fromtimestamp(earliest / 1000, tz=dt.UTC),
    )
    held = []
    for ref, lines, customer, status, strategy, created_at in rows.values_list(
        "order_ref", "lines", "customer", "status", "strategy", "created_at"
    ).iterator():
        made = int(created_at.timestamp() * 1000)
        for cap in book.caps_for(lines):
            units = cap.units(lines)
            if units and made >= cap.window_start_ms(now_ms):
                held.append(Held(cap, customer, ref, units, made, status, strategy))
    return held


def top_buyers(cap: Cap, limit: int = 10) -> list[tuple[str, int]]:
    """The customers holding the most units under ``cap`` in its window now (reservations
    holding stock), most first: (customer, units). On PostgreSQL summed by the database."""
    db = router.db_for_read(Reservation)
    connection = connections[db]
    now_ms = int(timezone.now().timestamp() * 1000)
    rows = (
        Reservation.objects.using(db)
        .order_by()
        .exclude(customer="")
        .filter(
            status__in=[Reservation.Status.RESERVED, Reservation.Status.COMMITTED],
            created_at__gte=dt.datetime.fromtimestamp(
                cap.window_start_ms(now_ms) / 1000, tz=dt.UTC
            ),
        )
    )
    if connection.vendor == "postgresql":
        sql, params = rows.values_list("customer", "lines").query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT held.customer, SUM(line.value::bigint) AS units FROM ({sql}) AS "
                "held(customer, lines), jsonb_each_text(held.lines) AS line "
                "WHERE line.key = ANY(%s) GROUP BY held.customer ORDER BY units DESC, "
                "held.customer LIMIT %s",
                [*params, sorted(cap.skus), limit],
            )
            return [(customer, int(units)) for customer, units in cursor.fetchall()]
    units: Counter[str] = Counter()
    for customer, lines in rows.values_list("customer", "lines").iterator():
        units[customer] += cap.units(lines)
    return sorted(((c, n) for c, n in units.items() if n), key=lambda p: (-p[1], p[0]))[:limit]
