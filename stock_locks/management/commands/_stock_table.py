"""Shared output of the stock commands: a table or JSON of per-SKU stock."""

from __future__ import annotations

import json

from django.core.management.base import CommandError

from ...stock.reconcile import SkuStock

COLUMNS = ("sku", "db", "redis", "reserved", "in_flight", "drift")


def render(rows: list[SkuStock], as_json: bool) -> str:
    if as_json:
        return json.dumps([row.as_dict() for row in rows])
    cells = [COLUMNS] + [
        (
            r.sku,
            str(r.db),
            "-" if r.redis is None else str(r.redis),
            str(r.reserved),
            str(r.in_flight),
            str(r.drift) if r.settled else "moving",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]
    return "\n".join(lines)


def check_known(asked: list[str], rows: list[SkuStock]) -> None:
    """CommandError when SKUs named on the command line do not exist."""
    unknown = sorted(set(asked) - {row.sku for row in rows})
    if unknown:
        raise CommandError(f"unknown SKU(s): {', '.join(unknown)}")
