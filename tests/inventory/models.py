"""A stock model that is not the demo's: other names, renamed columns, a required field.

Library tests configure stock_locks with it (``INVENTORY``, the suite's
settings) to prove nothing in the library assumes the demo shop's
``Product(sku, stock)``.
"""

from django.db import models

from stock_locks.fencing import FencedModel
from tests.inventory import INVENTORY

__all__ = ["INVENTORY", "Item", "NumberedItem", "PlainItem", "PricedItem"]


class Item(FencedModel):
    code = models.CharField(max_length=40, unique=True, db_column="item_code")
    on_hand = models.IntegerField(db_column="qty_on_hand")
    title = models.CharField(max_length=100)  # required, no default
    # At most this many per customer (STOCK_LOCKS["STOCK_CAP_FIELD"]; NULL: no cap).
    per_customer = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.code} ({self.on_hand} on hand)"

    class Meta:
        db_table = "inventory_items"
        constraints = [
            models.CheckConstraint(condition=models.Q(on_hand__gte=0), name="item_on_hand_gte_0")
        ]


class NumberedItem(models.Model):
    """SKUs as integers: refused by the system checks (E006)."""

    number = models.IntegerField(unique=True)
    on_hand = models.IntegerField()

    def __str__(self) -> str:
        return str(self.number)


class PlainItem(models.Model):
    """No fence column: the lock strategy cannot sell it (E007 / W002)."""

    code = models.CharField(max_length=40, unique=True)
    on_hand = models.IntegerField()

    def __str__(self) -> str:
        return self.code


class PricedItem(FencedModel):
    """A required field that is not text (a price): the stress run cannot make it up, so
    ``oversell_stress`` needs ``--field price=...`` (the title it fills with the SKU)."""

    code = models.CharField(max_length=40, unique=True)
    on_hand = models.IntegerField()
    title = models.CharField(max_length=100)  # required text
    price = models.DecimalField(max_digits=8, decimal_places=2)  # required, no default

    def __str__(self) -> str:
        return self.code
