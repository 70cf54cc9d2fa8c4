"""Purchase caps on PostgreSQL: the (cap, customer) advisory locks, and
``stock_locks_caps_over()`` (migrations 0006 and 0007), which locks and counts in
the statement that takes the stock.

Every writer of a capped reservation locks its (cap, customer) pairs before the
stock rows, in key order: transaction-level advisory locks on a keyed hash of the
pair (:func:`advisory_keys`). The function takes them, then counts in a statement
of its own (a ``VOLATILE`` function's statements each see what was committed
before them), so one customer's writes count one after the other.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from django.db import ProgrammingError, connections, router

from ..models import Reservation

if TYPE_CHECKING:
    from .caps import Cap, Purchase

log = logging.getLogger("stock_locks.stock")
T = TypeVar("T")

ADVISORY_NAMESPACE = b"stock_locks.cap"
# PostgreSQL: the advisory locks of advisory_keys(), in key order, until the transaction ends.
# PostgreSQL (migration 0006): lock the (cap, customer) pairs, then whether any of the
# jsonb limits (customer, skus, max, since, units asked) would pass its max.
CAPS_OVER = "stock_locks_caps_over"
ADVISORY_LOCKS = "SELECT pg_advisory_xact_lock(key) FROM unnest(%s::bigint[]) AS key ORDER BY key"


def advisory_keys(holds: Iterable[tuple[str, str]]) -> str:
    """Signed 64-bit keys of PostgreSQL advisory locks for (cap, customer) pairs, sorted,
    as an array literal for a ``%s::bigint[]`` parameter (psycopg's adaptation of a
    list of ints, which looks at every element, cost more than the rest of a capped
    write's client work). Nothing is written; a collision only serialises two
    customers."""
    keys = set()
    for cap, customer in holds:
        blake = _ADVISORY_HASH.copy()
        blake.update(f"{cap}\0{customer}".encode())
        keys.add(int.from_bytes(blake.digest(), "big", signed=True))
    return "{" + ",".join(map(str, sorted(keys))) + "}"


_ADVISORY_HASH = hashlib.blake2b(digest_size=8, person=ADVISORY_NAMESPACE)


def caps_over_args(purchases: Sequence[Purchase], now_ms: int) -> list[str]:
    """:data:`CAPS_OVER`'s arguments for ``purchases``: the advisory lock keys of their
    (cap, customer) pairs, and per pair (a jsonb array) the customer, the cap's SKUs,
    max and window start, and the units asked. (Written out by hand: it runs in the
    group commit's leader, on every batch's way to the hot row, and ``json.dumps``
    of dicts took 4x as long.)"""
    asked: dict[tuple[str, str], int] = {}  # units per (cap, customer)
    caps: dict[str, Cap] = {}
    for customer, lines, its_caps in purchases:
        for cap in its_caps:
            pair = (cap.name, customer)
            asked[pair] = asked.get(pair, 0) + cap.units(lines)
            caps[cap.name] = cap
    limits = []
    for (name, customer), units in sorted(asked.items()):
        cap = caps[name]
        start = cap.window_start_ms(now_ms)
        since = (
            f'"{dt.datetime.fromtimestamp(start / 1000, tz=dt.UTC).isoformat()}"'
            if start
            else "null"
        )
        limits.append(f'{{"customer":{json.dumps(customer)},"skus":{cap.skus_json},'
                      f'"max":{cap.max},"since":{since},"units":{units}}}')  # fmt: skip
    return [advisory_keys(asked), f"[{','.join(limits)}]"]


# Database alias -> whether it has CAPS_OVER (looked up once per process).
_CAPS_FUNCTION: dict[str, bool] = {}


def caps_function_installed(db: str) -> bool:
    """Whether ``db`` is PostgreSQL with :data:`CAPS_OVER` (migration 0006), looked up
    once per process (a warning when it is not: tests run with ``--nomigrations``?
    Capped writes then lock and count in statements of their own)."""
    if (known := _CAPS_FUNCTION.get(db)) is not None:
        return known
    connection = connections[db]
    installed = False
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT to_regprocedure(%s) IS NOT NULL", [f"{CAPS_OVER}(bigint[],jsonb)"]
            )
            installed = cursor.fetchone()[0]
        if not installed:
            log.warning(
                "database %r has no %s() (migration 0006 not applied: tests run with "
                "--nomigrations?); capped writes in this process take the slower path",
                db, CAPS_OVER,
            )  # fmt: skip
    _CAPS_FUNCTION[db] = installed
    return installed


def caps_function_gone(db: str, exc: Exception) -> bool:
    """Whether ``exc`` (raised on ``db``) says :data:`CAPS_OVER` does not exist: it
    went missing after this process saw it (a migration undone, an older dump
    restored). Then capped writes in this process take the slower path from now on
    (with a warning), and the caller may run its transaction again."""
    cause = exc.__cause__  # (the driver's error behind Django's: psycopg 3 or 2)
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if sqlstate != UNDEFINED_FUNCTION or CAPS_OVER not in str(exc):
        return False
    log.warning("database %r: %s() has gone; capped writes take the slower path", db, CAPS_OVER)
    _CAPS_FUNCTION[db] = False
    return True


UNDEFINED_FUNCTION = "42883"  # PostgreSQL's SQLSTATE


def again_if_caps_function_gone(db: str, write: Callable[[], T]) -> T:
    """``write()`` (a transaction on ``db`` that calls :data:`CAPS_OVER` first), and
    once more on the slower path if the function had gone (its transaction rolled
    back: nothing was written)."""
    try:
        return write()
    except ProgrammingError as exc:
        if not caps_function_gone(db, exc):
            raise
        return write()


def prepare_caps_function() -> None:
    """Where :data:`CAPS_OVER` is installed: call it once on this process's connection
    with nothing to lock or count, so that its first capped write does not compile
    and plan it (a few ms on a new connection; PL/pgSQL keeps both per connection).
    Nothing is locked or written; a function gone since it was seen is noted
    (:func:`caps_function_gone`). Raises the database's other errors."""
    db = router.db_for_write(Reservation)

    def call() -> None:
        if caps_function_installed(db):
            with connections[db].cursor() as cursor:
                cursor.execute(f"SELECT {CAPS_OVER}('{{}}'::bigint[], '[]'::jsonb)")

    again_if_caps_function_gone(db, call)
