"""Stock that changes outside the strategies: make it sellable at once, without racing sales.

Redis counters are a cache of the stock column. Code that changes the column
behind the strategies (an admin edit, a fixture, ``queryset.update()``, a
data migration, another service) leaves them stale until they are told:

- :func:`restock` is the one call for code that adds or removes units: a
  relative write on both sides (``stock = stock + n`` in the database,
  ``INCRBY n`` on a loaded counter), so it cannot wipe a sale in flight;
- :func:`stock_changed` re-measures SKUs whose column was written some other
  way and corrects their counters by the measured drift (relative, refused
  and measured again while a sale moves the counter). A ``post_save`` /
  ``post_delete`` receiver on the stock model calls it after the commit, so
  the admin and ``loaddata`` need nothing;
- whatever neither saw (a data migration, raw SQL) the sweeper corrects on
  its next run.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from django.db import models, transaction
from django.db.models.signals import post_delete, post_save

from .. import scripts
from ..backends.redis.client import get_redis
from ..backends.redis.errors import REDIS_ERRORS
from ..conf import settings
from ..exceptions import InvalidQuantity, OutOfStock
from ..keys import StockKeys
from .cart import check_text, unknown_sku
from .reconcile.repair import correct_counters
from .reconcile.restore import load_missing_counters
from .soldout import units_back
from .table import StockTable

log = logging.getLogger("stock_locks.stock.sync")

SYNC_ATTEMPTS = 5
SYNC_BACKOFF = 0.005  # seconds, doubled per attempt, jittered


def restock(sku: str, units: int) -> int:
    """Add ``units`` (negative: remove) to ``sku``'s stock; returns the database's new level.

    One relative, guarded UPDATE (removing more than is in stock raises
    :class:`OutOfStock` and changes nothing), then the same amount on the
    Redis counter if it is loaded (a counter not loaded reads the database
    when it is). Safe during a sale. If Redis cannot be reached after the
    database write, the sweeper corrects the counter; nothing is lost.
    Raises :class:`InvalidQuantity` for an unknown SKU or a non-integer amount.
    """
    check_text(sku, "a SKU", 100)
    if isinstance(units, bool) or not isinstance(units, int) or units == 0:
        raise InvalidQuantity(f"units must be a non-zero integer, got {units!r}", sku=sku)
    stock = StockTable()
    try:
        # Loaded first: a counter a lazy loader sets after our write would already
        # hold it, and our INCRBY below would count it twice.
        load_missing_counters([sku])
    except REDIS_ERRORS as exc:
        log.info("restock of %r: Redis unreachable before the write (%s)", sku, exc)
    with transaction.atomic():
        rows = stock.objects.filter(**{stock.sku: sku})
        if units < 0:
            rows = rows.filter(**{f"{stock.qty}__gte": -units})
        if not rows.update(**{stock.qty: models.F(stock.qty) + units}):
            level = stock.levels([sku]).get(sku)
            if level is None:
                raise unknown_sku(sku)
            raise OutOfStock(sku, -units, level)
        level = stock.level(sku)
    try:
        _incr_if_loaded(sku, units)
    except REDIS_ERRORS as exc:
        log.warning("restocked %r by %d; Redis unreachable (%s): the sweeper corrects it",
                    sku, units, exc)  # fmt: skip
    return level


def _incr_if_loaded(sku: str, units: int) -> None:
    keys = StockKeys()
    scripts.STOCK_CORRECT([keys.versions, keys.counter(sku)], [sku, "", units], client=get_redis())
    if units > 0:
        units_back([sku])


def stock_changed(*skus: str) -> bool:
    """Bring the counters of ``skus`` in line with the database after a write the
    strategies did not make. True when every counter is in line (or not loaded);
    False when a SKU kept moving and is left to the sweeper. Safe during sales."""
    pending = sorted(set(skus))
    for attempt in range(SYNC_ATTEMPTS):
        try:
            pending = correct_counters(skus=pending, expected=True).unsettled
        except REDIS_ERRORS as exc:
            log.warning("stock of %s changed; Redis unreachable (%s): the sweeper corrects it",
                        pending, exc)  # fmt: skip
            return False
        if not pending:
            return True
        time.sleep(random.uniform(0, SYNC_BACKOFF * 2**attempt))
    log.info("stock of %s changed during a sale; the sweeper corrects it", pending)
    return False


def _after_save(sender: Any, instance: Any, **kwargs: Any) -> None:
    if sender._meta.label != settings.STOCK_MODEL:
        return
    sku = getattr(instance, settings.STOCK_SKU_FIELD, None)
    if sku is not None:
        transaction.on_commit(lambda: stock_changed(str(sku)))


def connect_signals() -> None:
    """Follow saves and deletes of the stock model (called from ``AppConfig.ready``).

    Connected for every sender and filtered by ``STOCK_MODEL`` at each call, so
    a settings change (tests, ``override_settings``) is followed too.
    """
    post_save.connect(_after_save, dispatch_uid="stock_locks.stock_saved")
    post_delete.connect(_after_save, dispatch_uid="stock_locks.stock_deleted")
