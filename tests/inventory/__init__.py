"""A stock model that is not the demo's: the app the library's tests sell (``models.Item``).

``INVENTORY`` is what points stock_locks at it (the suite's settings use it;
it lives here, not in ``models``, so that a settings module can import it).
"""

INVENTORY = {
    "STOCK_MODEL": "inventory.Item",
    "STOCK_SKU_FIELD": "code",
    "STOCK_QUANTITY_FIELD": "on_hand",
}
