"""What a fault scenario counts, read from the database (and Redis for drift).

    book = audit("HOT", initial=30, restocked=10)
    assert book.oversold == 0 and book.lost == 0 and book.open == 0

Units of a SKU are conserved: every unit that existed (``initial`` plus what
an admin added) is still in stock, sold (reservation COMMITTED), or held by
an open reservation (RESERVED). ``oversold`` counts units held or in stock
beyond what existed (a write that wiped another's sale, a double put-back),
``lost`` units that vanished (a write that wiped a put-back or a restock).
"""

from __future__ import annotations

from dataclasses import dataclass

from stock_locks.backends.redis import get_redis
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock.table import StockTable

from .waiting import wait_until


@dataclass(frozen=True)
class Book:
    sku: str
    existed: int  # initial + restocked
    stock: int  # the database column now
    committed: int  # units in COMMITTED reservations
    open: int  # units in RESERVED reservations
    released: int  # units in RELEASED reservations (they went back)

    @property
    def held(self) -> int:
        return self.committed + self.open

    @property
    def excess(self) -> int:
        """Units in stock or held beyond what existed (negative: units that vanished)."""
        return self.stock + self.held - self.existed

    @property
    def oversold(self) -> int:
        """Units sold twice: held beyond what existed, or put back in stock while held."""
        return max(0, self.excess)

    @property
    def lost(self) -> int:
        return max(0, -self.excess)

    @property
    def conserved(self) -> bool:
        return self.excess == 0

    def summary(self) -> str:
        return (
            f"{self.sku}: existed {self.existed}, stock {self.stock}, sold {self.committed}, "
            f"open {self.open}, released {self.released}: "
            f"oversold {self.oversold}, lost {self.lost}"
        )


def audit(sku: str, initial: int, restocked: int = 0) -> Book:
    """The book of ``sku``, from the stock column and the reservation rows."""
    stock = StockTable()
    level = stock.level(sku)
    units = {status: 0 for status in Reservation.Status.values}
    for status, lines in Reservation.objects.values_list("status", "lines"):
        units[status] += lines.get(sku, 0)
    return Book(
        sku=sku,
        existed=initial + restocked,
        stock=level,
        committed=units[Reservation.Status.COMMITTED],
        open=units[Reservation.Status.RESERVED],
        released=units[Reservation.Status.RELEASED],
    )


def drift() -> dict[str, int]:
    """SKU -> Redis counter minus database stock, for the SKUs whose loaded counter differs.

    Read here, not through the library's measurement (which nets out work in
    flight): once the system is quiet nothing is in flight, so a counter must
    equal the column, and a unit stuck in Redis shows.
    """
    stock, keys = StockTable(), StockKeys()
    levels = dict(stock.objects.values_list(stock.sku, stock.qty))
    if not levels:
        return {}
    client = get_redis()
    values = client.mget([keys.counter(sku) for sku in levels])
    return {
        sku: int(value) - level
        for (sku, level), value in zip(levels.items(), values, strict=True)
        if value is not None and int(value) != level
    }


def stray_records() -> list[str]:
    """Order refs with a Redis reservation record whose reservation is not open."""
    keys = StockKeys()
    refs = [r.decode() for r in get_redis().zrange(keys.index, 0, -1)]
    still_open = set(
        Reservation.objects.filter(
            order_ref__in=refs, status=Reservation.Status.RESERVED
        ).values_list("order_ref", flat=True)
    )
    return sorted(ref for ref in refs if ref not in still_open)


def open_reservations() -> list[str]:
    return sorted(
        Reservation.objects.filter(status=Reservation.Status.RESERVED).values_list(
            "order_ref", flat=True
        )
    )


def sweep_until_quiet(what: str = "the sweeper to leave nothing open and no drift") -> None:
    """Run the sweeper (as Celery beat would) until no reservation is open and
    Redis agrees with the database. No operator step: no reconcile, no fix."""
    from stock_locks.stock.sweeper import sweep

    last: list = []

    def quiet() -> bool:
        # The graces (30 s, 60 s by default) protect work in flight; the system is quiet now.
        last[:] = [sweep(grace=0, orphan_grace=0)]
        return not open_reservations() and not drift() and not stray_records()

    try:
        wait_until(quiet, interval=0.05, what=what)
    except AssertionError as exc:
        still_open = list(
            Reservation.objects.filter(status=Reservation.Status.RESERVED).values_list(
                "order_ref", "strategy", "expires_at"
            )[:5]
        )
        raise AssertionError(
            f"{exc}: {len(open_reservations())} still open, e.g. {still_open}; "
            f"drift {drift()}; stray Redis records {stray_records()[:5]}; "
            f"last sweep {last[0].as_dict() if last else None}"
        ) from None
