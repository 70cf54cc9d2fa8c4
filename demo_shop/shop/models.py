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


class Order(models.Model):
    """A customer's order. ``ref`` is the stock reservation's order ref (and idempotency key)."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending payment"
        PAID = "paid", "Paid"
        CANCELLED = "cancelled", "Cancelled"
        EXPIRED = "expired", "Expired"

    ref = models.CharField(max_length=100, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    strategy = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Unpaid after this: expired."
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"order {self.pk} ({self.status})"

    def as_dict(self) -> dict:
        return {
            "order": self.pk,
            "ref": self.ref,
            "status": self.status,
            "strategy": self.strategy,
            "items": [
                {"sku": line.sku, "qty": line.qty, "price": str(line.price)}
                for line in self.lines.all()
            ],
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
        }


class OrderLine(models.Model):
    order = models.ForeignKey(Order, related_name="lines", on_delete=models.CASCADE)
    product = models.ForeignKey(Product, related_name="+", on_delete=models.PROTECT)
    sku = models.CharField(max_length=64)
    qty = models.PositiveIntegerField()
    price = models.DecimalField(max_digits=10, decimal_places=2)

    class Meta:
        ordering = ["sku"]

    def __str__(self) -> str:
        return f"{self.qty} x {self.sku}"
