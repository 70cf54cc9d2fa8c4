"""Stock strategies on PostgreSQL and a real Redis, under real process concurrency."""

from __future__ import annotations

import random

import pytest

from stock_locks.exceptions import InvalidQuantity, OutOfStock, ReservationError
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy, strategy_names
from stock_locks.stock.reconcile import stock_report
from tests.inventory.models import Item
from tests.support.processes import run_in_processes

STRATEGIES = ["lua", "watch", "lock", "db_row_lock", "db_conditional"]
REDIS_COUNTERS = {"lua", "watch"}


def test_every_registered_strategy_is_tested():
    assert sorted(strategy_names()) == sorted(STRATEGIES)


def make_items(**stock: int) -> None:
    for sku, qty in stock.items():
        Item.objects.create(code=sku, title=sku.title(), on_hand=qty)


def db_stock(sku: str) -> int:
    return Item.objects.get(code=sku).on_hand


def sold_units() -> dict[str, int]:
    sold: dict[str, int] = {}
    for lines in Reservation.objects.values_list("lines", flat=True):
        for sku, qty in lines.items():
            sold[sku] = sold.get(sku, 0) + qty
    return sold


def assert_no_drift() -> None:
    assert [(row.sku, row.drift) for row in stock_report() if row.drift] == []


# -- the flash sale: one hot SKU ------------------------------------------------


def _buy_one(index: int, strategy: str, attempts: int) -> dict[str, int]:
    chosen = get_strategy(strategy)
    outcome = {"sold": 0, "refused": 0}
    for n in range(attempts):
        try:
            chosen.reserve(f"hot-{index}-{n}", {"HOT": 1})
            outcome["sold"] += 1
        except OutOfStock as exc:
            assert exc.sku == "HOT" and exc.requested == 1 and exc.available == 0
            outcome["refused"] += 1
    return outcome


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_400_buyers_in_8_processes_sell_exactly_the_100_in_stock(strategy):
    make_items(HOT=100)
    outcomes = run_in_processes(_buy_one, 8, strategy, 50)
    assert sum(o["sold"] for o in outcomes) == 100
    assert sum(o["refused"] for o in outcomes) == 300
    assert db_stock("HOT") == 0  # never below: the column's CHECK would have failed a write
    assert sold_units() == {"HOT": 100}
    assert Reservation.objects.count() == 100
    assert get_strategy(strategy).available("HOT") == 0
    assert_no_drift()


# -- multi-SKU carts: all or nothing ------------------------------------------------

CART_SKUS = ["A", "B", "C", "D", "E"]


def _buy_carts(index: int, strategy: str, carts: int) -> dict[str, list]:
    rng = random.Random(index)
    chosen = get_strategy(strategy)
    done: dict[str, list] = {"reserved": [], "refused": []}
    for n in range(carts):
        skus = rng.sample(CART_SKUS, rng.randint(1, 3))
        cart = {sku: rng.randint(1, 3) for sku in skus}
        ref = f"cart-{index}-{n}"
        try:
            chosen.reserve(ref, cart)
            done["reserved"].append((ref, cart))
        except OutOfStock as exc:
            assert (
                exc.sku in cart and exc.requested == cart[exc.sku] and exc.available < exc.requested
            )
            done["refused"].append((ref, cart))
    return done


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_random_carts_conserve_stock_line_by_line(strategy, redis_client):
    make_items(**{sku: 25 for sku in CART_SKUS})
    outcomes = run_in_processes(_buy_carts, 4, strategy, 40)
    reserved = [item for o in outcomes for item in o["reserved"]]
    refused = [item for o in outcomes for item in o["refused"]]
    assert reserved and refused  # the stock ran out part way: both paths were taken
    sold = sold_units()
    for sku in CART_SKUS:
        assert db_stock(sku) >= 0
        assert db_stock(sku) + sold.get(sku, 0) == 25, sku
    # What was reserved is exactly the carts that succeeded...
    rows = dict(Reservation.objects.values_list("order_ref", "lines"))
    assert rows == dict(reserved)
    # ...and a refused cart left nothing behind, in the database or in Redis.
    keys = StockKeys()
    for ref, _ in refused:
        assert ref not in rows
        assert not redis_client.exists(keys.record(ref))
    assert_no_drift()


# -- idempotency ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_reserve_twice_moves_stock_once_and_release_twice_restores_once(strategy):
    make_items(TEA=10, CUP=3)
    chosen = get_strategy(strategy)
    first = chosen.reserve("order-1", {"TEA": 4, "CUP": 1})
    again = chosen.reserve("order-1", {"TEA": 4, "CUP": 1})
    assert first.created and not again.created and again.pk == first.pk
    assert (db_stock("TEA"), db_stock("CUP")) == (6, 2)
    with pytest.raises(ReservationError):
        chosen.reserve("order-1", {"TEA": 1})  # the ref is taken by other lines
    assert chosen.release("order-1") is True
    assert chosen.release("order-1") is False
    assert (db_stock("TEA"), db_stock("CUP")) == (10, 3)
    assert chosen.available("TEA") == 10
    assert_no_drift()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_concurrent_retries_of_one_order_move_stock_once(strategy):
    make_items(TEA=10)
    created = []
    for outcome in run_in_processes(_retry_same_ref, 6, strategy):
        created.extend(outcome)
    assert created.count(True) == 1
    assert db_stock("TEA") == 8
    assert_no_drift()


def _retry_same_ref(index: int, strategy: str) -> list[bool]:
    chosen = get_strategy(strategy)
    outcomes = []
    for _ in range(5):
        try:
            outcomes.append(chosen.reserve("shared-ref", {"TEA": 2}).created)
        except ReservationError:
            outcomes.append(False)  # "in flight": another process is writing it right now
    return outcomes


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_commit_is_final_and_idempotent(strategy):
    make_items(TEA=5)
    chosen = get_strategy(strategy)
    chosen.reserve("paid", {"TEA": 2})
    assert chosen.commit("paid") is True
    assert chosen.commit("paid") is False
    with pytest.raises(ReservationError):
        chosen.release("paid")  # a paid order's stock never goes back
    chosen.reserve("dropped", {"TEA": 1})
    chosen.release("dropped")
    with pytest.raises(ReservationError):
        chosen.commit("dropped")  # nor is a released one paid
    assert db_stock("TEA") == 3
    assert Reservation.objects.get(order_ref="paid").status == "committed"
    assert_no_drift()


# -- bad input --------------------------------------------------------------------------

BAD_CARTS = [
    {},
    [("TEA", 1)],
    {"TEA": 0},
    {"TEA": -2},
    {"TEA": 1.5},
    {"TEA": "2"},
    {"TEA": True},
    {"TEA": None},
    {"TEA": 1001},
    {"": 1},
    {"NOPE": 1},
    {"TEA": 1, "NOPE": 1},
    {f"SKU{i}": 1 for i in range(51)},
]


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bad_carts_are_refused_and_change_nothing(strategy, redis_client):
    make_items(TEA=5)
    chosen = get_strategy(strategy)
    for cart in BAD_CARTS:
        with pytest.raises(InvalidQuantity):
            chosen.reserve("bad", cart)
    for ref in ("", None, 7, "x" * 101):
        with pytest.raises(InvalidQuantity):
            chosen.reserve(ref, {"TEA": 1})
    assert db_stock("TEA") == 5
    assert not Reservation.objects.exists()
    assert not redis_client.exists(StockKeys().record("bad"))
    assert chosen.available("TEA") == 5


def test_unknown_strategy_name_is_refused():
    with pytest.raises(ValueError, match="unknown stock strategy"):
        get_strategy("optimistic")


@pytest.mark.django_db
def test_counters_are_loaded_from_the_database_never_invented(redis_client):
    make_items(TEA=7)
    keys = StockKeys()
    assert not redis_client.exists(keys.counter("TEA"))
    chosen = get_strategy("lua")
    chosen.reserve("o", {"TEA": 2})  # a missing counter is loaded, then decremented
    assert redis_client.get(keys.counter("TEA")) == b"5"
    with pytest.raises(InvalidQuantity):
        chosen.available("GHOST")
    assert not redis_client.exists(keys.counter("GHOST"))


@pytest.mark.django_db
def test_database_refusal_gives_the_redis_half_back(redis_client):
    # Redis believes there are 5, the database (changed behind the app) only 1.
    make_items(TEA=5)
    chosen = get_strategy("lua")
    assert chosen.available("TEA") == 5
    Item.objects.filter(code="TEA").update(on_hand=1)
    with pytest.raises(OutOfStock) as info:
        chosen.reserve("o", {"TEA": 3})
    assert info.value.available == 1  # the database's answer
    assert redis_client.get(StockKeys().counter("TEA")) == b"5"  # compensated
    assert not redis_client.exists(StockKeys().record("o"))
    assert db_stock("TEA") == 1 and not Reservation.objects.exists()
