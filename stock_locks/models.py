"""The app's own records. The shop's product model holds the stock (STOCK_MODEL)."""

from __future__ import annotations

from django.conf import settings
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
    customer = models.CharField(
        max_length=150, blank=True, default="", db_default="",
        help_text="Who the units count against under purchase caps ('' for none).",
    )  # fmt: skip
    strategy = models.CharField(max_length=32)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.RESERVED, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    # Not columns: set on the object a strategy's reserve() returns (whether that
    # call made the reservation, and the optimistic retries it took).
    created: bool
    retries: int

    class Meta:
        ordering = ["-created_at"]
        # The dashboard's "sold in the last hour" (stock_locks.stock.progress).
        indexes = [
            models.Index(fields=["status", "updated_at"], name="stock_locks_status_upd"),
            models.Index(fields=["customer", "created_at"], name="stock_locks_customer"),
        ]

    def __str__(self) -> str:
        return f"{self.order_ref} ({self.status})"

    @property
    def units(self) -> int:
        return sum(self.lines.values())


class CapHold(models.Model):
    """One row per (cap, customer), locked while a reservation of theirs under that
    cap counts their units, so two carts of one customer are counted one after the
    other (stock_locks.stock.caps). Holds no figure: the reservations are the record."""

    cap = models.CharField(max_length=100)
    customer = models.CharField(max_length=150)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cap", "customer"], name="stock_locks_cap_hold")
        ]

    def __str__(self) -> str:
        return f"{self.cap} / {self.customer}"


class Dashboard(models.Model):
    """No table: carries the dashboard's permissions (like django-rq's admin page).

    ``view_dashboard`` lets staff see the page and its JSON; ``force_release``
    lets them force-release locks, evict semaphore holders, requeue or discard
    dead letters and repair stock drift.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_dashboard", "Can view the stock_locks dashboard"),
            ("force_release", "Can force-release locks and act on queues and stock"),
        ]
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"

    def __str__(self) -> str:
        return "stock_locks dashboard"


class AuditEntry(models.Model):
    """One operator action taken from the dashboard: who, what, on what, displacing whom."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150)
    action = models.CharField(max_length=40)
    target = models.CharField(max_length=300)
    displaced = models.JSONField(
        null=True, blank=True, help_text="The holder or item the action displaced, as it was."
    )
    outcome = models.CharField(max_length=300)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.username} {self.action} {self.target}"


def _default_lanes() -> list[str]:
    return ["members", "guests"]


class Event(models.Model):
    """A sale behind a waiting room (stock_locks.waitingroom): when it starts, how many
    visitors are let in and how fast, in which lanes, for which SKUs."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True, help_text="Its name in URLs and keys.")
    enabled = models.BooleanField(
        default=True, help_text="Off: every request goes through, nobody waits."
    )
    prequeue_opens = models.DateTimeField(
        null=True, blank=True,
        help_text="When visitors may start to queue (empty: any time).",
    )  # fmt: skip
    start = models.DateTimeField(
        help_text="When admission begins; earlier arrivals are shuffled then."
    )
    max_active = models.PositiveIntegerField(
        default=100, help_text="Most visitors admitted at once."
    )
    admit_per_minute = models.PositiveIntegerField(
        default=600, help_text="Most admissions per minute."
    )
    stock_factor = models.FloatField(
        default=1.0, help_text="Never more admitted at once than the units left times this."
    )
    lanes = models.JSONField(
        default=_default_lanes, help_text="Lane names, highest priority first."
    )
    skus = models.JSONField(
        default=list, blank=True,
        help_text="SKUs on sale: sold out closes the room (empty: never).",
    )  # fmt: skip
    queue_ttl = models.PositiveIntegerField(
        default=60, help_text="Seconds a waiting visitor keeps its place without polling."
    )
    session_ttl = models.PositiveIntegerField(
        default=600, help_text="Seconds an admitted visitor keeps its slot without a request."
    )

    class Meta:
        ordering = ["-start"]
        verbose_name = "waiting-room event"

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"
