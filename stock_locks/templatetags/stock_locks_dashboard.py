"""Filters of the dashboard's template: values of the snapshot as the page shows them.

``static/stock_locks/dashboard.js`` formats the JSON snapshot the same way
when it refreshes the tables (``when``, ``clock`` and ``seconds`` there), so
that a refreshed row reads exactly as the served one.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()

MISSING = "-"


def _utc(iso: str) -> dt.datetime:
    return dt.datetime.fromisoformat(iso).astimezone(dt.UTC)


@register.filter
def sl_when(iso: str | None) -> str:
    """An ISO 8601 time as ``YYYY-MM-DD HH:MM:SS`` in UTC (``-`` for none)."""
    return _utc(iso).strftime("%Y-%m-%d %H:%M:%S") if iso else MISSING


@register.filter
def sl_clock(iso: str | None) -> str:
    """An ISO 8601 time as ``HH:MM:SS`` in UTC (``-`` for none)."""
    return _utc(iso).strftime("%H:%M:%S") if iso else MISSING


@register.filter("sl_decimal")
@register.filter
def sl_seconds(seconds: float | None) -> str:
    """A duration in seconds with one decimal (``-`` for none: no expiry).

    Rounded as JavaScript's ``toFixed(1)`` rounds the same float (an exact
    tie goes up), so a refreshed row shows what the served one did.
    """
    if seconds is None:
        return MISSING
    return str(Decimal(seconds).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


@register.filter
def sl_label(name: str) -> str:
    """A figure's name as words (``stale_fence`` -> ``stale fence``)."""
    return name.replace("_", " ")


@register.simple_tag(takes_context=True)
def sl_sort(context: template.Context, order: str, label: str) -> str:
    """A column header's link that sorts the stock table by ``order`` (the page's
    other choices kept), marked when it is the current order."""
    current = context["order"] == order
    return format_html(
        '<a href="?{}"{}>{}</a>',
        context["stock_orders"][order],
        mark_safe(' class="sl-sorted" aria-current="true"') if current else "",
        label,
    )
