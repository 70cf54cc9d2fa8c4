"""The stock management commands on PostgreSQL and a real Redis.

sync_stock loads counters from the database; reconcile_stock measures and
repairs Redis-vs-database drift; oversell_stress forks real buyer processes
(through the ORM or over HTTP against a live server), must never oversell, and
must leave the user's stock table, reservations and Redis as it found them.
What the commands print is checked, and so is what they did, read back from
the database and Redis directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.ledger import commit_in_db
from tests.inventory.models import Item, PricedItem
from tests.support.processes import child_environment
from tests.support.redis_stats import data_keys
from tests.support.stress_runs import (
    assert_left_nothing,
    redis_state,
    run,
    stress,
    watching_cleanup,
)
from tests.support.waiting import TIMEOUT, wait_until

STRATEGIES = ["lua", "watch", "lock", "db_row_lock", "db_conditional"]

COUNTER = "sl:stock:{stock}:avail:"  # + SKU
RECORD = "sl:stock:{stock}:res:"  # + order ref
INDEX = "sl:stock:{stock}:reservations"
TABLE_HEADER = ["sku", "db", "redis", "reserved", "in_flight", "drift"]


def make_items(**stock: int) -> None:
    for sku, qty in stock.items():
        Item.objects.create(code=sku, title=sku.title(), on_hand=qty)


def db_stock(sku: str) -> int:
    return Item.objects.get(code=sku).on_hand


def table(text: str) -> dict[str, list[str]]:
    """The per-SKU table as {sku: [db, redis, reserved, drift]}."""
    lines = text.strip().splitlines()
    assert lines[0].split() == TABLE_HEADER
    return {cells[0]: cells[1:] for cells in (line.split() for line in lines[1:])}


def counter(redis_client, sku: str) -> int | None:
    value = redis_client.get(COUNTER + sku)
    return None if value is None else int(value)


# -- sync_stock -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_sync_stock_loads_every_counter_from_the_database(redis_client):
    make_items(TEA=7, CUP=3)
    redis_client.set(COUNTER + "TEA", 99)  # wrong: overwritten

    out, _ = run("sync_stock")

    assert (counter(redis_client, "TEA"), counter(redis_client, "CUP")) == (7, 3)
    assert table(out) == {"CUP": ["3", "3", "0", "0", "0"], "TEA": ["7", "7", "0", "0", "0"]}
    out, _ = run("sync_stock", "--json")
    assert json.loads(out) == [
        {
            "sku": "CUP",
            "db": 3,
            "redis": 3,
            "reserved": 0,
            "in_flight": 0,
            "drift": 0,
            "settled": True,
        },
        {
            "sku": "TEA",
            "db": 7,
            "redis": 7,
            "reserved": 0,
            "in_flight": 0,
            "drift": 0,
            "settled": True,
        },
    ]


@pytest.mark.django_db
def test_sync_stock_of_named_skus_leaves_the_others_alone(redis_client):
    make_items(TEA=7, CUP=3)
    redis_client.set(COUNTER + "TEA", 60)
    redis_client.set(COUNTER + "CUP", 50)
    out, _ = run("sync_stock", "TEA")
    assert table(out) == {"TEA": ["7", "7", "0", "0", "0"]}
    assert (counter(redis_client, "TEA"), counter(redis_client, "CUP")) == (7, 50)


@pytest.mark.django_db
def test_sync_stock_with_open_reservations_keeps_release_exact(redis_client):
    # The database's quantity already excludes reserved units: syncing must not
    # count them twice, and the open reservation still gives its units back once.
    make_items(TEA=10)
    lua = get_strategy("lua")
    lua.reserve("open-1", {"TEA": 3})
    redis_client.set(COUNTER + "TEA", 1)
    out, _ = run("sync_stock")
    assert table(out) == {"TEA": ["7", "7", "3", "0", "0"]}
    assert lua.release("open-1") is True
    assert (db_stock("TEA"), counter(redis_client, "TEA")) == (10, 10)


# -- reconcile_stock ------------------------------------------------------------------------


@pytest.mark.django_db
def test_reconcile_without_drift_succeeds_and_prints_the_table(redis_client):
    make_items(TEA=7, CUP=3)
    get_strategy("lua").available("TEA")  # TEA's counter is loaded, CUP's is not
    out, _ = run("reconcile_stock")
    assert table(out) == {"CUP": ["3", "-", "0", "0", "0"], "TEA": ["7", "7", "0", "0", "0"]}
    out, _ = run("reconcile_stock", "--json")
    assert json.loads(out) == [
        {
            "sku": "CUP",
            "db": 3,
            "redis": None,
            "reserved": 0,
            "in_flight": 0,
            "drift": 0,
            "settled": True,
        },
        {
            "sku": "TEA",
            "db": 7,
            "redis": 7,
            "reserved": 0,
            "in_flight": 0,
            "drift": 0,
            "settled": True,
        },
    ]
    out, _ = run("reconcile_stock", "CUP")
    assert table(out) == {"CUP": ["3", "-", "0", "0", "0"]}


@pytest.mark.django_db
def test_reconcile_fails_on_a_counter_changed_behind_the_apps_back_and_fix_repairs_it(
    redis_client,
):
    make_items(TEA=7, CUP=3, JAM=4)
    run("sync_stock")
    redis_client.set(COUNTER + "TEA", 4)  # Redis would refuse sales the database allows
    redis_client.set(COUNTER + "CUP", 10)  # Redis would promise units that do not exist

    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command("reconcile_stock", stdout=out)
    assert "CUP" in str(info.value) and "TEA" in str(info.value)
    assert "JAM" not in str(info.value)
    assert table(out.getvalue()) == {
        "CUP": ["3", "10", "0", "0", "7"],
        "JAM": ["4", "4", "0", "0", "0"],
        "TEA": ["7", "4", "0", "0", "-3"],
    }

    # --fix with a SKU only repairs (and reports) that SKU.
    out, err = run("reconcile_stock", "--fix", "TEA")
    assert "corrected 1 counter(s)" in err
    assert table(out) == {"TEA": ["7", "7", "0", "0", "0"]}
    assert (counter(redis_client, "TEA"), counter(redis_client, "CUP")) == (7, 10)

    out, err = run("reconcile_stock", "--fix")
    assert "corrected 1 counter(s)" in err
    assert table(out)["CUP"] == ["3", "3", "0", "0", "0"]
    assert [counter(redis_client, sku) for sku in ("CUP", "JAM", "TEA")] == [3, 4, 7]
    assert [row["drift"] for row in json.loads(run("reconcile_stock", "--json")[0])] == [0, 0, 0]
    assert [db_stock(sku) for sku in ("CUP", "JAM", "TEA")] == [3, 4, 7]  # the record wins

    # The repaired counter sells exactly what the database has.
    lua = get_strategy("lua")
    lua.reserve("after-fix", {"CUP": 3})
    assert (db_stock("CUP"), counter(redis_client, "CUP")) == (0, 0)


@pytest.mark.django_db
def test_reconcile_reports_open_reservations_in_the_reserved_column(redis_client):
    make_items(TEA=10, CUP=5)
    lua = get_strategy("lua")
    lua.reserve("open-1", {"TEA": 2})
    lua.reserve("open-2", {"TEA": 1, "CUP": 1})
    lua.reserve("paid", {"CUP": 2})
    lua.commit("paid")  # sold: no longer reserved
    lua.reserve("dropped", {"TEA": 4})
    lua.release("dropped")  # back in stock: no longer reserved

    out, _ = run("reconcile_stock")
    assert table(out) == {"CUP": ["2", "2", "1", "0", "0"], "TEA": ["7", "7", "3", "0", "0"]}
    rows = {row["sku"]: row for row in json.loads(run("reconcile_stock", "--json")[0])}
    assert (rows["TEA"]["reserved"], rows["CUP"]["reserved"]) == (3, 1)


@pytest.mark.django_db
def test_reconcile_fix_closes_old_orphan_records_and_nothing_else(redis_client):
    make_items(TEA=10)
    lua = get_strategy("lua")
    lua.reserve("open-old", {"TEA": 1})  # open in the database: kept, however old
    lua.reserve("paid-db-only", {"TEA": 1})
    commit_in_db("paid-db-only")  # paid, but the Redis half of the commit never happened
    assert redis_client.exists(RECORD + "paid-db-only")
    # Redis halves whose database step never came: one long ago (its request died)...
    lua.reserve_in_redis("ghost", {"TEA": 2})
    # ...and one just now (its request may still be inserting the row).
    lua.reserve_in_redis("young", {"TEA": 1})
    long_ago = 1_000  # ms since the epoch
    redis_client.zadd(INDEX, {"ghost": long_ago, "open-old": long_ago, "paid-db-only": long_ago})

    assert run("reconcile_stock")[0]  # in flight, not drift: a plain reconcile changes nothing
    assert redis_client.exists(RECORD + "ghost")

    out, err = run("reconcile_stock", "--fix")
    assert "settled 2 Redis reservation record(s)" in err
    for closed in ("ghost", "paid-db-only"):
        assert not redis_client.exists(RECORD + closed)
        assert redis_client.zscore(INDEX, closed) is None
    for kept in ("open-old", "young"):
        assert redis_client.exists(RECORD + kept)
        assert redis_client.zscore(INDEX, kept) is not None
    # The ghost's 2 units went back; the young one's are still counted in flight.
    assert table(out) == {"TEA": ["8", "7", "1", "1", "0"]}
    assert Reservation.objects.get(order_ref="ghost").status == "released"  # a late row is refused

    # The kept open record still releases exactly once.
    assert lua.release("open-old") is True
    assert (db_stock("TEA"), counter(redis_client, "TEA")) == (9, 8)  # young: still in flight


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["sync_stock", "reconcile_stock"])
def test_naming_an_unknown_sku_is_an_error(command, redis_client):
    make_items(TEA=7)
    with pytest.raises(CommandError, match="TAE"):
        run(command, "TAE")
    assert data_keys(redis_client) == []


# -- oversell_stress ------------------------------------------------------------------------
#
# The command leaves nothing behind, so what it did is read back independently of its own
# tally by a receiver of stress_cleanup (tests/support/stress_runs.py).

NAME = ("--field", "title=Stress {sku}")  # Item.title is required and has no default


def table_state(model, *fields: str) -> list[tuple]:
    return sorted(model.objects.values_list(*fields))


def database_state() -> tuple:
    return (
        table_state(Item, "code", "title", "on_hand", "fence"),
        table_state(Reservation, "order_ref", "status", "lines", "strategy"),
    )


@pytest.fixture
def before_cleanup():
    """What each run left before its clean-up (tests/support/stress_runs.py)."""
    with watching_cleanup() as seen:
        yield seen


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["lua", "db_conditional"])
def test_oversell_stress_sells_exactly_the_stock(strategy, before_cleanup, redis_client):
    redis_before = redis_state(redis_client)
    (result,) = stress(
        "--strategy", strategy, "--stock", "30", "--buyers", "120", "--processes", "4",
        fields=NAME,
    )  # fmt: skip
    assert result["strategy"] == strategy
    assert result["attempts"] == 120
    assert (result["sold"], result["refused"], result["errors"]) == (30, 90, 0)
    assert (result["oversold"], result["final_stock"], result["drift"]) == (0, 0, 0)
    assert result["sold"] + result["final_stock"] == 30
    assert result["p50_ms"] <= result["p99_ms"]
    # Read back independently of the command's own tally, before the clean-up.
    (sku,) = result["skus"]
    assert sku.startswith("STRESS-") and sku.endswith(f"-{strategy}-0")
    seen = before_cleanup[strategy]
    assert seen["created"] is True and seen["skus"] == [sku]
    assert seen["stock"] == {sku: 0}
    assert seen["sold"] == {sku: 30} and seen["reservations"] == 30 == len(seen["refs"])
    # ... and then gone.
    assert_left_nothing()
    assert redis_state(redis_client) == redis_before


@pytest.mark.django_db(transaction=True)
def test_a_stress_run_readies_a_redis_that_lost_its_data_before_its_buyers_start(
    redis_client,
):
    """Restoring after a data loss is one process's work while the others wait: done
    by the run's preparation, not by its first buyers, inside the measured time."""
    from stock_locks.keys import StockKeys
    from stock_locks.stock.stress import StressConfig, StressRun, new_token

    loaded = StockKeys().loaded
    assert not redis_client.exists(loaded)  # an emptied Redis, as the benchmarks make it
    config = StressConfig(stock=3, buyers=6, processes=2, fields={"title": "Stress {sku}"})
    with StressRun(config, "lua", new_token()) as run:
        assert redis_client.exists(loaded), "the buyers would restore on the clock"
        result = run.fire()
    assert (result.sold, result.refused, result.errors, result.oversold) == (3, 3, 0, 0)
    assert_left_nothing()


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_with_multi_sku_carts_conserves_every_sku(before_cleanup):
    (result,) = stress(
        "--strategy", "lock", "--cart-size", "2", "--skus", "3", "--qty", "2",
        "--stock", "10", "--buyers", "45", "--processes", "3", fields=NAME,
    )  # fmt: skip
    assert result["attempts"] == 45 and result["errors"] == 0
    assert result["oversold"] == 0 and result["drift"] == 0 and result["conserved"] is True
    assert result["sold"] == 4 * result["orders"]  # 2 lines of 2 units each
    assert result["refused"] == 45 - result["orders"] > 0  # demand 180 units, supply 30
    assert result["sold"] + result["final_stock"] == 30
    seen = before_cleanup["lock"]
    assert len(seen["skus"]) == 3
    for sku in seen["skus"]:
        assert seen["stock"][sku] >= 0
        assert seen["stock"][sku] + seen["sold"][sku] == 10, sku
    assert seen["reservations"] == result["orders"]
    assert_left_nothing()


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_prints_a_table_without_json():
    out, err = run(
        "oversell_stress", "--strategy", "db_conditional", *NAME,
        "--stock", "2", "--buyers", "4", "--processes", "2",
    )  # fmt: skip
    header, row = out.strip().splitlines()
    assert header.split()[:4] == ["strategy", "attempts", "orders", "units"]
    assert "oversold" in header and "drift" in header
    # strategy, attempts, orders, units sold, refused, errors, oversold, final, drift
    assert row.split()[:9] == ["db_conditional", "4", "2", "2", "2", "0", "0", "0", "0"]
    assert "db_conditional: removed 2 reservation(s), 1 stock row(s)" in err
    assert_left_nothing()


CREATE = ("--stock", "5", *NAME)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([*CREATE, "--processes", "0"], "--processes must be at least 1"),
        ([*CREATE, "--buyers", "0"], "--buyers must be at least 1"),
        (["--stock", "-5", *NAME], "--stock must be at least 1"),
        ([*CREATE, "--qty", "0"], "--qty must be at least 1"),
        ([*CREATE, "--cart-size", "2", "--skus", "1"], "--skus must be at least --cart-size"),
        ([*CREATE, "--strategy", "nope"], "unknown strategy 'nope'"),
        ([*CREATE, "--via", "ftp"], "invalid choice"),
        ([*CREATE, "--field", "title"], "give NAME=VALUE"),
        ([*CREATE, "--field", "colour=red"], "no field 'colour'"),
        ([*CREATE, "--field", "on_hand=3"], "sets that field itself"),
        (["--stock", "5", "--field", "title=" + "x" * 101], "title: .*at most 100 characters"),
        ([*CREATE, "--prefix", "a b"], "--prefix must be"),
        (["--sku", "NOPE"], "no inventory.Item with code 'NOPE'"),
        (["--sku", "TEA", "--stock", "5"], "--stock sets the stock of the rows the run creates"),
        (["--sku", "TEA", *NAME], "--field sets fields of rows the run creates"),
        (["--sku", "TEA", "--cart-size", "2"], "--cart-size cannot exceed"),
    ],
    ids=[
        "processes", "buyers", "stock", "qty", "skus", "strategy", "via", "field-form",
        "field-unknown", "field-own", "field-invalid", "prefix", "sku-unknown", "sku-stock",
        "sku-field", "sku-cart",
    ],
)  # fmt: skip
def test_oversell_stress_refuses_bad_options_before_running_anything(args, says, redis_client):
    make_items(TEA=3)
    before = database_state()
    with pytest.raises(CommandError, match=says):
        run("oversell_stress", "--buyers", "10", "--processes", "2", *args)
    assert database_state() == before
    assert data_keys(redis_client) == []


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_fails_when_every_attempt_errored():
    closed_port = "http://127.0.0.1:1/api/orders/"
    out = StringIO()
    with pytest.raises(CommandError):
        try:
            call_command(
                "oversell_stress", "--json", "--strategy", "db_conditional", *NAME,
                "--via", "http", "--url", closed_port,
                "--stock", "5", "--buyers", "6", "--processes", "2", stdout=out,
            )  # fmt: skip
        finally:  # the premise: nothing was sold, every attempt was an error
            (result,) = map(json.loads, out.getvalue().splitlines())
            assert (result["sold"], result["errors"], result["attempts"]) == (0, 6, 6)
    assert_left_nothing()


# -- oversell_stress and the user's own data: required fields, a customer mid-purchase


def inventory_state() -> tuple:
    return (
        table_state(Item, "code", "title", "on_hand", "fence"),
        table_state(Reservation, "order_ref", "status", "lines", "strategy", "expires_at"),
    )


def a_customer_is_mid_purchase() -> None:
    """The user's own data: an item with a loaded counter and an open reservation."""
    Item.objects.create(code="WIDGET", on_hand=9, title="Widget")
    get_strategy("lua").reserve("customer-1", {"WIDGET": 2}, ttl=600)


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_without_a_required_field_says_so_and_writes_nothing(
    redis_client, settings
):
    a_customer_is_mid_purchase()
    database_before, redis_before = inventory_state(), redis_state(redis_client)
    keys_before = data_keys(redis_client)
    # A stock model whose required price the run cannot make up (its title it can).
    settings.STOCK_LOCKS = {**settings.STOCK_LOCKS, "STOCK_MODEL": "inventory.PricedItem"}

    with pytest.raises(CommandError) as caught:
        run("oversell_stress", "--strategy", "all", "--buyers", "10", "--processes", "2")

    message = str(caught.value)
    assert "inventory.PricedItem" in message and "price (DecimalField)" in message
    assert "--field price=" in message and "--sku" in message
    assert "title" not in message  # a required text field gets the row's SKU
    assert "Nothing was written" in message
    assert not PricedItem.objects.exists()
    assert inventory_state() == database_before
    assert redis_state(redis_client) == redis_before and data_keys(redis_client) == keys_before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fields", "title"),
    [((), "{sku}"), (("--field", "title=Stress {sku}"), "Stress {sku}")],
    ids=["sku-by-default", "field-wins"],
)
def test_oversell_stress_fills_a_required_text_field_with_the_sku(before_cleanup, fields, title):
    titles: dict[str, str] = {}
    before_cleanup.then(
        lambda strategy, refs, skus: titles.update(
            Item.objects.filter(code__in=skus).values_list("code", "title")
        )
    )
    (result,) = stress(
        "--strategy", "db_conditional", "--stock", "2", "--buyers", "4", "--processes", "2",
        fields=fields,
    )  # fmt: skip
    assert (result["sold"], result["errors"], result["oversold"]) == (2, 0, 0)
    (sku,) = result["skus"]
    assert titles == {sku: title.format(sku=sku)}
    assert_left_nothing()


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_with_the_values_leaves_table_reservations_and_redis_as_before(
    redis_client, before_cleanup
):
    a_customer_is_mid_purchase()
    database_before, redis_before = inventory_state(), redis_state(redis_client)

    results = stress(
        "--strategy", "all", "--stock", "5", "--buyers", "12", "--processes", "2",
        fields=("--field", "title=Stress"),
    )  # fmt: skip

    assert [r["strategy"] for r in results] == STRATEGIES
    for result in results:
        assert (result["sold"], result["refused"], result["errors"]) == (5, 7, 0), result
        assert (result["oversold"], result["drift"], result["conserved"]) == (0, 0, True)
        seen = before_cleanup[result["strategy"]]
        assert seen["reservations"] == 5 and seen["stock"] == {result["skus"][0]: 0}
    assert inventory_state() == database_before
    assert redis_state(redis_client) == redis_before


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_of_an_existing_sku_gives_its_stock_and_counter_back(
    redis_client, before_cleanup
):
    a_customer_is_mid_purchase()  # WIDGET: 7 on hand, counter 7, the customer holds 2
    lua = get_strategy("lua")
    database_before, redis_before = inventory_state(), redis_state(redis_client)
    # One order of each run is paid before the clean-up: its units come back all the same.
    before_cleanup.then(lambda strategy, refs, skus: get_strategy(strategy).commit(refs[0]))

    results = stress(
        "--strategy", "all", "--sku", "WIDGET", "--buyers", "12", "--processes", "2",
        fields=(),
    )  # fmt: skip

    for result in results:
        assert result["skus"] == ["WIDGET"] and result["initial_stock"] == 7, result
        assert (result["sold"], result["refused"], result["oversold"]) == (7, 5, 0), result
        assert before_cleanup[result["strategy"]]["created"] is False
    assert Item.objects.get(code="WIDGET").on_hand == 7
    assert lua.available("WIDGET") == 7 == int(redis_client.get(COUNTER + "WIDGET"))
    # Only the versions of WIDGET's counter moved (they only ever rise) and the fence the
    # lock strategy wrote on the row (fences only rise): nothing else of the run is left.
    assert [row[:3] for row in database_before[0]] == [("WIDGET", "Widget", 7)]
    assert [row[:3] for row in inventory_state()[0]] == [("WIDGET", "Widget", 7)]
    assert inventory_state()[1] == database_before[1]  # the customer's hold, nothing else
    redis_after = redis_state(redis_client)
    versions = "sl:stock:{stock}:versions"
    assert set(redis_after) == set(redis_before)
    for key in redis_before:
        if key != versions:
            assert redis_after[key] == redis_before[key], key
    assert lua.release("customer-1") is True
    assert Item.objects.get(code="WIDGET").on_hand == 9 == lua.available("WIDGET")


def _default_sigint() -> None:  # in the child, before exec
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_marker() -> bool:
    return Reservation.objects.filter(order_ref__startswith="STRESS-").count() >= 10


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_interrupted_by_ctrl_c_removes_what_it_made(redis_client):
    make_items(TEA=3)
    database_before, redis_before = database_state(), redis_state(redis_client)
    command = [
        sys.executable, "manage.py", "oversell_stress", "--strategy", "lua", *NAME,
        "--stock", "100000", "--buyers", "100000", "--processes", "2",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=Path(__file__).resolve().parent.parent,
        # (PYTHONFAULTHANDLER: should it hang, SIGABRT makes it print every thread's stack)
        env={**os.environ, **child_environment(), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # ... which takes Ctrl-C. A job started in the background by a shell without job
        # control (a CI script's "&") inherits SIGINT ignored, and so would the command.
        preexec_fn=_default_sigint,
    )
    try:
        wait_until(_interrupt_marker, what="the buyers selling")
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: to the command and its workers
        try:
            out, err = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            # Its stacks (the workers keep the pipes open: they go once the stacks are out)
            process.send_signal(signal.SIGABRT)
            process.wait(timeout=TIMEOUT)
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate(timeout=TIMEOUT)
            raise AssertionError(f"no exit after Ctrl-C; its stacks:\n{err.decode()}") from None
    finally:
        # The whole group, whatever the command did: a worker left behind would keep its
        # database session and block the test database's teardown.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 130, err.decode()
    assert b"interrupted" in err and b"lua: removed" in err
    assert database_state() == database_before
    assert redis_state(redis_client) == redis_before
