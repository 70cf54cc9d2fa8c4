"""The stock management commands on PostgreSQL and a real Redis.

sync_stock loads counters from the database; reconcile_stock measures and
repairs Redis-vs-database drift; oversell_stress forks real buyer processes
(through the ORM or over HTTP against a live server) and must never oversell.
What the commands print is checked, and so is what they did, read back from
the database and Redis directly.
"""

from __future__ import annotations

import json
from collections import Counter
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from demo_shop.shop.models import Order, Product
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.base import commit_in_db

COUNTER = "sl:stock:{stock}:avail:"  # + SKU
RECORD = "sl:stock:{stock}:res:"  # + order ref
INDEX = "sl:stock:{stock}:reservations"
TABLE_HEADER = ["sku", "db", "redis", "reserved", "drift"]


def make_products(**stock: int) -> None:
    for sku, qty in stock.items():
        Product.objects.create(sku=sku, name=sku.title(), stock=qty)


def db_stock(sku: str) -> int:
    return Product.objects.get(sku=sku).stock


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


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
    make_products(TEA=7, CUP=3)
    redis_client.set(COUNTER + "TEA", 99)  # wrong: overwritten

    out, _ = run("sync_stock")

    assert (counter(redis_client, "TEA"), counter(redis_client, "CUP")) == (7, 3)
    assert table(out) == {"CUP": ["3", "3", "0", "0"], "TEA": ["7", "7", "0", "0"]}
    out, _ = run("sync_stock", "--json")
    assert json.loads(out) == [
        {"sku": "CUP", "db": 3, "redis": 3, "reserved": 0, "drift": 0},
        {"sku": "TEA", "db": 7, "redis": 7, "reserved": 0, "drift": 0},
    ]


@pytest.mark.django_db
def test_sync_stock_of_named_skus_leaves_the_others_alone(redis_client):
    make_products(TEA=7, CUP=3)
    redis_client.set(COUNTER + "TEA", 60)
    redis_client.set(COUNTER + "CUP", 50)
    out, _ = run("sync_stock", "TEA")
    assert table(out) == {"TEA": ["7", "7", "0", "0"]}
    assert (counter(redis_client, "TEA"), counter(redis_client, "CUP")) == (7, 50)


@pytest.mark.django_db
def test_sync_stock_with_open_reservations_keeps_release_exact(redis_client):
    # The database's quantity already excludes reserved units: syncing must not
    # count them twice, and the open reservation still gives its units back once.
    make_products(TEA=10)
    lua = get_strategy("lua")
    lua.reserve("open-1", {"TEA": 3})
    redis_client.set(COUNTER + "TEA", 1)
    out, _ = run("sync_stock")
    assert table(out) == {"TEA": ["7", "7", "3", "0"]}
    assert lua.release("open-1") is True
    assert (db_stock("TEA"), counter(redis_client, "TEA")) == (10, 10)


# -- reconcile_stock ------------------------------------------------------------------------


@pytest.mark.django_db
def test_reconcile_without_drift_succeeds_and_prints_the_table(redis_client):
    make_products(TEA=7, CUP=3)
    get_strategy("lua").available("TEA")  # TEA's counter is loaded, CUP's is not
    out, _ = run("reconcile_stock")
    assert table(out) == {"CUP": ["3", "-", "0", "0"], "TEA": ["7", "7", "0", "0"]}
    out, _ = run("reconcile_stock", "--json")
    assert json.loads(out) == [
        {"sku": "CUP", "db": 3, "redis": None, "reserved": 0, "drift": 0},
        {"sku": "TEA", "db": 7, "redis": 7, "reserved": 0, "drift": 0},
    ]
    out, _ = run("reconcile_stock", "CUP")
    assert table(out) == {"CUP": ["3", "-", "0", "0"]}


@pytest.mark.django_db
def test_reconcile_fails_on_a_counter_changed_behind_the_apps_back_and_fix_repairs_it(
    redis_client,
):
    make_products(TEA=7, CUP=3, JAM=4)
    run("sync_stock")
    redis_client.set(COUNTER + "TEA", 4)  # Redis would refuse sales the database allows
    redis_client.set(COUNTER + "CUP", 10)  # Redis would promise units that do not exist

    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command("reconcile_stock", stdout=out)
    assert "CUP" in str(info.value) and "TEA" in str(info.value)
    assert "JAM" not in str(info.value)
    assert table(out.getvalue()) == {
        "CUP": ["3", "10", "0", "7"],
        "JAM": ["4", "4", "0", "0"],
        "TEA": ["7", "4", "0", "-3"],
    }

    # --fix with a SKU only repairs (and reports) that SKU.
    out, err = run("reconcile_stock", "--fix", "TEA")
    assert "set 1 counter(s)" in err
    assert table(out) == {"TEA": ["7", "7", "0", "0"]}
    assert (counter(redis_client, "TEA"), counter(redis_client, "CUP")) == (7, 10)

    out, err = run("reconcile_stock", "--fix")
    assert "set 1 counter(s)" in err
    assert table(out)["CUP"] == ["3", "3", "0", "0"]
    assert [counter(redis_client, sku) for sku in ("CUP", "JAM", "TEA")] == [3, 4, 7]
    assert [row["drift"] for row in json.loads(run("reconcile_stock", "--json")[0])] == [0, 0, 0]
    assert [db_stock(sku) for sku in ("CUP", "JAM", "TEA")] == [3, 4, 7]  # the record wins

    # The repaired counter sells exactly what the database has.
    lua = get_strategy("lua")
    lua.reserve("after-fix", {"CUP": 3})
    assert (db_stock("CUP"), counter(redis_client, "CUP")) == (0, 0)


@pytest.mark.django_db
def test_reconcile_reports_open_reservations_in_the_reserved_column(redis_client):
    make_products(TEA=10, CUP=5)
    lua = get_strategy("lua")
    lua.reserve("open-1", {"TEA": 2})
    lua.reserve("open-2", {"TEA": 1, "CUP": 1})
    lua.reserve("paid", {"CUP": 2})
    lua.commit("paid")  # sold: no longer reserved
    lua.reserve("dropped", {"TEA": 4})
    lua.release("dropped")  # back in stock: no longer reserved

    out, _ = run("reconcile_stock")
    assert table(out) == {"CUP": ["2", "2", "1", "0"], "TEA": ["7", "7", "3", "0"]}
    rows = {row["sku"]: row for row in json.loads(run("reconcile_stock", "--json")[0])}
    assert (rows["TEA"]["reserved"], rows["CUP"]["reserved"]) == (3, 1)


@pytest.mark.django_db
def test_reconcile_fix_closes_old_orphan_records_and_nothing_else(redis_client):
    make_products(TEA=10)
    lua = get_strategy("lua")
    lua.reserve("open-old", {"TEA": 1})  # open in the database: kept, however old
    lua.reserve("paid-db-only", {"TEA": 1})
    commit_in_db("paid-db-only")  # paid, but the Redis half of the commit never happened
    assert redis_client.exists(RECORD + "paid-db-only")
    # A record with no database row at all, written long ago...
    redis_client.hset(RECORD + "ghost", mapping={"TEA": 2})
    # ...and one just written (its request may still be inserting the row).
    seconds, micros = redis_client.time()
    redis_client.hset(RECORD + "young", mapping={"TEA": 1})
    redis_client.zadd(INDEX, {"young": seconds * 1000 + micros // 1000})
    long_ago = 1_000  # ms since the epoch
    redis_client.zadd(INDEX, {"ghost": long_ago, "open-old": long_ago, "paid-db-only": long_ago})

    assert run("reconcile_stock")[0]  # no drift: a plain reconcile leaves records alone
    assert redis_client.exists(RECORD + "ghost")

    out, err = run("reconcile_stock", "--fix")
    assert "closed 2 orphan Redis reservation(s)" in err
    for closed in ("ghost", "paid-db-only"):
        assert not redis_client.exists(RECORD + closed)
        assert redis_client.zscore(INDEX, closed) is None
    for kept in ("open-old", "young"):
        assert redis_client.exists(RECORD + kept)
        assert redis_client.zscore(INDEX, kept) is not None
    assert table(out) == {"TEA": ["8", "8", "1", "0"]}  # counters were not touched

    # The kept open record still releases exactly once.
    assert lua.release("open-old") is True
    assert (db_stock("TEA"), counter(redis_client, "TEA")) == (9, 9)


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["sync_stock", "reconcile_stock"])
def test_naming_an_unknown_sku_is_an_error(command, redis_client):
    make_products(TEA=7)
    with pytest.raises(CommandError, match="TAE"):
        run(command, "TAE")
    assert redis_client.dbsize() == 0


# -- oversell_stress ------------------------------------------------------------------------

RESULT_KEYS = {
    "strategy",
    "attempts",
    "sold",
    "refused",
    "errors",
    "oversold",
    "final_stock",
    "drift",
    "throughput_per_s",
    "p50_ms",
    "p99_ms",
    "retries",
}


def stress(*args: str) -> list[dict]:
    out, _ = run("oversell_stress", "--json", *args)
    results = [json.loads(line) for line in out.splitlines() if line.strip()]
    for result in results:
        assert set(result) >= RESULT_KEYS, RESULT_KEYS - set(result)
    return results


def sold_per_sku(prefix: str) -> Counter[str]:
    sold: Counter[str] = Counter()
    for lines in Reservation.objects.filter(order_ref__contains=prefix).values_list(
        "lines", flat=True
    ):
        sold.update(lines)
    return sold


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["lua", "db_conditional"])
def test_oversell_stress_sells_exactly_the_stock(strategy):
    (result,) = stress(
        "--strategy", strategy, "--stock", "30", "--buyers", "120", "--processes", "4"
    )
    assert result["strategy"] == strategy
    assert result["attempts"] == 120
    assert (result["sold"], result["refused"], result["errors"]) == (30, 90, 0)
    assert (result["oversold"], result["final_stock"], result["drift"]) == (0, 0, 0)
    assert result["sold"] + result["final_stock"] == 30
    assert result["p50_ms"] <= result["p99_ms"]
    # Read back independently of the command's own tally.
    sku = f"STRESS-{strategy}-0"
    assert db_stock(sku) == 0
    assert sold_per_sku(f"STRESS-{strategy}-") == {sku: 30}
    assert Reservation.objects.count() == 30


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_over_http_against_the_live_shop(live_server):
    url = live_server.url + "/api/orders/"
    (result,) = stress(
        "--strategy", "lua", "--via", "http", "--url", url,
        "--stock", "20", "--buyers", "60", "--processes", "3",
    )  # fmt: skip
    assert result["strategy"] == "lua"
    assert result["attempts"] == 60
    assert (result["sold"], result["refused"], result["errors"]) == (20, 40, 0)
    assert (result["oversold"], result["final_stock"], result["drift"]) == (0, 0, 0)
    assert result["sold"] + result["final_stock"] == 20
    # Every sale went through the order API: an Order per reservation.
    assert db_stock("STRESS-lua-0") == 0
    assert Order.objects.count() == 20
    assert Reservation.objects.filter(order_ref__startswith="shop-STRESS-lua-").count() == 20
    assert set(Order.objects.values_list("ref", flat=True)) == set(
        Reservation.objects.values_list("order_ref", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_with_multi_sku_carts_conserves_every_sku():
    (result,) = stress(
        "--strategy", "lock", "--cart-size", "2", "--skus", "3", "--qty", "2",
        "--stock", "10", "--buyers", "45", "--processes", "3",
    )  # fmt: skip
    assert result["attempts"] == 45 and result["errors"] == 0
    assert result["oversold"] == 0 and result["drift"] == 0 and result["conserved"] is True
    assert result["sold"] == 4 * result["orders"]  # 2 lines of 2 units each
    assert result["refused"] == 45 - result["orders"] > 0  # demand 180 units, supply 30
    assert result["sold"] + result["final_stock"] == 30
    skus = [f"STRESS-lock-{n}" for n in range(3)]
    sold = sold_per_sku("STRESS-lock-")
    for sku in skus:
        assert db_stock(sku) >= 0
        assert db_stock(sku) + sold[sku] == 10, sku
    for lines in Reservation.objects.values_list("lines", flat=True):
        assert len(lines) == 2 and set(lines.values()) == {2}


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_prints_a_table_without_json():
    out, _ = run(
        "oversell_stress", "--strategy", "db_conditional",
        "--stock", "2", "--buyers", "4", "--processes", "2",
    )  # fmt: skip
    header, row = out.strip().splitlines()
    assert header.split()[:4] == ["strategy", "attempts", "orders", "units"]
    assert "oversold" in header and "drift" in header
    # strategy, attempts, orders, units sold, refused, errors, oversold, final, drift
    assert row.split()[:9] == ["db_conditional", "4", "2", "2", "2", "0", "0", "0", "0"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--processes", "0"], "--processes must be at least 1"),
        (["--buyers", "0"], "--buyers must be at least 1"),
        (["--stock", "-5"], "--stock must be at least 1"),
        (["--qty", "0"], "--qty must be at least 1"),
        (["--cart-size", "2", "--skus", "1"], "--skus must be at least --cart-size"),
        (["--strategy", "nope"], "unknown strategy 'nope'"),
        (["--via", "ftp"], "invalid choice"),
    ],
    ids=["processes", "buyers", "stock", "qty", "skus", "strategy", "via"],
)
def test_oversell_stress_refuses_bad_options_before_running_anything(args, says, redis_client):
    with pytest.raises(CommandError, match=says):
        run("oversell_stress", "--stock", "5", "--buyers", "10", "--processes", "2", *args)
    assert not Product.objects.exists()
    assert not Reservation.objects.exists()
    assert redis_client.dbsize() == 0


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_fails_when_every_attempt_errored():
    closed_port = "http://127.0.0.1:1/api/orders/"
    out = StringIO()
    with pytest.raises(CommandError):
        try:
            call_command(
                "oversell_stress", "--json", "--strategy", "db_conditional",
                "--via", "http", "--url", closed_port,
                "--stock", "5", "--buyers", "6", "--processes", "2", stdout=out,
            )  # fmt: skip
        finally:  # the premise: nothing was sold, every attempt was an error
            (result,) = map(json.loads, out.getvalue().splitlines())
            assert (result["sold"], result["errors"], result["attempts"]) == (0, 6, 6)
