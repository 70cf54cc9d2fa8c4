"""Purchase caps: at most N units per customer, decided in the same step as the stock,
by every strategy, across processes (stock_locks.stock.caps)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from django.utils import timezone

from stock_locks.exceptions import CapExceeded, CustomerRequired, InvalidQuantity, OutOfStock
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy, strategy_names
from stock_locks.stock.caps import buyer_of, parse_caps
from stock_locks.stock.reconcile import stock_report
from stock_locks.stock.table import Order, StockTable
from tests.inventory.models import Item
from tests.support.processes import run_in_processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

KETTLES = {"kettles": {"skus": ["CAP-KETTLE"], "max": 2}}


@contextmanager
def caps(defined: dict) -> Iterator[None]:
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "CAPS": defined}):
        yield


def items(**on_hand: int) -> None:
    for code, units in on_hand.items():
        Item.objects.create(code=code.replace("_", "-"), title=code, on_hand=units)


def units_of(customer: str) -> int:
    rows = Reservation.objects.filter(customer=customer).exclude(status="released")
    return sum(sum(row.lines.values()) for row in rows)


@pytest.mark.parametrize("name", strategy_names())
def test_the_cap_refuses_the_cart_that_would_pass_it_and_moves_nothing(name):
    items(CAP_KETTLE=10, CAP_MUG=10)
    strategy = get_strategy(name)
    with caps(KETTLES):
        strategy.reserve("a-1", {"CAP-KETTLE": 1}, customer="ann")
        with pytest.raises(CapExceeded) as refused:
            strategy.reserve("a-2", {"CAP-KETTLE": 2, "CAP-MUG": 1}, customer="ann")
        assert (refused.value.sku, refused.value.cap, refused.value.limit) == (
            "CAP-KETTLE", "kettles", 2
        )  # fmt: skip
        assert (refused.value.bought, refused.value.requested) == (1, 2)
        # All or nothing: neither line moved, in the database or in Redis.
        assert Item.objects.get(code="CAP-MUG").on_hand == 10
        assert Item.objects.get(code="CAP-KETTLE").on_hand == 9
        assert not Reservation.objects.filter(order_ref="a-2").exists()
        assert all(row.drift == 0 for row in stock_report())
        # Within the cap, and for another customer, it sells.
        strategy.reserve("a-3", {"CAP-KETTLE": 1, "CAP-MUG": 3}, customer="ann")
        strategy.reserve("b-1", {"CAP-KETTLE": 2}, customer="bob")
        assert (units_of("ann"), Item.objects.get(code="CAP-KETTLE").on_hand) == (5, 6)
        # A retry of an order that stands answers it; it does not count twice.
        again = strategy.reserve("a-3", {"CAP-KETTLE": 1, "CAP-MUG": 3}, customer="ann")
        assert again.created is False


@pytest.mark.parametrize("name", strategy_names())
def test_a_release_gives_the_allowance_back_once_and_a_payment_keeps_it(name):
    items(CAP_KETTLE=10)
    strategy = get_strategy(name)
    with caps(KETTLES):
        strategy.reserve("r-1", {"CAP-KETTLE": 2}, customer="cy")
        strategy.release("r-1")
        strategy.release("r-1")  # a repeat gives nothing back twice
        strategy.reserve("r-2", {"CAP-KETTLE": 1}, customer="cy")
        strategy.commit("r-2")
        strategy.reserve("r-3", {"CAP-KETTLE": 1}, customer="cy")
        with pytest.raises(CapExceeded):
            strategy.reserve("r-4", {"CAP-KETTLE": 1}, customer="cy")
    assert units_of("cy") == 2


def test_a_capped_line_needs_a_customer_and_bad_ones_are_refused():
    items(CAP_KETTLE=10, CAP_MUG=10)
    lua = get_strategy("lua")
    with caps(KETTLES):
        with pytest.raises(CustomerRequired):
            lua.reserve("n-1", {"CAP-KETTLE": 1})
        for bad in ["x" * 151, "a{b}", "a\nb", "nul\x00", "tab\t", "\ud800", True, 1.5]:
            with pytest.raises(InvalidQuantity):
                lua.reserve("n-2", {"CAP-KETTLE": 1}, customer=bad)
        lua.reserve("n-3", {"CAP-MUG": 1})  # an uncapped cart needs none
        lua.reserve("n-4", {"CAP-KETTLE": 1}, customer=42)  # a user id
    assert Reservation.objects.get(order_ref="n-4").customer == "42"
    assert Item.objects.get(code="CAP-KETTLE").on_hand == 9


def test_a_group_of_skus_shares_one_cap_and_a_rolling_window_frees_it():
    items(CAP_RED=10, CAP_BLUE=10)
    mugs = {"mugs": {"skus": ["CAP-RED", "CAP-BLUE"], "max": 3, "period": 2}}
    lua, db = get_strategy("lua"), get_strategy("db_conditional")
    with caps(mugs):
        lua.reserve("g-1", {"CAP-RED": 2}, customer="di")
        with pytest.raises(CapExceeded):
            db.reserve("g-2", {"CAP-BLUE": 2}, customer="di")  # across strategies too
        db.reserve("g-3", {"CAP-BLUE": 1}, customer="di")

        def allowed_again():  # two seconds after g-1 and g-3, the window has moved on
            try:
                return lua.reserve("g-4", {"CAP-RED": 3}, customer="di")
            except CapExceeded:
                return None

        wait_until(allowed_again, timeout=10, interval=0.2, what="the window to move on")


def test_a_cap_from_an_event_start_counts_nothing_bought_before_it():
    items(CAP_TV=10)
    lua = get_strategy("lua")
    lua.reserve("e-0", {"CAP-TV": 1}, customer="ed")  # before the event was capped
    start = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with caps({"friday": {"skus": ["CAP-TV"], "max": 1, "since": start.isoformat()}}):
        lua.reserve("e-1", {"CAP-TV": 1}, customer="ed")
        with pytest.raises(CapExceeded):
            lua.reserve("e-2", {"CAP-TV": 1}, customer="ed")


@contextmanager
def model_caps(**extra: object) -> Iterator[None]:
    """Caps read from the stock model's ``per_customer`` (read again at every reserve)."""
    stock_locks = {**settings.STOCK_LOCKS, "STOCK_CAP_FIELD": "per_customer",
                   "STOCK_CAP_REFRESH": 0, **extra}  # fmt: skip
    with override_settings(STOCK_LOCKS=stock_locks):
        yield


@pytest.mark.parametrize("name", strategy_names())
def test_a_cap_set_on_the_stock_model_holds_in_every_strategy(name):
    Item.objects.create(code="CAP-MUG", title="mug", on_hand=10, per_customer=1)
    Item.objects.create(code="CAP-SPOON", title="spoon", on_hand=10)  # NULL: no cap
    strategy = get_strategy(name)
    with model_caps():
        strategy.reserve("m-1", {"CAP-MUG": 1}, customer="ann")
        with pytest.raises(CapExceeded) as refused:
            strategy.reserve("m-2", {"CAP-MUG": 1, "CAP-SPOON": 1}, customer="ann")
        assert (refused.value.cap, refused.value.limit, refused.value.bought) == (
            "sku.CAP-MUG", 1, 1,
        )  # fmt: skip
        strategy.reserve("m-3", {"CAP-SPOON": 3}, customer="ann")  # uncapped
        strategy.reserve("m-4", {"CAP-MUG": 1}, customer="bob")
        Item.objects.filter(code="CAP-MUG").update(per_customer=2)  # an edit: in force
        strategy.reserve("m-5", {"CAP-MUG": 1}, customer="ann")
        with pytest.raises(CapExceeded):
            strategy.reserve("m-6", {"CAP-MUG": 1}, customer="ann")
    assert units_of("ann") == 2  # the mugs: an uncapped cart names no customer
    assert Item.objects.get(code="CAP-MUG").on_hand == 7


def test_the_stock_models_caps_count_over_their_window_and_on_the_event_loop():
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    Item.objects.create(code="CAP-MUG", title="mug", on_hand=10, per_customer=1)
    lua = get_strategy("lua")
    lua.reserve("w-0", {"CAP-MUG": 1}, customer="cy")  # before the window
    since = (dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=5)).isoformat()
    wait_until(lambda: dt.datetime.now(dt.UTC).isoformat() > since, what="the window")

    async def sale() -> list:
        outcomes = []
        for ref in ["w-1", "w-2"]:
            try:
                await lua.areserve(ref, {"CAP-MUG": 1}, customer="cy")
                outcomes.append("reserved")
            except CapExceeded:
                outcomes.append("capped")
        await sync_to_async(connections.close_all)()
        return outcomes

    with model_caps(STOCK_CAP_WINDOW={"since": since}):
        assert asyncio.run(sale()) == ["reserved", "capped"]


@pytest.mark.parametrize(
    "field, window, complaint",
    [("nope", {}, "nope"), ("title", {}, "integer field"), ("per_customer", {"per": 3}, "WINDOW")],
)
def test_a_bad_stock_model_cap_setting_is_a_check_error(field, window, complaint):
    stock_locks = {**settings.STOCK_LOCKS, "STOCK_CAP_FIELD": field, "STOCK_CAP_WINDOW": window}
    with (
        override_settings(STOCK_LOCKS=stock_locks),
        pytest.raises(SystemCheckError, match=complaint),
    ):
        call_command("check")


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"c": {"skus": "KETTLE", "max": 1}},
        {"c": {"skus": ["K"], "max": -1}},
        {"c": {"skus": ["K"], "max": 1, "period": 0}},
        {"c": {"skus": ["K"], "max": 1, "since": "yesterday"}},
        {"c": {"skus": ["K"], "max": 1, "per": 3}},
        {"a:b": {"skus": ["K"], "max": 1}},
    ],
)
def test_a_malformed_cap_is_a_check_error(bad):
    with pytest.raises(ValueError):
        parse_caps(bad)
    with caps(bad), pytest.raises(SystemCheckError, match="CAPS"):
        call_command("check")


def test_redis_restarted_empty_learns_the_usage_back_from_the_database(redis_client):
    items(CAP_KETTLE=10)
    lua = get_strategy("lua")
    with caps(KETTLES):
        lua.reserve("w-1", {"CAP-KETTLE": 1}, customer="flo")
        lua.commit("w-1")
        lua.reserve("w-2", {"CAP-KETTLE": 1}, customer="flo")
        redis_client.flushall()
        with pytest.raises(CapExceeded) as refused:
            lua.reserve("w-3", {"CAP-KETTLE": 1}, customer="flo")
        assert refused.value.bought == 2
        usage = redis_client.hgetall(StockKeys().cap_usage("kettles", "flo"))
        assert sorted(usage) == [b"w-1", b"w-2"]  # rebuilt, refused in Redis
        lua.release("w-2")
        lua.reserve("w-4", {"CAP-KETTLE": 1}, customer="flo")
    assert units_of("flo") == 2 and all(row.drift == 0 for row in stock_report())


@pytest.mark.parametrize("name", ["lua", "watch"])
def test_a_redis_that_forgot_the_usage_is_overruled_by_the_database(name, redis_client):
    """An older snapshot (the marker kept, a customer's usage lost): Redis says yes,
    the database counts the rows and refuses, and what Redis took goes back."""
    items(CAP_KETTLE=10)
    strategy = get_strategy(name)
    with caps(KETTLES):
        strategy.reserve("o-1", {"CAP-KETTLE": 2}, customer="gus")
        redis_client.delete(StockKeys().cap_usage("kettles", "gus"))
        with pytest.raises(CapExceeded) as refused:
            strategy.reserve("o-2", {"CAP-KETTLE": 1}, customer="gus")
        assert refused.value.bought == 2
        assert not redis_client.exists(StockKeys().record("o-2"))
        assert not redis_client.hexists(StockKeys().cap_usage("kettles", "gus"), "o-2")
        assert all(row.drift == 0 for row in stock_report())
    assert Item.objects.get(code="CAP-KETTLE").on_hand == 8


# -- many processes -------------------------------------------------------------------


def one_customer_buys(index: int, name: str, attempts: int, defined: dict) -> Counter:
    """Runs in a child: ``attempts`` single-unit orders by customer "zoe"."""
    outcome: Counter = Counter()
    strategy = get_strategy(name)
    with caps(defined):
        for n in range(attempts):
            try:
                strategy.reserve(f"{name}-{index}-{n}", {"CAP-KETTLE": 1}, customer="zoe")
                outcome["sold"] += 1
            except CapExceeded:
                outcome["capped"] += 1
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("name", strategy_names())
def test_a_thousand_attempts_of_one_customer_from_four_processes_get_exactly_the_cap(name):
    items(CAP_KETTLE=5000)
    defined = {"kettles": {"skus": ["CAP-KETTLE"], "max": 7}}
    results = run_in_processes(one_customer_buys, 4, name, 250, defined)
    total = sum(results, Counter())
    assert total["sold"] == 7 and total["capped"] == 993
    assert units_of("zoe") == 7
    assert Item.objects.get(code="CAP-KETTLE").on_hand == 5000 - 7
    with caps(defined):
        assert all(row.drift == 0 for row in stock_report())


def one_customer_writes_the_table(index: int, attempts: int, defined: dict, batch: int) -> Counter:
    """Runs in a child: ``attempts`` writes of customer "zoe"'s single-unit orders
    straight to the stock table, ``batch`` orders a write (a group commit's), of two
    SKUs in turn (two stock rows: their locks do not order the two)."""
    outcome: Counter = Counter()
    table = StockTable()
    with caps(defined):
        for n in range(attempts):
            lines = {("CAP-MUG-RED", "CAP-MUG-BLUE")[(index + n) % 2]: 1}
            try:
                if batch == 1:
                    table.take_and_record(
                        f"db-{index}-{n}", lines, "lua", buyer=buyer_of("zoe", lines)
                    )
                else:
                    orders = [
                        Order(f"db-{index}-{n}-{k}", lines, "lua", None, "zoe")
                        for k in range(batch)
                    ]
                    table.take_and_record_many(orders)
                outcome["sold"] += batch
            except CapExceeded:
                outcome["capped"] += 1
    return outcome


@pytest.mark.parametrize("batch, most", [(1, 7), (2, 8)])
def test_the_database_alone_holds_the_cap_against_writes_from_four_processes(batch, most):
    """No Redis in front: the database's capped write (one statement on PostgreSQL,
    the (cap, customer) locks taken in its stock decrement) decides alone."""
    items(CAP_MUG_RED=5000, CAP_MUG_BLUE=5000)
    defined = {"mugs": {"skus": ["CAP-MUG-RED", "CAP-MUG-BLUE"], "max": most}}
    results = run_in_processes(one_customer_writes_the_table, 4, 60, defined, batch)
    total = sum(results, Counter())
    assert total["sold"] == most and total["capped"] == 4 * 60 - most // batch
    assert units_of("zoe") == most
    left = Item.objects.filter(code__startswith="CAP-MUG").values_list("on_hand", flat=True)
    assert sum(left) == 2 * 5000 - most


@pytest.mark.parametrize("seen", [False, True], ids=["missing", "gone-after-seen"])
def test_a_database_without_the_caps_function_still_holds_the_cap(caplog, seen):
    """Tests run with --nomigrations have no stock_locks_caps_over(); a migration
    undone or an older dump restored takes it away from running processes. Capped
    writes then take the statements one at a time, with a warning, and still hold."""
    from django.db import connection

    from stock_locks.stock import caps_postgres as stock_caps

    items(CAP_KETTLE=10, CAP_MUG=10)
    lines = {"CAP-KETTLE": 1}
    stock_caps._CAPS_FUNCTION.clear()
    if seen:
        assert stock_caps.caps_function_installed("default")
    with connection.cursor() as cursor:
        cursor.execute("ALTER FUNCTION stock_locks_caps_over(bigint[], jsonb) RENAME TO hidden")
    try:
        with caps(KETTLES):
            table = StockTable()
            for n in range(2):
                table.take_and_record(f"nf-{n}", lines, "lua", buyer=buyer_of("ivy", lines))
            with pytest.raises(CapExceeded):
                table.take_and_record("nf-2", lines, "lua", buyer=buyer_of("ivy", lines))
            get_strategy("db_conditional").reserve("nf-3", lines, customer="jo")
            with pytest.raises(CapExceeded):
                get_strategy("db_conditional").reserve("nf-4", {"CAP-KETTLE": 2}, customer="jo")
            two = {"CAP-KETTLE": 1, "CAP-MUG": 1}  # (a cart of two lines: a transaction)
            table.take_and_record("nf-5", two, "lua", buyer=buyer_of("kim", two))
            with pytest.raises(CapExceeded):
                table.take_and_record("nf-6", {"CAP-KETTLE": 2}, "lua", buyer=buyer_of("kim", two))
        assert stock_caps._CAPS_FUNCTION == {"default": False}
    finally:
        stock_caps._CAPS_FUNCTION.clear()
        with connection.cursor() as cursor:
            cursor.execute("ALTER FUNCTION hidden(bigint[], jsonb) RENAME TO stock_locks_caps_over")
    assert (units_of("ivy"), units_of("jo"), units_of("kim")) == (2, 1, 2)  # (kim: and a mug)
    assert Item.objects.get(code="CAP-KETTLE").on_hand == 6
    assert "stock_locks_caps_over()" in caplog.text


@pytest.mark.parametrize("name", strategy_names())
def test_a_customer_at_the_cap_is_told_sold_out_first_by_every_strategy(name):
    """The stock is checked before the cap everywhere (Redis's scripts, the database's
    statements): a customer at the cap asking for a sold-out SKU hears OutOfStock."""
    items(CAP_KETTLE=3)
    strategy = get_strategy(name)
    with caps(KETTLES):
        strategy.reserve("p-1", {"CAP-KETTLE": 2}, customer="pat")
        strategy.reserve("p-2", {"CAP-KETTLE": 1}, customer="quin")
        with pytest.raises(OutOfStock):
            strategy.reserve("p-3", {"CAP-KETTLE": 1}, customer="pat")
        strategy.release("p-2")
        with pytest.raises(CapExceeded):  # (within the stock, the cap still refuses)
            strategy.reserve("p-4", {"CAP-KETTLE": 1}, customer="pat")
    assert units_of("pat") == 2 and Item.objects.get(code="CAP-KETTLE").on_hand == 1


def test_the_caps_function_counts_the_groups_skus_in_the_window_and_skips_released_rows():
    """stock_locks_caps_over() with the arguments a capped write builds: the units of
    every SKU of the group the customer holds in the window, nothing else."""
    from django.db import connection

    from stock_locks.stock.caps_postgres import CAPS_OVER, caps_over_args

    items(CAP_RED=10, CAP_BLUE=10, CAP_TEA=10)
    mugs = {"mugs": {"skus": ["CAP-RED", "CAP-BLUE"], "max": 3}}
    with caps(mugs):
        table = StockTable()
        for ref, lines in [("f-0", {"CAP-RED": 3}), ("f-1", {"CAP-RED": 1}),
                           ("f-2", {"CAP-BLUE": 1}), ("f-3", {"CAP-TEA": 5})]:  # fmt: skip
            if ref == "f-1":
                Reservation.objects.filter(order_ref="f-0").update(status="released")
            table.take_and_record(ref, lines, "lua", buyer=buyer_of("fay", lines))

        def over(units: int) -> bool:
            lines = {"CAP-BLUE": units}
            purchase = ("fay", lines, buyer_of("fay", lines).caps)
            now_ms = int(timezone.now().timestamp() * 1000)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT {CAPS_OVER}(%s::bigint[], %s::jsonb)",
                    caps_over_args([purchase], now_ms),
                )
                return cursor.fetchone()[0]

        assert [over(1), over(2)] == [False, True]  # holds 2 of the group (tea, released: 0)
        Reservation.objects.filter(order_ref="f-2").update(
            created_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        )
    with caps({"mugs": {**mugs["mugs"], "period": 3600}}):
        assert [over(2), over(3)] == [False, True]  # f-2 fell out of the hour


def test_warm_up_prepares_the_capped_write_without_locking_or_writing_anything():
    """A strategy's warm_up() calls the caps function once on its connection (so the
    first capped write does not compile it: a call that finds it gone since it was
    seen notes that); with the function missing it is quiet."""
    from django.db import connection

    from stock_locks.stock import caps_postgres as stock_caps

    stock_caps._CAPS_FUNCTION.clear()
    with caps(KETTLES):
        get_strategy("db_conditional").warm_up()
        assert stock_caps._CAPS_FUNCTION == {"default": True}
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks "
                "WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            )
            assert cursor.fetchone()[0] == 0
            assert not connection.in_atomic_block
            cursor.execute("ALTER FUNCTION stock_locks_caps_over(bigint[], jsonb) RENAME TO hidden")
        try:
            get_strategy("db_conditional").warm_up()  # (it calls the function: gone)
            assert stock_caps._CAPS_FUNCTION == {"default": False}
            stock_caps._CAPS_FUNCTION.clear()
            get_strategy("db_conditional").warm_up()  # (missing from the start)
            assert stock_caps._CAPS_FUNCTION == {"default": False}
        finally:
            stock_caps._CAPS_FUNCTION.clear()
            with connection.cursor() as cursor:
                cursor.execute(
                    "ALTER FUNCTION hidden(bigint[], jsonb) RENAME TO stock_locks_caps_over"
                )
    assert not Reservation.objects.exists()


def many_customers_buy(index: int, name: str, customers: range, defined: dict) -> Counter:
    """Runs in a child: each customer of its share tries three single-unit orders."""
    outcome: Counter = Counter()
    strategy = get_strategy(name)
    with caps(defined):
        for customer in customers[index::4]:
            for n in range(3):
                try:
                    strategy.reserve(f"{name}-{customer}-{n}", {"CAP-TV": 1}, customer=customer)
                    outcome["sold"] += 1
                except CapExceeded:
                    outcome["capped"] += 1
                except OutOfStock:
                    outcome["sold out"] += 1
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("name", strategy_names())
def test_a_thousand_customers_at_once_none_over_the_cap_and_nothing_oversold(name):
    items(CAP_TV=1500)
    defined = {"tv": {"skus": ["CAP-TV"], "max": 2}}
    results = run_in_processes(many_customers_buy, 4, name, range(1000), defined)
    total = sum(results, Counter())
    per_customer = Counter()
    for row in Reservation.objects.exclude(status="released"):
        per_customer[row.customer] += row.lines["CAP-TV"]
    assert max(per_customer.values()) == 2
    assert sum(per_customer.values()) == total["sold"] == 1500  # every unit, none over
    assert Item.objects.get(code="CAP-TV").on_hand == 0
    with caps(defined):
        assert all(row.drift == 0 for row in stock_report())


def test_the_dashboard_shows_the_caps_their_top_buyers_and_capped_refusals(redis_client):
    from django.contrib.auth.models import User

    from stock_locks import metrics
    from tests.test_dashboard import client_for

    def figures() -> tuple[int, int]:  # capped on the SKU's row, caps in the strip
        assert metrics.flush()
        data = client.get("/admin/stock_locks/dashboard/json/").json()
        [row] = [row for row in data["stock"]["rows"] if row["sku"] == "CAP-KETTLE"]
        return row["capped"], data["summary"]["errors"]["cap"]

    items(CAP_KETTLE=10)
    lua = get_strategy("lua")
    client = client_for(User.objects.create_superuser("root", password="pw"))
    with caps(KETTLES):
        # (This process's flusher may bring earlier tests' figures into the timeline:
        # what counts is what these refusals add.)
        before = figures()
        lua.reserve("d-1", {"CAP-KETTLE": 2}, customer="hal")
        lua.reserve("d-2", {"CAP-KETTLE": 1}, customer="ivy")
        for n in range(3):
            with pytest.raises(CapExceeded):
                lua.reserve(f"d-x{n}", {"CAP-KETTLE": 1}, customer="hal")
        after = figures()
        data = client.get("/admin/stock_locks/dashboard/json/").json()
        page = client.get("/admin/stock_locks/dashboard/").content.decode()
    assert (after[0] - before[0], after[1] - before[1]) == (3, 3)
    assert data["caps"] == [
        {"name": "kettles", "skus": ["CAP-KETTLE"], "max": 2, "window": "for ever",
         "top_buyers": [{"customer": "hal", "units": 2}, {"customer": "ivy", "units": 1}]}
    ]  # fmt: skip
    assert 'data-cap="kettles"' in page and "hal <b>2</b>" in page


def test_lua_areserve_counts_the_same_caps_on_the_event_loop():
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    items(CAP_KETTLE=10)
    strategy = get_strategy("lua")

    async def sale() -> list:
        outcomes = []
        for ref, customer in [("as-1", "jo"), ("as-2", "jo"), ("as-3", "jo"), ("as-4", None)]:
            try:
                await strategy.areserve(ref, {"CAP-KETTLE": 1}, customer=customer)
                outcomes.append("reserved")
            except (CapExceeded, CustomerRequired) as exc:
                outcomes.append(type(exc).__name__)
        await sync_to_async(connections.close_all)()  # (as Django does at a request's end)
        return outcomes

    with caps(KETTLES):
        assert asyncio.run(sale()) == ["reserved", "reserved", "CapExceeded", "CustomerRequired"]
    assert units_of("jo") == 2 and Item.objects.get(code="CAP-KETTLE").on_hand == 8


def test_reconcile_measures_and_repairs_cap_usage_drift(redis_client):
    from io import StringIO

    from django.core.management.base import CommandError

    from stock_locks.stock.reconcile import cap_usage_report

    items(CAP_KETTLE=10)
    lua = get_strategy("lua")
    keys = StockKeys()
    with caps(KETTLES):
        lua.reserve("u-1", {"CAP-KETTLE": 1}, customer="max")
        lua.reserve("u-2", {"CAP-KETTLE": 1}, customer="max")
        lua.commit("u-2")
        usage = keys.cap_usage("kettles", "max")
        # Drift both ways: a paid order Redis forgot, an entry that holds nothing.
        redis_client.hdel(usage, "u-2")
        redis_client.hset(usage, "ghost", f"1:{int(redis_client.time()[0]) * 1000}")
        [row] = cap_usage_report()
        assert (row.db, row.redis, row.in_flight) == (2, 2, 0)
        assert (row.stale, sorted(row.missing)) == (["ghost"], ["u-2"])
        err = StringIO()
        with pytest.raises(CommandError, match="cap usage drift"):
            call_command("reconcile_stock", stdout=StringIO(), stderr=err)
        assert "'max'" in err.getvalue()
        call_command("reconcile_stock", "--fix", stdout=StringIO(), stderr=StringIO())
        [row] = cap_usage_report()
        assert (row.db, row.redis, row.stale, row.missing) == (2, 2, [], {})
        assert sorted(redis_client.hkeys(usage)) == [b"u-1", b"u-2"]
        with pytest.raises(CapExceeded):  # Redis refuses again, as the database would
            lua.reserve("u-3", {"CAP-KETTLE": 1}, customer="max")
