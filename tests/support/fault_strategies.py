"""Stock strategies that stop at a marker, for the fault suite.

The point a paused holder is dangerous at is between what it read and what
it writes: for the ``lock`` strategy, after its SKU lock is granted and the
level read, before the statement that changes the stock column. Where that
statement sits is the library's business (one guarded UPDATE, a fenced
claim then a write, a CTE...), so the pause is not tied to a method name: it
is taken in the database layer, just before this process first sends an
UPDATE that sets the stock model's quantity column. Everything the strategy
does before that (lock grant, fenced claim, reads) has happened.

    strategy = PausingLockStrategy("lock", marker)   # in a child (tests/support/fault_processes)
    strategy.reserve("order-a", {"LAST": 1})         # sets marker, SIGSTOPs itself at the write
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection

from stock_locks.stock.lock import LockStrategy
from stock_locks.stock.table import StockTable

from .fault_processes import stop_here


def _stock_write_pattern() -> re.Pattern:
    stock = StockTable()
    meta = stock.model._meta
    table = re.escape(meta.db_table)
    column = re.escape(meta.get_field(stock.qty).column)
    # UPDATE "inventory_items" SET ... "qty_on_hand" = ... WHERE  (quoted or not, in a CTE or alone)
    return re.compile(
        rf'UPDATE\s+"?{table}"?\s+SET\s+(?:(?!\bWHERE\b).)*?"?{column}"?\s*=', re.S | re.I
    )


@contextmanager
def pause_before_stock_write(marker: Any, after: int = 0) -> Iterator[None]:
    """While active, this thread's statement that writes the stock column after
    ``after`` others did (0: its first) is preceded by :func:`stop_here` (marker
    set, process SIGSTOPped): with ``after=1`` the process stops holding the row
    lock of its first write, before it asks for the next row."""
    pattern = _stock_write_pattern()
    seen = 0

    def wrapper(execute, sql, params, many, context):
        nonlocal seen
        if seen <= after and pattern.search(sql):
            seen += 1
            if seen > after:
                stop_here(marker)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield


class PausingLockStrategy(LockStrategy):
    """The ``lock`` strategy (same name, so its reservation rows are ordinary
    ``lock`` rows) that stops at its first stock write when given a marker."""

    def __init__(self, name: str = "lock", marker: Any = None) -> None:
        super().__init__(name)
        self.marker = marker

    def do_reserve(self, order_ref, lines, *args):
        if self.marker is None:
            return super().do_reserve(order_ref, lines, *args)
        with pause_before_stock_write(self.marker):
            return super().do_reserve(order_ref, lines, *args)
