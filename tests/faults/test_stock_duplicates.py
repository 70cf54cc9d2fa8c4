"""Duplicate requests in flight (issue 23, items 1 and 2): the same order ref reserved twice
at once (a double click, a client retrying on its timeout with the same Idempotency-Key),
and a group-commit caller that stopped waiting and writes its own row while its leader's
batch writes it too. Real processes on a real PostgreSQL; the interleavings are forced
with a row lock of the test's own and a child that stops itself at a marker.

What must hold: no deadlock (every write takes the stock rows, in SKU order, before the
reservations' rows), both requests get the same answer (the one row), and no unit is
given back in Redis for a row that exists (Redis equals the database right after).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from stock_locks.exceptions import OutOfStock
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.table import StockTable
from tests.inventory.models import Item
from tests.support.fault_processes import Child, marker, stop_here, wait_stopped, waiting_on_a_lock
from tests.support.stock_audit import audit, drift
from tests.support.waiting import wait_until
from tests.test_stock_groupcommit import row_locked

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_child_left")]

ALONE = {**settings.STOCK_LOCKS, "GROUP_COMMIT": False}


def write_alone(ref: str, lines: dict[str, int]) -> str:  # in a child
    """A caller's own write of its reservation (the one-statement path of one SKU)."""
    try:
        StockTable().take_and_record(ref, lines, "lua")
    except Exception as exc:  # the outcome is the test's to judge
        return f"{type(exc).__name__}: {exc}"
    return "written"


def write_batch(orders: list[tuple[str, dict[str, int]]]) -> Any:  # in a child
    """A group commit leader's batch of several SKUs; the refs it inserted."""
    try:
        inserted = StockTable().take_and_record_many(
            [(ref, lines, "lua", None) for ref, lines in orders]
        )
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return sorted(inserted)


def test_a_caller_writing_its_own_row_and_its_leaders_batch_do_not_deadlock():
    # The caller (ref Y, one SKU) stopped waiting for its batch and writes alone; the
    # batch (X of another SKU, and Y) writes at the same time. Before: the batch
    # inserted its rows first, then waited for TEA, which the caller held while it
    # waited for the batch's uncommitted row Y: a deadlock, and PostgreSQL killed one
    # of them after deadlock_timeout (HTTP 500 in the shop, for X's buyer too).
    Item.objects.create(code="TEA", title="Tea", on_hand=10)
    Item.objects.create(code="CUP", title="Cup", on_hand=10)
    with row_locked("TEA"):
        alone = Child(write_alone, "dup-y", {"TEA": 1}, env={"PGAPPNAME": "dup-alone"})
        wait_until(lambda: waiting_on_a_lock("dup-alone"), what="the caller waiting on TEA")
        batch = Child(
            write_batch, [("dup-x", {"CUP": 1}), ("dup-y", {"TEA": 1})],
            env={"PGAPPNAME": "dup-batch"},
        )  # fmt: skip
        wait_until(lambda: waiting_on_a_lock("dup-batch"), what="the batch waiting")
    assert alone.result() == "written"
    assert batch.result() == ["dup-x"]  # Y was the caller's: skipped, its unit given back
    assert sorted(Reservation.objects.values_list("order_ref", flat=True)) == ["dup-x", "dup-y"]
    assert Item.objects.get(code="TEA").on_hand == 9
    assert Item.objects.get(code="CUP").on_hand == 9


def reserve_pausing_before_the_database(ref: str, cart: dict[str, int], pause: Any) -> Any:
    """In a child: the lua reserve of ``ref``, stopped (SIGSTOP) after its Redis step,
    before its database step. The reservation's id, or the refusal."""
    take_and_record = StockTable.take_and_record

    def paused(self: StockTable, *args: Any, **kwargs: Any) -> Any:
        stop_here(pause)
        return take_and_record(self, *args, **kwargs)

    StockTable.take_and_record = paused  # type: ignore[method-assign]
    return reserve(ref, cart)


def reserve(ref: str, cart: dict[str, int]) -> Any:  # in a child
    with override_settings(STOCK_LOCKS=ALONE):
        try:
            return get_strategy("lua").reserve(ref, cart).pk
        except OutOfStock as refusal:
            return f"out of stock: {refusal.available} left"


def test_two_identical_requests_in_flight_get_the_same_answer():
    # The first request takes the last unit in Redis, then stalls before the database;
    # its twin (same order ref) finds the Redis record and writes the row itself, with
    # the last unit. The first then meets "out of stock" in the database: it must answer
    # with its twin's row (before: 409 out_of_stock, and it gave back in Redis the unit
    # of the row its twin wrote, one unit of drift until the sweeper ran).
    Item.objects.create(code="TEA", title="Tea", on_hand=1)
    pause = marker()
    first = Child(reserve_pausing_before_the_database, "twin", {"TEA": 1}, pause)
    wait_stopped(first, pause, "the first request between Redis and the database")
    twin = Child(reserve, "twin", {"TEA": 1})
    answer = twin.result()
    first.resume()
    assert first.result() == answer, "the twins were told different things"
    assert Reservation.objects.get(order_ref="twin").pk == answer
    book = audit("TEA", 1)
    assert (book.oversold, book.lost) == (0, 0), book.summary()
    assert drift() == {}, "a unit of the twin's row was given back in Redis"
