from django.db import models

from stock_locks.fencing import FencedModel


class Product(FencedModel):
    """A thing for sale. ``stock`` is the system of record for what is left."""

    sku = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    price = models.DecimalField(max_digits=10, decimal_places=2, default=0)
    stock = models.IntegerField(default=0)

    class Meta:
        ordering = ["sku"]
        constraints = [
            models.CheckConstraint(condition=models.Q(stock__gte=0), name="product_stock_gte_0"),
        ]

    def __str__(self) -> str:
        return f"{self.sku} ({self.stock} left)"
