import logging
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_shop.settings")
application = get_wsgi_application()


def _warm_up() -> None:
    """Each gunicorn worker imports this module after its fork (the demo does not
    preload): open the shop's stock strategies' connections and listeners now rather
    than in the worker's first request. One that cannot reach them yet opens them when
    first needed."""
    from django.conf import settings

    from demo_shop.shop.services import default_strategy
    from stock_locks.stock import get_strategy

    per_sku = getattr(settings, "SHOP_SKU_STRATEGIES", None) or {}
    for name in sorted({default_strategy(), *per_sku.values()}):
        try:
            get_strategy(name).warm_up()
        except Exception as exc:  # noqa: BLE001 (a shop starts without Redis, and says so)
            logging.getLogger("demo_shop").warning("stock strategy %s not warmed up: %s", name, exc)


_warm_up()
