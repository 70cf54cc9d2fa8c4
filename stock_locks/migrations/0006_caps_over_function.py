"""PostgreSQL: the function a capped write calls in its stock decrement's WHERE
(``stock_locks.stock.caps_postgres.CAPS_OVER``). Other databases count caps in Python."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION stock_locks_caps_over(locks bigint[], limits jsonb)
RETURNS boolean LANGUAGE plpgsql VOLATILE
-- The count reads a few customers' rows: always the customer index. (On a young or
-- freshly emptied table the planner's statistics favour a sequential scan, which
-- reads every reservation of the sale for each write, and the plan is kept.)
SET enable_seqscan = off
AS $$
BEGIN
    -- The (cap, customer) locks first, in key order; the count below is a statement of
    -- its own (a VOLATILE function's statements each take a new snapshot), so it sees
    -- every reservation committed by whoever held a lock before.
    PERFORM pg_advisory_xact_lock(key) FROM unnest(locks) AS key ORDER BY key;
    RETURN EXISTS (
        SELECT 1
        FROM jsonb_to_recordset(limits)
            AS l(customer text, skus jsonb, max int, since timestamptz, units int)
        WHERE l.units + COALESCE((
            SELECT sum(u.value::int)
            FROM stock_locks_reservation h, jsonb_each_text(h.lines) u
            WHERE h.customer = l.customer AND h.status <> 'released'
                AND h.created_at >= COALESCE(l.since, '-infinity') AND l.skus ? u.key
        ), 0) > l.max
    );
END
$$;
"""
DROP = "DROP FUNCTION IF EXISTS stock_locks_caps_over(bigint[], jsonb);"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("stock_locks", "0005_waiting_room_event"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
