"""Fenced writes: a paused lock holder cannot overwrite a newer holder's data.

Every lock grant carries a fencing token (``Lock.fence``) that is greater than
every earlier grant's for the same lock name. A fenced row stores the fence of
the last write; a write is applied only where the stored fence is not newer
than the writer's, in the same UPDATE, so the check cannot race the write.

    t0  A acquires "product:7" (fence 41) ... GC pause, lease runs out
    t1  B acquires "product:7" (fence 42), writes the row (fence := 42)
    t2  A wakes up and writes with fence 41 -> StaleFencingToken, row keeps B's value

That alone fails when the stale holder writes *first*, after reading a value
the newer holder also reads (both compute from the same level). A holder that
reads, then writes, claims the row before reading:

    with Lock("product:7") as lock:
        claim(Product.objects.filter(pk=7), lock.fence)      # fence := 42, autocommit
        product = Product.objects.get(pk=7)                   # read after the claim
        fenced_update(Product.objects.filter(pk=7), lock.fence, stock=product.stock - 1)

    t0  A (fence 41) claims, reads stock 1 ... paused past its lease
    t1  B (fence 42) claims (row fence := 42), reads 1, writes 0
    t2  A writes with fence 41 -> StaleFencingToken (and had A written first,
        B's claim would still see the newer state: it reads after claiming)

Claim in autocommit or a short transaction of its own, not inside a long one:
the claim's UPDATE holds the row lock until its transaction ends. When a
write can be one relative, guarded statement (``stock = stock - 1 WHERE
stock >= 1``) it needs no claim: that is what the stock strategies do.

A holder may write the same row several times under one grant (equal fences
pass). Fences are never below the Redis clock in microseconds, so fences of
different lock names on one row do not brick it (a newer grant of either name
wins); exclusion, though, holds only among holders of the same name: fence a
row by one lock name.
"""

from __future__ import annotations

from typing import Any

from django.db import models, transaction

from . import metrics
from .exceptions import StaleFencingToken


def stale(what: str, fence: int, current: int | None) -> StaleFencingToken:
    """The refusal of a write fenced by ``fence`` to ``what``, whose stored fence is
    ``current`` (counted in :mod:`stock_locks.metrics`)."""
    metrics.stale_fence()
    return StaleFencingToken(
        f"{what}: fence {fence} is older than stored {current}", fence=fence, current=current
    )


def _check_fence(fence: int) -> None:
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 1:
        raise ValueError(f"a fencing token is a positive integer, got {fence!r}")


class FencedModel(models.Model):
    """Abstract model adding the ``fence`` column that fenced writes compare against."""

    fence = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="Fencing token of the lock grant that last wrote this row.",
    )

    class Meta:
        abstract = True

    def fenced_save(self, fence: int, update_fields: list[str] | tuple[str, ...]) -> None:
        """Write ``update_fields`` of this row in one UPDATE, unless its fence is newer.

        Raises :class:`StaleFencingToken` (row unchanged) when the stored fence
        is greater than ``fence``, ``DoesNotExist`` when the row is gone.
        """
        changes = {name: getattr(self, name) for name in update_fields}
        fenced_update_row(type(self), self.pk, fence, **changes)
        self.fence = fence


def fenced_update_row(model: type[models.Model], pk: Any, fence: int, **changes: Any) -> None:
    """Write ``changes`` to the row ``pk`` in one UPDATE, unless its stored fence is newer.

    Raises :class:`StaleFencingToken` (row unchanged) when the stored fence is
    greater than ``fence``, ``model.DoesNotExist`` when the row is gone.
    """
    _check_fence(fence)
    rows = model._default_manager.filter(pk=pk)
    if rows.filter(fence__lte=fence).update(fence=fence, **changes):
        return
    current = rows.values_list("fence", flat=True).first()
    if current is None:
        raise model.DoesNotExist(f"{model.__name__} pk={pk} no longer exists")  # type: ignore[attr-defined]
    raise stale(f"{model.__name__} pk={pk}", fence, current)


def fenced_update(queryset: models.QuerySet, fence: int, **changes: Any) -> int:
    """Apply ``changes`` to every row of ``queryset``, or to none if any row is newer.

    The rows whose stored fence is not newer than ``fence`` are updated in one
    UPDATE (their fence set to ``fence``); if any row of the queryset carries a
    newer fence, the transaction is rolled back and :class:`StaleFencingToken`
    raised. Returns the number of rows written. The model must have a ``fence``
    column (see :class:`FencedModel`).
    """
    _check_fence(fence)
    with transaction.atomic(using=queryset.db):
        updated = queryset.filter(fence__lte=fence).update(fence=fence, **changes)
        newer = queryset.filter(fence__gt=fence).aggregate(m=models.Max("fence"))["m"]
        if newer is not None:
            raise stale(queryset.model.__name__, fence, newer)
    return updated


def claim(queryset: models.QuerySet, fence: int) -> int:
    """Register ``fence`` on every row of ``queryset`` before reading them.

    One UPDATE sets the rows' stored fence to ``fence``; if any row already
    carries a newer one, nothing changes and :class:`StaleFencingToken` is
    raised: a newer holder has claimed the rows, so this holder's reads are
    stale. After a claim, an older holder's :func:`fenced_update` is refused
    whatever the order of the writes. Returns the number of rows claimed.
    """
    return fenced_update(queryset, fence)
