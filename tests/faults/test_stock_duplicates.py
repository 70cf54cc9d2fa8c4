"""Duplicate requests in flight and killed database connections (issue 23, items 1-3).

The same order ref reserved twice at once (a double click, a client retrying on its
timeout with the same Idempotency-Key); a group-commit caller that stopped waiting and
writes its own row while its leader's batch writes it too; a buyer whose database
session is killed between Redis and the database. Real processes on a real
PostgreSQL; the interleavings are forced with a row lock of the test's own and a child
that stops itself at a marker.

What must hold: no deadlock (every write takes the stock rows, in SKU order, before the
reservations' rows), both requests get the same answer (the one row), no unit is given
back in Redis for a row that exists, and a write the database certainly refused gives
its units back at once (Redis equals the database right after).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, connection
from django.test import override_settings

from stock_locks.backends.redis import get_redis
from stock_locks.exceptions import OutOfStock
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.reconcile import load_missing_counters, restore_after_data_loss
from stock_locks.stock.soldout import cache_for
from stock_locks.stock.table import Order, StockTable
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
            [Order(ref, lines, "lua", None) for ref, lines in orders]
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


def reserve_with(strategy: str, ref: str, cart: dict[str, int]) -> Any:  # in a child
    try:
        return get_strategy(strategy).reserve(ref, cart).pk
    except OutOfStock as refusal:
        return f"out of stock: {refusal.available} left"


def test_a_lua_twin_in_a_process_that_saw_its_sku_sold_out_gets_the_same_answer():
    # The first request holds the last unit in Redis and is on its way to the database
    # (another gunicorn worker). This process has just seen the SKU refused to another
    # buyer, so it remembers it sold out; the twin of the first request arrives here.
    Item.objects.create(code="TEA", title="Tea", on_hand=1)
    pause = marker()
    first = Child(reserve_pausing_before_the_database, "twin", {"TEA": 1}, pause)
    wait_stopped(first, pause, "the first request between Redis and the database")
    with override_settings(STOCK_LOCKS=ALONE):
        cache = cache_for(get_redis(), StockKeys().versions)
        assert cache is not None
        wait_until(lambda: cache.ticket() is not None, what="the sold-out listener")
        with pytest.raises(OutOfStock):
            get_strategy("lua").reserve("other", {"TEA": 1})  # remembered sold out here
        answer = reserve("twin", {"TEA": 1})
    first.resume()
    assert first.result() == answer, "the twins were told different things"


def test_a_watch_twin_that_commits_while_its_twin_reads_the_counters_is_found(monkeypatch):
    # watch reads the record and the counters under WATCH, one command at a time. The
    # twin's EXEC (record and decrement of the last unit) lands between them: before,
    # this request saw no record, then a counter at 0, and answered out_of_stock while
    # its twin's order stood (seen over HTTP: tests/demo/faults/test_shop_duplicates.py).
    # The record is read after the counters: short because of a twin, the twin shows.
    import redis.client

    Item.objects.create(code="TEA", title="Tea", on_hand=1)
    restore_after_data_loss()  # Redis ready, TEA's counter loaded: the first read counts
    assert load_missing_counters(["TEA"]) == {"TEA": 1}
    mget = redis.client.Pipeline.mget
    twin: list[Any] = []

    def twin_first(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not twin:  # (the twin's own read passes through)
            twin.append(None)
            with override_settings(STOCK_LOCKS=ALONE):
                twin[0] = get_strategy("watch").reserve("twin", {"TEA": 1}).pk
        return mget(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "mget", twin_first)
    with override_settings(STOCK_LOCKS=ALONE):
        try:
            answer = get_strategy("watch").reserve("twin", {"TEA": 1}).pk
        except OutOfStock as refusal:
            answer = f"out of stock: {refusal.available} left"
    monkeypatch.undo()
    assert twin and twin[0] == Reservation.objects.get(order_ref="twin").pk
    assert answer == twin[0], "the twins were told different things"
    book = audit("TEA", 1)
    assert (book.oversold, book.lost, book.stock) == (0, 0, 0), book.summary()
    assert drift() == {}


@pytest.mark.parametrize("strategy", ["lock", "db_row_lock", "db_conditional"])
def test_two_identical_requests_queued_on_the_last_unit_get_the_same_answer(strategy):
    # The database strategies: the first twin waits on the stock row (held here), the
    # second on the row too (lock: on the first's SKU lock). Let go, the first takes the
    # last unit and writes the row; the second's guarded write then finds none left. It
    # must answer with its twin's row (before: 409 out_of_stock to one, order N to the
    # other; found over HTTP by tests/demo/faults/test_shop_duplicates.py).
    Item.objects.create(code="TEA", title="Tea", on_hand=1)
    with row_locked("TEA"):
        first = Child(reserve_with, strategy, "twin", {"TEA": 1}, env={"PGAPPNAME": "twin-1"})
        wait_until(lambda: waiting_on_a_lock("twin-1"), what="the first twin at the row")
        second = Child(reserve_with, strategy, "twin", {"TEA": 1}, env={"PGAPPNAME": "twin-2"})
        if strategy == "lock":
            wait_until(
                lambda: get_redis().info("clients")["blocked_clients"],
                what="the second twin waiting for the SKU lock (BLPOP)",
            )
        else:
            wait_until(lambda: waiting_on_a_lock("twin-2"), what="the second twin at the row")
    answers = [first.result(), second.result()]
    row = Reservation.objects.get(order_ref="twin")
    assert answers == [row.pk, row.pk], "the twins were told different things"
    book = audit("TEA", 1)
    assert (book.oversold, book.lost, book.stock) == (0, 0, 0), book.summary()


# -- a database outage: killed connections --------------------------------------------------


def _terminate(application_name_like: str) -> int:
    """pg_terminate_backend of the test database's sessions whose name is LIKE the pattern."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s",
            [application_name_like],
        )
        return int(cursor.fetchone()[0])


def test_a_write_refused_by_a_killed_connection_gives_its_units_back_at_once(
    database_through, monkeypatch
):
    # The buyer's database session is killed (an operator, a failover, a pooler) while
    # it is between Redis and the database, and new connections fail for a while (a
    # storm of them). Its write is refused before it is sent (psycopg knows the
    # connection is closed) or answered 57P01: nothing was written, so its units go
    # back in Redis at once. Before, the reserve asked the
    # database again, could not, and left them unsellable until ORPHAN_GRACE and the
    # next sweep (26-29% of a SKU's stock after a storm).
    Item.objects.create(code="TEA", title="Tea", on_hand=3)
    proxy = database_through()
    lua = get_strategy("lua")
    assert lua.reserve("killed-1", {"TEA": 1}).created  # its session open, through the proxy
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    take_and_record = StockTable.take_and_record

    def killed_first(self: StockTable, *args: Any, **kwargs: Any) -> Any:
        with psycopg.connect(  # a connection of the test's own, not through the proxy
            dbname=connection.settings_dict["NAME"], user=connection.settings_dict["USER"],
            host=proxy.target[0], port=proxy.target[1], autocommit=True,
        ) as own:  # fmt: skip
            own.execute("SELECT pg_terminate_backend(%s)", [pid])
            wait_until(
                lambda: own.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
                ).fetchone()[0] == 0,
                what="the buyer's session gone",
            )  # fmt: skip
        proxy.refusing = True
        return take_and_record(self, *args, **kwargs)

    monkeypatch.setattr(StockTable, "take_and_record", killed_first)
    with pytest.raises(DatabaseError):  # (psycopg: "the connection is closed", or 57P01)
        lua.reserve("killed-2", {"TEA": 1})
    monkeypatch.undo()
    proxy.refusing = False  # the storm is over; nothing was swept meanwhile
    connection.close()  # (the test's session was the buyer's: a new one for the checks)
    assert not Reservation.objects.filter(order_ref="killed-2").exists()
    assert drift() == {}, "the killed write's unit is still taken in Redis"
    book = audit("TEA", 3)
    assert (book.oversold, book.lost, book.stock) == (0, 0, 2), book.summary()
    # And it sells now, both units left, with no sweeper run.
    assert lua.reserve("after-1", {"TEA": 1}).created and lua.reserve("after-2", {"TEA": 1})
