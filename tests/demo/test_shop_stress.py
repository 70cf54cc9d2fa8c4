"""oversell_stress over HTTP against the live demo shop (its order API, its orders).

The command's own tests are in tests/test_stock_commands.py; these need the
shop: buyers post to its ``/api/orders/`` (the demo-only switch lets a body
pick the strategy), and its receiver of ``stress_cleanup`` forgets the orders
a run made. What a run left is read back independently of the command's tally
(tests/support/stress_runs.py).
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from demo_shop.shop.expiry import forget_stress_orders
from demo_shop.shop.models import Order, Product
from stock_locks.models import Reservation
from stock_locks.stock.stress import stress_cleanup
from tests.support.stress_runs import assert_left_nothing, redis_state, stress, watching_cleanup

NAME = ("--field", "name=Stress {sku}")  # Product.name is required (the SKU by default)


@pytest.fixture
def before_cleanup():
    """What each run left before its clean-up (tests/support/stress_runs.py)."""
    with watching_cleanup() as seen:
        yield seen


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_over_http_against_the_live_shop(
    live_server, settings, before_cleanup, redis_client
):
    settings.SHOP_STRATEGY_FROM_REQUEST = True  # the demo-only switch: the buyers pick
    redis_before = redis_state(redis_client)
    url = live_server.url + "/api/orders/"
    (result,) = stress(
        "--strategy", "lua", "--via", "http", "--url", url,
        "--stock", "20", "--buyers", "60", "--processes", "3", fields=NAME,
    )  # fmt: skip
    assert result["strategy"] == "lua"
    assert result["attempts"] == 60
    assert (result["sold"], result["refused"], result["errors"]) == (20, 40, 0)
    assert (result["oversold"], result["final_stock"], result["drift"]) == (0, 0, 0)
    assert result["sold"] + result["final_stock"] == 20
    # Every sale went through the order API: an Order per reservation, each with an expiry.
    seen = before_cleanup["lua"]
    assert seen["stock"] == {result["skus"][0]: 0}
    assert seen["reservations"] == 20
    assert all(ref.startswith("shop-STRESS-") for ref in seen["refs"])
    # Afterwards: no order, reservation, row, record or expiry item of the run.
    assert_left_nothing()
    assert not Order.objects.exists()
    assert redis_state(redis_client) == redis_before


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_over_http_says_which_rows_the_shops_orders_keep(live_server, settings):
    settings.SHOP_STRATEGY_FROM_REQUEST = True
    # A shop with no receiver that forgets its stress orders (the demo has one):
    stress_cleanup.disconnect(dispatch_uid="demo_shop.shop.forget_stress_orders")
    url = live_server.url + "/api/orders/"
    try:
        with pytest.raises(CommandError) as caught:
            stress(
                "--strategy", "db_conditional", "--via", "http", "--url", url,
                "--stock", "2", "--buyers", "4", "--processes", "2", fields=NAME,
            )  # fmt: skip
    finally:
        stress_cleanup.connect(
            forget_stress_orders, dispatch_uid="demo_shop.shop.forget_stress_orders"
        )
    message = str(caught.value)
    assert "could not remove everything" in message and "2 shop.OrderLine" in message
    assert "stress_cleanup" in message
    # The run's own data is gone; the shop's orders (and the row their lines hold) are not.
    assert not Reservation.objects.exists()
    assert Order.objects.count() == 2
    assert Product.objects.filter(sku__startswith="STRESS-").count() == 1


@pytest.mark.django_db(transaction=True)
def test_oversell_stress_over_http_says_how_to_let_the_shop_take_a_strategy(
    live_server, settings, redis_client
):
    settings.SHOP_STRATEGY_FROM_REQUEST = False  # a shop that picks its strategy itself
    url = live_server.url + "/api/orders/"
    redis_before = redis_state(redis_client)
    with pytest.raises(CommandError) as caught:
        stress(
            "--strategy", "lua", "--via", "http", "--url", url,
            "--stock", "20", "--buyers", "3000", "--processes", "2", fields=NAME,
        )  # fmt: skip
    message = str(caught.value)
    assert "SHOP_STRATEGY_FROM_REQUEST=1" in message and "--via orm" in message
    assert "errors" not in message  # not thousands of errors counted
    assert_left_nothing()
    assert redis_state(redis_client) == redis_before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fields", "name"),
    [((), "{sku}"), (NAME, "Stress {sku}")],
    ids=["sku-by-default", "field-wins"],
)
def test_oversell_stress_names_the_shops_products_after_their_sku(before_cleanup, fields, name):
    """``Product.name`` is required text without a default: a run with no ``--field``
    fills it with the SKU (it once refused to run without ``--field name={sku}``)."""
    names: dict[str, str] = {}
    before_cleanup.then(
        lambda strategy, refs, skus: names.update(
            Product.objects.filter(sku__in=skus).values_list("sku", "name")
        )
    )
    (result,) = stress(
        "--strategy", "lua", "--stock", "3", "--buyers", "6", "--processes", "2", fields=fields
    )  # fmt: skip
    assert (result["sold"], result["refused"], result["errors"]) == (3, 3, 0)
    assert (result["oversold"], result["drift"]) == (0, 0)
    (sku,) = result["skus"]
    assert names == {sku: name.format(sku=sku)}
    assert_left_nothing()
