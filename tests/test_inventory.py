"""The library in a project that is not the demo: its own stock model, names and columns.

``tests/inventory`` has ``Item(code, on_hand)`` on renamed columns with a
required field; every strategy, the expiry, the sweeper and the stock sync
work on it, and the system checks catch what cannot work before the first sale.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
from django.db.models import F
from django.test import Client, override_settings

from stock_locks import checks
from stock_locks.exceptions import OutOfStock
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy, stock_changed
from stock_locks.stock.reconcile import measure
from stock_locks.stock.sweeper import sweep
from tests.inventory.models import INVENTORY, Item
from tests.support.fault_proxy import FaultProxy
from tests.support.processes import run_in_processes, start_process
from tests.support.waiting import wait_until

STRATEGIES = ["lua", "watch", "lock", "db_row_lock", "db_conditional"]


@pytest.fixture
def inventory(settings):
    settings.STOCK_LOCKS = {**settings.STOCK_LOCKS, **INVENTORY}


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def on_hand(code: str) -> int:
    return Item.objects.get(code=code).on_hand


def _buy(index: int, strategy: str, attempts: int) -> int:
    with override_settings(STOCK_LOCKS=INVENTORY):
        chosen, sold = get_strategy(strategy), 0
        for n in range(attempts):
            try:
                chosen.reserve(f"{strategy}-{index}-{n}", {"WIDGET": 1}, ttl=600)
                sold += 1
            except OutOfStock:
                pass
        return sold


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_sells_the_inventory_item_exactly(strategy, inventory):
    Item.objects.create(code="WIDGET", on_hand=30, title="Widget")
    sold = run_in_processes(_buy, 4, strategy, 15)
    assert sum(sold) == 30 and on_hand("WIDGET") == 0
    assert sum(r.units for r in Reservation.objects.all()) == 30
    chosen = get_strategy(strategy)
    ref = Reservation.objects.first().order_ref
    assert chosen.release(ref) is True
    assert chosen.available("WIDGET") == 1 == on_hand("WIDGET")
    assert all(row.settled and row.drift == 0 for row in measure())


@pytest.mark.django_db(transaction=True)
def test_expiry_sweeper_and_sync_on_the_inventory_item(inventory):
    item = Item.objects.create(code="WIDGET", on_hand=5, title="Widget")
    lua = get_strategy("lua")
    lua.reserve("a", {"WIDGET": 2}, ttl=60)
    Reservation.objects.filter(order_ref="a").update(
        expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    )
    assert sweep(grace=0).expired == ["a"]
    item.refresh_from_db()
    item.on_hand += 10  # an admin-style save on renamed columns
    item.save()
    assert lua.available("WIDGET") == 15
    Item.objects.filter(code="WIDGET").update(on_hand=F("on_hand") - 5)
    assert stock_changed("WIDGET") and lua.available("WIDGET") == 10 == on_hand("WIDGET")


@pytest.mark.django_db
def test_the_inventory_configuration_passes_the_checks(inventory):
    assert checks.check_settings() == []


def test_an_integer_sku_field_is_refused_by_the_checks(settings):
    settings.STOCK_LOCKS = {
        "STOCK_MODEL": "inventory.NumberedItem",
        "STOCK_SKU_FIELD": "number",
        "STOCK_QUANTITY_FIELD": "on_hand",
        "STRATEGIES": {"lua": "stock_locks.stock.lua.LuaStrategy"},
        "STRATEGY": "lua",
    }
    assert ids(checks.check_settings()) == ["stock_locks.E006"]


def test_a_stock_model_without_a_fence_is_caught_before_the_lock_strategy_sells(settings):
    plain = {"STOCK_MODEL": "inventory.PlainItem", "STOCK_SKU_FIELD": "code",
             "STOCK_QUANTITY_FIELD": "on_hand"}  # fmt: skip
    settings.STOCK_LOCKS = plain
    assert ids(checks.check_settings()) == ["stock_locks.W002"]  # registered, not the default
    settings.STOCK_LOCKS = {**plain, "STRATEGY": "lock"}
    assert ids(checks.check_settings()) == ["stock_locks.E007"]


def test_a_redis_client_without_timeouts_is_an_error(settings, redis_server):
    settings.CACHES = {
        **settings.CACHES,
        "unbounded": {
            "BACKEND": "django_redis.cache.RedisCache",
            # another db: django-redis shares one pool per URL, timeouts included
            "LOCATION": redis_server.url.replace("/0", "/3"),
            # what redis-py < 6 gives by default: no timeouts at all
            "OPTIONS": {
                "CONNECTION_POOL_KWARGS": {"socket_timeout": None, "socket_connect_timeout": None}
            },
        },
    }
    settings.STOCK_LOCKS = {**settings.STOCK_LOCKS, "REDIS_ALIAS": "unbounded"}
    assert ids(checks.check_redis()) == ["stock_locks.E008"]


def test_sqlite_with_deferred_transactions_is_a_warning(tmp_path):
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--tag", "stock_locks"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "stock_locks.W005" in done.stderr + done.stdout


@pytest.mark.django_db
@pytest.mark.urls("tests.urls")
def test_a_silent_redis_answers_503_and_the_check_does_not_hang(settings, redis_server):
    proxy = FaultProxy(redis_server.port).start()
    try:
        settings.CACHES = {
            **settings.CACHES,
            "stock_locks": {
                **settings.CACHES["stock_locks"],
                "LOCATION": proxy.url,
                "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
            },
        }
        proxy.stall()  # accepts connections, never answers
        response = Client().post("/orders/7/pay/")
        assert response.status_code == 503
        assert ids(checks.check_redis()) == ["stock_locks.W001"]
    finally:
        proxy.close()


def _sell_slowly(index: int, n: int) -> int:
    with override_settings(STOCK_LOCKS=INVENTORY):
        lua, sold = get_strategy("lua"), 0
        for k in range(n):
            try:
                lua.reserve(f"slow-{index}-{k}", {"WIDGET": 1})
            except OutOfStock:
                continue
            sold += 1
            if k % 3 == 0:
                lua.release(f"slow-{index}-{k}")  # releases race the reserves too
                sold -= 1
        return sold


@pytest.mark.django_db(transaction=True)
def test_reconcile_during_a_sale_never_reports_drift_that_is_not_there(inventory):
    Item.objects.create(code="WIDGET", on_hand=400, title="Widget")
    Item.objects.create(code="QUIET", on_hand=5, title="Quiet")
    get_strategy("lua").available("QUIET")
    sellers = [start_process(_sell_slowly, i, 150) for i in range(3)]
    samples = []
    try:
        # (the sellers take a moment to start: measure once they sell, not before)
        wait_until(lambda: Reservation.objects.filter(order_ref__startswith="slow-").exists(),
                   what="the sale to start")  # fmt: skip
        while any(p.is_alive() for p in sellers) and len(samples) < 40:
            samples.append({row.sku: row for row in measure()})
    finally:
        for p in sellers:
            p.join(60)
    # Measured, settled, while the sale had moved the table: drift was really looked at.
    assert any(s["WIDGET"].settled and s["WIDGET"].db < 400 for s in samples), samples
    for sample in samples:
        assert all(row.drift == 0 for row in sample.values()), sample
        assert sample["QUIET"].settled  # a SKU nobody sells is measured, not "moving"
    assert all(row.settled and row.drift == 0 for row in measure())


@pytest.mark.django_db(transaction=True)
def test_a_row_fenced_by_another_lock_name_still_sells_through_the_lock_strategy(inventory):
    from stock_locks import Lock
    from stock_locks.fencing import fenced_update

    Item.objects.create(code="WIDGET", on_hand=5, title="Widget")
    with Lock("order:42") as lock:  # another name fences the row first
        fenced_update(Item.objects.filter(code="WIDGET"), lock.fence, title="Renamed")
    chosen = get_strategy("lock")
    for n in range(3):
        chosen.reserve(f"after-{n}", {"WIDGET": 1})
    assert on_hand("WIDGET") == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("other", ["lock", "db_row_lock", "db_conditional"])
def test_a_database_strategy_moves_a_loaded_counter_as_it_sells(inventory, other):
    Item.objects.create(code="WIDGET", on_hand=10, title="Widget")
    lua = get_strategy("lua")
    assert lua.available("WIDGET") == 10  # the counter is loaded
    get_strategy(other).reserve("db-1", {"WIDGET": 4})
    assert lua.available("WIDGET") == 6 == on_hand("WIDGET")
    get_strategy(other).release("db-1")
    get_strategy(other).release("db-1")  # a repeat moves nothing
    assert lua.available("WIDGET") == 10 == on_hand("WIDGET")
    assert all(row.settled and row.drift == 0 for row in measure())
