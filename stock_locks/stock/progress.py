"""How far a sale has come per SKU: units paid for recently, from the database.

The stock row says what is left and the open reservations what is held; what
was sold is in the committed reservations. Summing every committed row would
grow with the shop's history, so the dashboard asks for a window (its chart
history, at most an hour): committed rows are found by ``(status,
updated_at)`` (an index), and on PostgreSQL summed per SKU by the database.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

from django.db import connections, router

from ..models import Reservation


def sold_since(since: dt.datetime) -> Counter[str]:
    """Units per SKU of the reservations committed (paid) at or after ``since``."""
    db = router.db_for_read(Reservation)
    connection = connections[db]
    committed = (
        Reservation.objects.using(db)
        .order_by()
        .filter(status=Reservation.Status.COMMITTED, updated_at__gte=since)
    )
    sold: Counter[str] = Counter()
    if connection.vendor == "postgresql":
        rows = committed.values_list("lines", flat=True).query
        sql, params = rows.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT line.key, SUM(line.value::bigint) FROM "
                f"({sql}) AS paid(lines), jsonb_each_text(paid.lines) AS line "
                "GROUP BY line.key",
                params,
            )
            sold.update({sku: int(units) for sku, units in cursor.fetchall()})
        return sold
    for lines in committed.values_list("lines", flat=True).iterator():
        sold.update(lines)
    return sold
