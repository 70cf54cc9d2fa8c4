"""Group commit under faults: the leader of a batch is killed (SIGKILL) while its
transaction waits in PostgreSQL, and its database session then either finishes
the batch without it or is cut too. The callers of that batch stop waiting at
their deadline and write their own: every unit is sold once, whatever the
dead leader's transaction did, and the lead does not stay with the dead.
"""

from __future__ import annotations

import pytest

from stock_locks.backends.redis import get_redis
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.groupcommit import Confirmation
from tests.inventory.models import Item
from tests.support.fault_processes import Child, marker, waiting_on_a_lock
from tests.support.stock_audit import audit, sweep_until_quiet
from tests.support.waiting import TIMEOUT, wait_until
from tests.test_stock_groupcommit import BUYERS, buy, queued, row_locked

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_child_left")]

WAIT = 2.0  # GROUP_COMMIT_WAIT of the buyers, seconds


def buy_when_told(ref: str, cart: dict[str, int], wait: float, ready, go):  # in a child
    """``buy``, once every buyer is set up: a process spawned on a loaded machine can
    take longer than WAIT to start, and the first queued would stop waiting before
    the last arrived."""
    ready.set()
    assert go.wait(TIMEOUT), "not told to buy"
    return buy(ref, cart, wait)


@pytest.mark.parametrize("its_session", ["finishes", "is cut"])
def test_the_leader_of_a_batch_dies_while_the_database_writes_it(its_session):
    Item.objects.create(code="HOT", title="hot", on_hand=10)
    with row_locked("HOT") as locked:
        go, ready = marker(), [marker() for _ in range(BUYERS)]
        children = {
            f"gc-{i}": Child(buy_when_told, f"gc-{i}", {"HOT": 1}, WAIT, ready[i], go,
                             env={"PGAPPNAME": f"gc-{i}"})
            for i in range(BUYERS)
        }  # fmt: skip
        wait_until(lambda: all(event.is_set() for event in ready), what="buyers set up")
        go.set()
        wait_until(lambda: queued() == BUYERS - 1, what="every buyer but one queued")
        entries = get_redis().lrange(StockKeys().confirm_queue, 0, -1)
        leader, blocked, *_ = [Confirmation.decode(entry).order_ref for entry in entries]
        # A row of the test's own for one of the batch's refs, uncommitted: the batch's
        # INSERT waits on it. The first buyer's row lock goes: it writes alone and hands
        # the batch to the head of the queue, whose transaction then waits.
        locked.rollback()
        locked.execute(
            f'INSERT INTO "{Reservation._meta.db_table}" (order_ref, lines, strategy, status, '
            "created_at, updated_at) VALUES (%s, '{}', 'lua', 'RELEASED', now(), now())",
            [blocked],
        )
        wait_until(lambda: waiting_on_a_lock(leader), what="the batch waiting in PostgreSQL")
        children.pop(leader).kill()
        if its_session == "is cut":
            locked.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                [leader],
            )
    # (the test's row went with its connection: rolled back)

    outcomes = {ref: child.result() for ref, child in children.items()}
    # Each was created by this call: by the batch it stopped waiting for, or by its own
    # write (created, so its expiry is scheduled).
    assert all(outcome == ("sold", True) for outcome in outcomes.values()), outcomes
    refs = list(Reservation.objects.filter(order_ref__startswith="gc-").values_list(
        "order_ref", flat=True))  # fmt: skip
    assert sorted(refs) == sorted([*outcomes, *([leader] if its_session == "finishes" else [])])
    book = audit("HOT", 10)
    assert book.conserved and book.stock == 10 - len(refs), book.summary()

    # The lead did not stay with the dead: a new buyer is answered, and once every
    # order is cancelled the sweeper finds Redis and the database in agreement (the
    # dead leader's units, taken in Redis and never written, come back).
    lua = get_strategy("lua")
    assert lua.reserve("gc-late", {"HOT": 1}).created
    for ref in [*refs, "gc-late"]:
        lua.release(ref)
    sweep_until_quiet()
    assert audit("HOT", 10).stock == 10
    assert queued() == 0
