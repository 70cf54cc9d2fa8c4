"""The app's own records. The shop's product model holds the stock (STOCK_MODEL)."""

from __future__ import annotations

from django.db import models


class Reservation(models.Model):
    """Units held for one order, by order ref: what makes reserve and release idempotent.

    A reservation is created RESERVED with the stock already taken; it ends
    COMMITTED (paid: the units stay sold) or RELEASED (the units went back).
    Moving between states is a conditional UPDATE on ``status``, so two racing
    callers (a payment and an expiry) cannot both win.
    """

    class Status(models.TextChoices):
        RESERVED = "reserved", "Reserved"
        COMMITTED = "committed", "Committed"
        RELEASED = "released", "Released"

    order_ref = models.CharField(max_length=100, unique=True)
    lines = models.JSONField(help_text="SKU -> quantity reserved.")
    strategy = models.CharField(max_length=32)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.RESERVED, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.order_ref} ({self.status})"

    @property
    def units(self) -> int:
        return sum(self.lines.values())
