"""Every writer takes the stock rows of a cart in one order, so two carts never deadlock.

A cart's SKUs are kept in SKU order (``cart.normalize_cart``), and every strategy
writes, or locks, its rows in that order. Two paths did not:

- A release (an unpaid order expiring, a cancel) put the units back in the
  order of the reservation's ``lines`` as PostgreSQL's jsonb returns them:
  shorter keys first, so ``B10`` before ``A100``.
- ``db_row_lock`` locked the rows with ``SELECT ... FOR UPDATE`` in primary-key
  order.

A writer in SKU order and one in the other order, each holding its first row
and asking for the other's, is a deadlock: PostgreSQL aborts one of them
after ``deadlock_timeout`` (a buyer's error, or an expiry to run again). Here
the first writer stops itself (SIGSTOP) holding the row lock of its first
write; the second starts and waits on a row lock; the first resumes. Both
must finish, and the units add up in the database.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.fault_processes import (
    Child,
    marker,
    wait_paused_blocked_or_done,
    wait_stopped,
)
from tests.support.fault_strategies import pause_before_stock_write
from tests.support.stock_audit import audit

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]

# jsonb orders keys by length first: B10 comes out before A100, SKU order is A100, B10.
# B10 is created first, so primary-key order is B10, A100 too.
SKUS = ("B10", "A100")
CART = {"A100": 1, "B10": 1}
INITIAL = 5


def _release(order_ref: str, pause) -> bool:
    """Release ``order_ref`` (db_conditional), stopping after its first stock write."""
    with pause_before_stock_write(pause, after=1):
        return get_strategy("db_conditional").release(order_ref)


def _reserve(strategy: str, order_ref: str, pause) -> str:
    """Reserve the cart with ``strategy``; with ``pause``, stop after the first stock write."""
    with pause_before_stock_write(pause, after=1) if pause else nullcontext():
        get_strategy(strategy).reserve(order_ref, CART)
    return "reserved"


def stock_rows() -> None:
    for sku in SKUS:
        Item.objects.create(code=sku, title=sku, on_hand=INITIAL)


def books() -> list[str]:
    """The books of the SKUs whose units do not add up."""
    return [book.summary() for book in (audit(sku, INITIAL) for sku in SKUS) if not book.conserved]


def test_a_release_puts_units_back_in_sku_order_beside_a_buyer_of_the_same_cart():
    stock_rows()
    get_strategy("db_conditional").reserve("unpaid", CART)
    pause = marker()
    releasing = Child(_release, "unpaid", pause, env={"PGAPPNAME": "faults-release"})
    wait_stopped(releasing, pause, "the release to stop after its first row")
    buying = Child(_reserve, "db_conditional", "buyer", None, env={"PGAPPNAME": "faults-buy"})
    state = wait_paused_blocked_or_done(
        buying, marker(), "faults-buy", "the buyer to wait on the release's row"
    )
    assert state == "blocked", state  # (both rows are in the cart: it needs the held one)
    releasing.resume()
    assert (releasing.result(), buying.result()) == (True, "reserved")
    assert books() == []
    assert [audit(sku, INITIAL).stock for sku in SKUS] == [INITIAL - 1, INITIAL - 1]


@pytest.mark.parametrize("locker", ["db_row_lock", "db_conditional"])
def test_a_buyer_takes_the_cart_rows_in_sku_order_while_another_holds_its_first(locker):
    stock_rows()
    pause = marker()
    first = Child(_reserve, "db_conditional", "first", pause, env={"PGAPPNAME": "faults-first"})
    wait_stopped(first, pause, "the first buyer to stop after its first row")
    second = Child(_reserve, locker, "second", None, env={"PGAPPNAME": "faults-second"})
    state = wait_paused_blocked_or_done(
        second, marker(), "faults-second", "the second buyer to wait on the first's row"
    )
    assert state == "blocked", state
    first.resume()
    assert (first.result(), second.result()) == ("reserved", "reserved")
    assert books() == []
    assert [audit(sku, INITIAL).stock for sku in SKUS] == [INITIAL - 2, INITIAL - 2]
