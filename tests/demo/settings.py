"""Settings of the demo's tests (tests/demo): the suite's, with the demo shop's own on top.

The demo shop sells its ``shop.Product(sku, stock)`` under its own URLs and
shop settings. One settings module serves a pytest run, so the test process
switches to ``DEMO`` per test (tests/demo/conftest.py); processes a demo test
spawns start with this module (``DJANGO_SETTINGS_MODULE``) and get the same.
"""

from demo_shop import settings as demo
from tests.settings import *  # noqa: F403
from tests.settings import STOCK_LOCKS

DEMO = {
    "ROOT_URLCONF": demo.ROOT_URLCONF,
    # The demo's STOCK_LOCKS, with the suite's visibility timeout (set per process).
    "STOCK_LOCKS": {
        **demo.STOCK_LOCKS,
        "DELAY_QUEUE_VISIBILITY": STOCK_LOCKS["DELAY_QUEUE_VISIBILITY"],
    },
    "ORDER_TTL": demo.ORDER_TTL,
    "SHOP_STRATEGY": demo.SHOP_STRATEGY,
    "SHOP_SKU_STRATEGIES": demo.SHOP_SKU_STRATEGIES,
    "SHOP_STRATEGY_FROM_REQUEST": demo.SHOP_STRATEGY_FROM_REQUEST,
}

globals().update(DEMO)
