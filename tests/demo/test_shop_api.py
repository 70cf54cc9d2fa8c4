"""The demo shop's JSON API end to end: real PostgreSQL, real Redis, every strategy.

Orders are placed, paid and cancelled over HTTP (Django's test client); what
matters is checked where it lives: the stock column, the Order and
Reservation rows, and the Redis counters. The strategy is the server's choice:
tests that compare strategies set it (SHOP_STRATEGY) for their requests; the
demo-only switch that lets a body pick one has tests of its own.
"""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.test import Client, override_settings

from demo_shop.shop.models import Order, OrderLine, Product
from stock_locks import Lock
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from stock_locks.stock.reconcile import stock_report

STRATEGIES = ["lua", "watch", "lock", "db_row_lock", "db_conditional"]
ORDERS = "/api/orders/"


def make_products(**stock: int) -> None:
    prices = {"TEA": Decimal("3.50"), "CUP": Decimal("12.00")}
    for sku, qty in stock.items():
        Product.objects.create(
            sku=sku, name=sku.title(), price=prices.get(sku, Decimal("1.00")), stock=qty
        )


def db_stock(sku: str) -> int:
    return Product.objects.get(sku=sku).stock


def post_json(client, url: str, body, **headers):
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", headers=headers)


def order(client, items: dict[str, int], strategy: str | None = None, key: str | None = None):
    """POST an order; ``strategy``: the server is set to sell it with that strategy."""
    body: dict = {"items": [{"sku": sku, "qty": qty} for sku, qty in items.items()]}
    headers = {"Idempotency-Key": key} if key is not None else {}
    if strategy is None:
        return post_json(client, ORDERS, body, **headers)
    with override_settings(SHOP_STRATEGY=strategy):
        return post_json(client, ORDERS, body, **headers)


def pay(client, order_id: int):
    return client.post(f"{ORDERS}{order_id}/pay/")


def cancel(client, order_id: int):
    return client.post(f"{ORDERS}{order_id}/cancel/")


def assert_no_drift() -> None:
    assert [(row.sku, row.drift) for row in stock_report() if row.drift] == []


def redis_state(client) -> dict:
    """Every stock key (counters, reservation records, their index) with its value.

    Lock keys are left out: a lock's fencing counter only grows, by design.
    """
    state = {}
    for key in client.scan_iter("sl:stock:*"):
        kind = client.type(key)
        if kind == b"string":
            state[key] = client.get(key)
        elif kind == b"hash":
            state[key] = client.hgetall(key)
        elif kind == b"zset":
            state[key] = client.zrange(key, 0, -1)
        else:
            state[key] = kind
    return state


def db_state() -> dict:
    return {
        "stock": dict(Product.objects.values_list("sku", "stock")),
        "orders": sorted(Order.objects.values_list("pk", "status")),
        "lines": OrderLine.objects.count(),
        "reservations": sorted(Reservation.objects.values_list("order_ref", "status")),
    }


# -- the happy path, for every strategy -------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_order_pay_cancel_round_trip(client, strategy):
    make_products(TEA=10)

    placed = order(client, {"TEA": 2}, strategy)
    assert placed.status_code == 201, placed.content
    body = placed.json()
    order_id = body["order"]
    assert isinstance(order_id, int)
    assert body["status"] == "pending" and body["strategy"] == strategy
    assert body["items"] == [{"sku": "TEA", "qty": 2, "price": "3.50"}]
    assert db_stock("TEA") == 8
    assert Reservation.objects.get(order_ref=body["ref"]).status == "reserved"

    detail = client.get(f"{ORDERS}{order_id}/")
    assert detail.status_code == 200
    assert detail.json() == {k: v for k, v in body.items() if k != "retries"}

    paid = pay(client, order_id)
    assert paid.status_code == 200 and paid.json()["status"] == "paid"
    again = pay(client, order_id)
    assert again.status_code == 200 and again.json()["status"] == "paid"
    assert db_stock("TEA") == 8
    assert Reservation.objects.get(order_ref=body["ref"]).status == "committed"

    second = order(client, {"TEA": 3}, strategy).json()
    assert db_stock("TEA") == 5
    cancelled = cancel(client, second["order"])
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert db_stock("TEA") == 8
    again = cancel(client, second["order"])
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    assert db_stock("TEA") == 8  # not restored twice
    assert Reservation.objects.get(order_ref=second["ref"]).status == "released"

    assert db_stock("TEA") == 8
    assert dict(Order.objects.values_list("pk", "status")) == {
        order_id: "paid",
        second["order"]: "cancelled",
    }
    assert get_strategy(strategy).available("TEA") == 8
    assert_no_drift()


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["lua", "db_conditional"])
def test_paying_a_cancelled_order_is_409(client, strategy):
    make_products(TEA=10)
    placed = order(client, {"TEA": 3}, strategy).json()
    assert cancel(client, placed["order"]).status_code == 200
    response = pay(client, placed["order"])
    assert response.status_code == 409
    assert response.json()["error"] == "conflict"
    assert response.json()["status"] == "cancelled"
    assert Order.objects.get().status == "cancelled"
    assert Reservation.objects.get().status == "released"
    assert db_stock("TEA") == 10


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["lua", "db_conditional"])
def test_cancelling_a_paid_order_is_409(client, strategy):
    make_products(TEA=10)
    placed = order(client, {"TEA": 3}, strategy).json()
    assert pay(client, placed["order"]).status_code == 200
    response = cancel(client, placed["order"])
    assert response.status_code == 409
    assert response.json()["error"] == "conflict"
    assert response.json()["status"] == "paid"
    assert Order.objects.get().status == "paid"
    assert Reservation.objects.get().status == "committed"
    assert db_stock("TEA") == 7


@pytest.mark.django_db
def test_unknown_order_is_a_json_404(client):
    for missing in (999999, 10**25):  # the second is past PostgreSQL's bigint
        for response in (
            client.get(f"{ORDERS}{missing}/"),
            pay(client, missing),
            cancel(client, missing),
        ):
            assert response.status_code == 404
            assert response.json() == {"error": "not_found", "message": f"no order {missing}"}


@pytest.mark.django_db
def test_the_default_strategy_comes_from_settings(client, settings):
    make_products(TEA=10)
    assert order(client, {"TEA": 1}).json()["strategy"] == "lua"
    settings.STOCK_LOCKS = {**settings.STOCK_LOCKS, "STRATEGY": "db_conditional"}
    assert order(client, {"TEA": 1}).json()["strategy"] == "db_conditional"
    assert db_stock("TEA") == 8


# -- out of stock -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_out_of_stock_is_409_naming_the_line_and_changes_nothing(client, strategy, redis_client):
    make_products(TEA=10, CUP=3)
    assert order(client, {"TEA": 1}, strategy).status_code == 201
    get_strategy(strategy).available("CUP")  # lua, watch: counters load on demand
    before_db, before_redis = db_state(), redis_state(redis_client)

    # All or nothing: the TEA line fits, the CUP line does not.
    response = order(client, {"TEA": 4, "CUP": 5}, strategy)
    assert response.status_code == 409
    body = response.json()
    assert body["error"] == "out_of_stock"
    assert (body["sku"], body["requested"], body["available"]) == ("CUP", 5, 3)
    assert "CUP" in body["message"]

    # The line limit is 1000: asking exactly that is a refusal, not bad input.
    response = order(client, {"TEA": 1000}, strategy)
    assert response.status_code == 409
    assert {k: response.json()[k] for k in ("error", "sku", "requested", "available")} == {
        "error": "out_of_stock",
        "sku": "TEA",
        "requested": 1000,
        "available": 9,
    }

    assert db_state() == before_db
    assert redis_state(redis_client) == before_redis
    assert_no_drift()


# -- Idempotency-Key ----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["lua", "lock", "db_conditional"])
def test_idempotency_key_returns_the_first_order_and_moves_stock_once(client, strategy):
    make_products(TEA=10)
    first = order(client, {"TEA": 2}, strategy, key="checkout-7f3a:1")
    assert first.status_code == 201
    again = order(client, {"TEA": 2}, strategy, key="checkout-7f3a:1")
    assert again.status_code == 200
    assert again.json()["order"] == first.json()["order"]
    assert again.json()["items"] == first.json()["items"]
    assert db_stock("TEA") == 8
    assert Order.objects.count() == 1 and Reservation.objects.count() == 1

    # Another key is another order.
    other = order(client, {"TEA": 2}, strategy, key="checkout-7f3a:2")
    assert other.status_code == 201 and other.json()["order"] != first.json()["order"]
    assert db_stock("TEA") == 6


@pytest.mark.django_db
@pytest.mark.parametrize(
    "key", ["has space", "k" * 81, "", "semi;colon", "caf\u00e9", "newline\n", "nul\x00", "\udc80"]
)
def test_malformed_idempotency_key_is_400_and_changes_nothing(client, key, redis_client):
    make_products(TEA=10)
    before_db, before_redis = db_state(), redis_state(redis_client)
    body = {"items": [{"sku": "TEA", "qty": 1}]}
    response = client.post(
        ORDERS, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert response.status_code == 400
    assert response.json()["error"] == "bad_request"
    assert "Idempotency-Key" in response.json()["message"]
    assert db_state() == before_db
    assert redis_state(redis_client) == before_redis


@pytest.mark.django_db
def test_longest_idempotency_key_is_accepted(client):
    make_products(TEA=10)
    assert order(client, {"TEA": 1}, key="k" * 80).status_code == 201
    assert order(client, {"TEA": 1}, key="k" * 80).status_code == 200
    assert db_stock("TEA") == 9


@pytest.mark.django_db
def test_idempotency_key_reused_for_another_cart_is_refused(client):
    make_products(TEA=10, CUP=5)
    first = order(client, {"TEA": 2}, "lua", key="reused")
    assert first.status_code == 201
    response = order(client, {"CUP": 5}, "lua", key="reused")
    # The strategies refuse an order ref reused for other lines (ReservationError ->
    # 409 "conflict"); the HTTP layer should too, not claim the CUPs were bought.
    assert response.status_code in (409, 422), response.json()
    assert (db_stock("TEA"), db_stock("CUP")) == (8, 5)


# -- bad input ------------------------------------------------------------------------------

OVERSIZE = [f"BULK{i:02}" for i in range(51)]


def _items(*lines) -> dict:
    return {"items": [dict(line) for line in lines]}


# (case id, body, what the message must say, extra fields of the JSON answer)
BAD_BODIES = [
    ("malformed-json", b'{"items": [', "not valid JSON", {}),
    ("empty-body", b"", "not valid JSON", {}),
    ("not-utf8", b'{"items": "\xff"}', "not valid JSON", {}),
    ("json-list", b'[{"sku": "TEA", "qty": 1}]', "JSON object", {}),
    ("json-string", b'"TEA"', "JSON object", {}),
    ("missing-items", {}, '"items" must be a non-empty list', {}),
    ("items-not-a-list", {"items": {"sku": "TEA", "qty": 1}}, '"items" must be a non-empty', {}),
    ("empty-items", {"items": []}, '"items" must be a non-empty list', {}),
    ("item-not-an-object", {"items": ["TEA"]}, "items[0] must be an object", {}),
    ("missing-sku", _items({"qty": 1}), "items[0].sku must be a non-empty string", {}),
    ("empty-sku", _items({"sku": "", "qty": 1}), "items[0].sku must be a non-empty", {}),
    ("sku-not-a-string", _items({"sku": 7, "qty": 1}), "items[0].sku must be a non-empty", {}),
    (
        "missing-qty",
        _items({"sku": "TEA", "qty": 1}, {"sku": "CUP"}),
        "items[1] (CUP) has no qty",
        {},
    ),
    ("qty-true", _items({"sku": "TEA", "qty": True}), "must be an integer, got True", {}),
    ("qty-string", _items({"sku": "TEA", "qty": "2"}), "must be an integer, got '2'", {}),
    ("qty-float", _items({"sku": "TEA", "qty": 1.5}), "must be an integer, got 1.5", {}),
    ("qty-null", _items({"sku": "TEA", "qty": None}), "must be an integer, got None", {}),
    ("qty-zero", _items({"sku": "TEA", "qty": 0}), "between 1 and 1000, got 0", {}),
    ("qty-negative", _items({"sku": "TEA", "qty": -3}), "between 1 and 1000, got -3", {}),
    ("qty-over-limit", _items({"sku": "TEA", "qty": 1001}), "between 1 and 1000, got 1001", {}),
    (
        "same-sku-twice",
        _items({"sku": "TEA", "qty": 1}, {"sku": "TEA", "qty": 2}),
        "'TEA' appears twice",
        {},
    ),
    ("unknown-sku", _items({"sku": "NOPE", "qty": 1}), "unknown SKU 'NOPE'", {"sku": "NOPE"}),
    (
        "unknown-sku-after-a-known-one",
        _items({"sku": "TEA", "qty": 1}, {"sku": "ZZZ", "qty": 1}),
        "unknown SKU 'ZZZ'",
        {"sku": "ZZZ"},
    ),
    ("sku-too-long", _items({"sku": "S" * 101, "qty": 1}), "at most 100 characters", {}),
    (
        "oversize-cart",
        _items(*({"sku": sku, "qty": 1} for sku in OVERSIZE)),
        "the cart has 51 lines; at most 50 are allowed",
        {},
    ),
    # What no database or Redis client can store: a clear 400, never a 500.
    ("sku-lone-surrogate", b'{"items": [{"sku": "\\ud800", "qty": 1}]}', "a SKU cannot hold", {}),
    ("sku-nul", b'{"items": [{"sku": "TE\\u0000A", "qty": 1}]}', "a SKU cannot hold", {}),
    ("sku-control", b'{"items": [{"sku": "TEA\\n", "qty": 1}]}', "a SKU cannot hold", {}),
    (
        "sku-surrogate-after-a-good-line",
        b'{"items": [{"sku": "TEA", "qty": 1}, {"sku": "\\udfff", "qty": 1}]}',
        "items[1].sku has a character",
        {},
    ),
    (
        "strategy-in-the-body",
        {**_items({"sku": "TEA", "qty": 1}), "strategy": "lua"},
        'remove "strategy"',
        {},
    ),
]


@pytest.fixture
def shop_with_history(client, redis_client):
    """Products, one real order per strategy, and (for Redis strategies) loaded counters."""

    def build(strategy: str) -> None:
        make_products(TEA=10, CUP=5)
        Product.objects.bulk_create(Product(sku=sku, name=sku, stock=1) for sku in OVERSIZE)
        assert order(client, {"TEA": 1}, strategy).status_code == 201
        get_strategy(strategy).available("CUP")  # loads the CUP counter for lua

    return build


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["lua", "db_conditional"])
@pytest.mark.parametrize(
    ("body", "says", "extra"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
def test_bad_input_is_400_with_a_message_and_changes_nothing(
    client, redis_client, shop_with_history, strategy, body, says, extra
):
    shop_with_history(strategy)
    if strategy == "lua":
        keys = StockKeys()
        assert redis_client.get(keys.counter("TEA")) == b"9"
        assert redis_client.get(keys.counter("CUP")) == b"5"
    before_db, before_redis = db_state(), redis_state(redis_client)

    with override_settings(SHOP_STRATEGY=strategy):
        response = post_json(client, ORDERS, body)

    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["error"] == "bad_request"
    assert says in answer["message"], answer["message"]
    assert {k: answer[k] for k in extra} == extra
    assert db_state() == before_db
    assert redis_state(redis_client) == before_redis


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["lua", "db_conditional"])
def test_a_cart_of_exactly_max_lines_is_accepted(client, strategy):
    skus = OVERSIZE[:50]
    Product.objects.bulk_create(Product(sku=sku, name=sku, stock=1) for sku in skus)
    response = order(client, dict.fromkeys(skus, 1), strategy)
    assert response.status_code == 201, response.content
    assert len(response.json()["items"]) == 50
    assert set(Product.objects.values_list("stock", flat=True)) == {0}
    assert_no_drift()


@pytest.mark.django_db
def test_deeply_nested_json_is_400(client):
    make_products(TEA=10)
    response = post_json(client, ORDERS, b'{"items": ' + b"[" * 100_000)
    assert response.status_code == 400
    assert response.json()["error"] == "bad_request"
    assert db_stock("TEA") == 10


@pytest.mark.django_db
@pytest.mark.parametrize("sku", ["\ud800", "TE\x00A"], ids=["lone-surrogate", "nul"])
def test_a_bad_sku_with_an_idempotency_key_is_400_and_the_key_stays_free(client, sku):
    make_products(TEA=10)
    body = {"items": [{"sku": sku, "qty": 1}]}
    data = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as \ud800
    response = post_json(client, ORDERS, data, **{"Idempotency-Key": "retry-me"})
    assert response.status_code == 400, response.content
    assert "a SKU cannot hold" in response.json()["message"]
    assert Order.objects.count() == 0 and Reservation.objects.count() == 0
    # The key was not used up: the corrected cart goes through under it.
    assert order(client, {"TEA": 1}, key="retry-me").status_code == 201
    assert db_stock("TEA") == 9


# -- the strategy is the server's decision ------------------------------------------------

# Values of "strategy" that must never be read as "the default".
NOT_A_STRATEGY = [[], "", 0, False, None, "nope", 5, {"name": "lua"}, "LUA"]


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["lua", "watch", *NOT_A_STRATEGY], ids=repr)
def test_a_body_naming_a_strategy_is_400_unless_the_demo_switch_is_on(client, redis_client, value):
    make_products(TEA=10)
    before_db, before_redis = db_state(), redis_state(redis_client)
    response = post_json(client, ORDERS, {**_items({"sku": "TEA", "qty": 1}), "strategy": value})
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "bad_request"
    assert (
        'chooses the stock strategy itself (settings); remove "strategy"'
        in (response.json()["message"])
    )
    assert db_state() == before_db
    assert redis_state(redis_client) == before_redis


@pytest.mark.django_db
@pytest.mark.parametrize("value", NOT_A_STRATEGY, ids=repr)
def test_with_the_demo_switch_a_falsy_or_unknown_strategy_is_400_not_the_default(
    client, settings, redis_client, value
):
    settings.SHOP_STRATEGY_FROM_REQUEST = True
    make_products(TEA=10)
    before_db, before_redis = db_state(), redis_state(redis_client)
    response = post_json(client, ORDERS, {**_items({"sku": "TEA", "qty": 1}), "strategy": value})
    assert response.status_code == 400, response.content
    assert response.json()["message"].startswith(f"unknown strategy {value!r}; choose one of")
    assert db_state() == before_db
    assert redis_state(redis_client) == before_redis


@pytest.mark.django_db
def test_with_the_demo_switch_the_body_picks_the_strategy(client, settings):
    settings.SHOP_STRATEGY_FROM_REQUEST = True
    settings.SHOP_SKU_STRATEGIES = {"TEA": "lua"}
    make_products(TEA=10)
    for name in STRATEGIES:  # the request's pick overrides the settings (demo only)
        body = {**_items({"sku": "TEA", "qty": 1}), "strategy": name}
        response = post_json(client, ORDERS, body)
        assert response.status_code == 201, response.content
        assert response.json()["strategy"] == name
    assert order(client, {"TEA": 1}).json()["strategy"] == "lua"  # none named: the settings'
    assert db_stock("TEA") == 4
    assert sorted(Reservation.objects.values_list("strategy", flat=True)) == sorted(
        [*STRATEGIES, "lua"]
    )


@pytest.mark.django_db
def test_per_sku_strategies_and_a_cart_mixing_them_is_400(client, settings, redis_client):
    settings.SHOP_STRATEGY = "watch"
    settings.SHOP_SKU_STRATEGIES = {"CUP": "db_conditional"}
    make_products(TEA=10, CUP=5)
    assert order(client, {"TEA": 1}).json()["strategy"] == "watch"
    assert order(client, {"CUP": 1}).json()["strategy"] == "db_conditional"
    before_db, before_redis = db_state(), redis_state(redis_client)

    response = order(client, {"TEA": 1, "CUP": 1})
    assert response.status_code == 400
    assert response.json()["message"] == (
        "the cart mixes SKUs sold by different stock strategies "
        "(CUP: db_conditional, TEA: watch); order them separately"
    )
    assert db_state() == before_db
    assert redis_state(redis_client) == before_redis

    settings.SHOP_SKU_STRATEGIES = {"CUP": "watch"}  # one strategy again: one order
    assert order(client, {"TEA": 1, "CUP": 1}).json()["strategy"] == "watch"
    assert (db_stock("TEA"), db_stock("CUP")) == (8, 3)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"SHOP_STRATEGY": "fast"}, "SHOP_STRATEGY = 'fast' is not a stock strategy"),
        (
            {"SHOP_SKU_STRATEGIES": {"TEA": "lua", "CUP": "redis"}},
            "SHOP_SKU_STRATEGIES['CUP'] = 'redis' is not a stock strategy",
        ),
        ({"SHOP_SKU_STRATEGIES": ["lua"]}, "SHOP_SKU_STRATEGIES must map SKU to strategy name"),
    ],
)
def test_system_check_names_a_strategy_setting_that_is_not_a_strategy(overrides, says):
    assert [e for e in checks.run_checks() if e.id == "shop.E001"] == []
    with override_settings(**overrides):
        errors = [e for e in checks.run_checks() if e.id == "shop.E001"]
    assert [e.msg for e in errors] == [says]


# -- a stale fence is a 409, never a 500 ----------------------------------------------------


@pytest.mark.django_db
def test_stale_fencing_token_is_409_and_changes_nothing(client, redis_client):
    make_products(TEA=10)
    placed = order(client, {"TEA": 2}, "lock").json()
    # A newer writer (a fence far in the future) has fenced the row since.
    Product.objects.filter(sku="TEA").update(fence=2**62)
    before_db, before_redis = db_state(), redis_state(redis_client)

    response = order(client, {"TEA": 1}, "lock")
    assert response.status_code == 409, response.content
    assert response.json()["error"] == "stale_fence"
    assert "nothing changed" in response.json()["message"]
    assert db_state() == before_db
    assert redis_state(redis_client) == before_redis
    assert Order.objects.get().ref == placed["ref"]


# -- Redis down, then back empty --------------------------------------------------------------


@pytest.mark.django_db
def test_redis_down_is_503_and_changes_nothing_then_back_empty_nothing_drifts(
    client, redis_factory, use_redis
):
    server = redis_factory()
    use_redis(server)
    private = server.client()
    make_products(TEA=10, CUP=5)
    before_crash = order(client, {"TEA": 2}, "lua").json()
    assert db_stock("TEA") == 8

    server.kill()
    before = db_state()
    for strategy in ("lua", "watch", "lock"):
        response = order(client, {"TEA": 1, "CUP": 1}, strategy)
        assert response.status_code == 503, (strategy, response.content)
        assert response["Retry-After"] == "1"
        assert response.json()["error"] == "unavailable"
        assert "Redis" in response.json()["message"]
    for locked_action in (pay, cancel):  # both are @locked("order:{order_id}")
        response = locked_action(client, before_crash["order"])
        assert response.status_code == 503
        assert response.json()["error"] == "unavailable"
        assert response.json()["lock"] == f"order:{before_crash['order']}"
    assert db_state() == before
    assert Order.objects.get().status == "pending"
    assert Reservation.objects.get().status == "reserved"

    # Redis comes back with nothing in it. The app notices (its loaded marker is
    # gone) and rebuilds the counters and the open reservations' records from the
    # database, so cancelling the crashed-over order gives its units back in both,
    # and nobody has to run reconcile_stock --fix.
    server.restart()
    after_crash = order(client, {"TEA": 1}, "lua")
    assert after_crash.status_code == 201
    assert private.get(StockKeys().counter("TEA")) == b"7"
    assert cancel(client, before_crash["order"]).json()["status"] == "cancelled"
    assert db_stock("TEA") == 9
    assert private.get(StockKeys().counter("TEA")) == b"9"

    out = StringIO()
    call_command("reconcile_stock", "--json", stdout=out)  # exit 0: no drift
    report = json.loads(out.getvalue())
    assert {row["sku"]: row["drift"] for row in report} == {"CUP": 0, "TEA": 0}

    assert cancel(client, after_crash.json()["order"]).status_code == 200
    assert db_stock("TEA") == 10
    assert private.get(StockKeys().counter("TEA")) == b"10"
    call_command("reconcile_stock", stdout=StringIO())


# -- the pay and cancel views hold the order's lock ---------------------------------------------


@pytest.mark.django_db
def test_pay_and_cancel_answer_423_while_the_order_lock_is_held(client, settings):
    make_products(TEA=10)
    placed = order(client, {"TEA": 2}).json()
    order_id = placed["order"]
    name = f"order:{order_id}"
    settings.STOCK_LOCKS = {**settings.STOCK_LOCKS, "DECORATOR_TIMEOUT": 0.3}

    with Lock(name, ttl=30):
        # Each waits out the views' lock timeout; neither touches the database first.
        responses = [action(Client(), order_id) for action in (pay, cancel)]
    for response in responses:
        assert response.status_code == 423
        assert response["Retry-After"] == "1"
        body = response.json()
        assert body["error"] == "locked" and body["lock"] == name
    assert Order.objects.get(pk=order_id).status == "pending"
    assert Reservation.objects.get(order_ref=placed["ref"]).status == "reserved"
    assert db_stock("TEA") == 8

    assert pay(client, order_id).json()["status"] == "paid"  # free again once released


# -- products and the HTML page -------------------------------------------------------------------


@pytest.mark.django_db
def test_products_api_lists_sku_name_price_and_stock(client):
    make_products(TEA=10, CUP=3)
    response = client.get("/api/products/")
    assert response.status_code == 200
    assert response.json() == {
        "products": [
            {"sku": "CUP", "name": "Cup", "price": "12.00", "stock": 3},
            {"sku": "TEA", "name": "Tea", "price": "3.50", "stock": 10},
        ]
    }
    order(client, {"CUP": 1})
    assert [p["stock"] for p in client.get("/api/products/").json()["products"]] == [2, 10]
    assert client.post("/api/products/").status_code == 405
    assert client.get(ORDERS).status_code == 405


@pytest.mark.django_db
def test_shop_page_lists_every_product(client):
    make_products(TEA=10, CUP=3)
    Product.objects.create(sku="MUG-<b>", name="Mug", stock=1)
    response = client.get("/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    for sku in ("TEA", "CUP", "MUG-&lt;b&gt;"):
        assert sku in page
    assert "MUG-<b>" not in page  # escaped


@pytest.mark.django_db
def test_shop_page_offers_a_strategy_picker_only_under_the_demo_switch(client, settings):
    make_products(TEA=10)
    page = client.get("/").content.decode()
    assert '<select id="strategy">' not in page
    assert "chosen by the shop (default <code>lua</code>)" in page

    settings.SHOP_STRATEGY_FROM_REQUEST = True
    settings.SHOP_STRATEGY = "watch"
    page = client.get("/").content.decode()
    assert '<select id="strategy">' in page
    assert "<option selected>watch</option>" in page
    assert all(f">{name}</option>" in page for name in STRATEGIES)


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_cart_past_the_kettle_cap_is_a_409_with_the_details_and_changes_nothing(
    strategy, redis_client
):
    make_products(KETTLE=5, TEA=10)
    alice, bob = Client(), Client()
    first = order(alice, {"KETTLE": 1}, strategy)
    assert first.status_code == 201
    before_db = db_state()
    refused = order(alice, {"KETTLE": 1, "TEA": 2}, strategy)
    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "cap_exceeded"
    assert (body["cap"], body["limit"], body["bought"], body["requested"]) == (
        "kettle-limit", 1, 1, 1
    )  # fmt: skip
    assert db_state() == before_db and db_stock("TEA") == 10  # all or nothing
    assert order(bob, {"KETTLE": 1}, strategy).status_code == 201  # another customer
    # A guest naming an e-mail is one customer whatever the session.
    guest = {"X-Customer-Email": "Carol@example.com"}
    body = {"items": [{"sku": "KETTLE", "qty": 1}]}
    with override_settings(SHOP_STRATEGY=strategy):
        assert post_json(Client(), ORDERS, body, **guest).status_code == 201
        assert post_json(Client(), ORDERS, body, **guest).json()["error"] == "cap_exceeded"
    # Cancelling gives the allowance back.
    assert cancel(alice, first.json()["order"]).status_code == 200
    assert order(alice, {"KETTLE": 1}, strategy).status_code == 201
    assert db_stock("KETTLE") == 2
    assert_no_drift()
