"""PostgreSQL: ``stock_locks_caps_over()`` (migration 0006) planned once per
connection, and counting a cap's SKUs by key instead of expanding every line.

- ``plan_cache_mode = force_generic_plan``: PL/pgSQL planned the count anew for a
  connection's first five calls (its arguments are parameters, and PostgreSQL tries
  custom plans first); the plan never depends on them, so it is made once.
- ``skus text[]`` and ``lines ->> sku``: the cap's few SKUs are looked up in each
  reservation's lines, where ``jsonb_each_text`` built a row per line to filter.
"""

from importlib import import_module

from django.db import migrations

BEFORE = import_module("stock_locks.migrations.0006_caps_over_function").CREATE

CREATE = """
CREATE OR REPLACE FUNCTION stock_locks_caps_over(locks bigint[], limits jsonb)
RETURNS boolean LANGUAGE plpgsql VOLATILE
-- The count reads a few customers' rows: always the customer index. (On a young or
-- freshly emptied table the planner's statistics favour a sequential scan, which
-- reads every reservation of the sale for each write, and the plan is kept.)
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- The (cap, customer) locks first, in key order; the count below is a statement of
    -- its own (a VOLATILE function's statements each take a new snapshot), so it sees
    -- every reservation committed by whoever held a lock before.
    PERFORM pg_advisory_xact_lock(key) FROM unnest(locks) AS key ORDER BY key;
    RETURN EXISTS (
        SELECT 1
        FROM jsonb_to_recordset(limits)
            AS l(customer text, skus text[], max int, since timestamptz, units int)
        WHERE l.units + COALESCE((
            SELECT sum((h.lines ->> sku)::int)
            FROM stock_locks_reservation h, unnest(l.skus) AS sku
            WHERE h.customer = l.customer AND h.status <> 'released'
                AND h.created_at >= COALESCE(l.since, '-infinity')
        ), 0) > l.max
    );
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BEFORE)


class Migration(migrations.Migration):
    dependencies = [
        ("stock_locks", "0006_caps_over_function"),
    ]

    operations = [migrations.RunPython(create, restore, elidable=False)]
