from django.core.management.base import BaseCommand, CommandError

from ...stock.reconcile import cap_usage_report, fix_drift, repair_cap_usage, stock_report
from ._stock_table import check_known, render


class Command(BaseCommand):
    help = (
        "Report per-SKU drift between Redis counters and the database, counting work in "
        "flight (a SKU that keeps moving is shown as 'moving', not as drift); exit 1 on "
        "drift. Purchase-cap usage in Redis is compared with the reservations too. --fix "
        "repairs both, safe during sales."
    )

    def add_arguments(self, parser):
        parser.add_argument("skus", nargs="*", help="only these SKUs (default: all)")
        parser.add_argument("--fix", action="store_true", help="repair drift from the database")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def handle(self, *args, skus: list[str], fix: bool, json: bool, **options):
        report = stock_report(skus or None)
        check_known(skus, report)
        if fix:
            settled, fixed = fix_drift(skus or None)
            if not json:
                self.stderr.write(
                    f"settled {len(settled)} Redis reservation record(s); "
                    f"corrected {len(fixed)} counter(s) from the database"
                )
            report = stock_report(skus or None)
            if fixed_caps := repair_cap_usage():
                self.stderr.write(f"repaired the cap usage of {len(fixed_caps)} customer(s)")
        self.stdout.write(render(report, json))
        caps = [usage for usage in cap_usage_report() if usage.stale or usage.missing]
        for usage in caps[:20]:
            self.stderr.write(
                f"cap {usage.cap!r}, customer {usage.customer!r}: Redis counts {usage.redis} "
                f"({usage.in_flight} in flight), the database {usage.db}; stale "
                f"{usage.stale[:5]}, missing {sorted(usage.missing)[:5]}"
            )
        drifting = [row.sku for row in report if row.drift]
        if drifting:
            raise CommandError(f"drift on {len(drifting)} SKU(s): {', '.join(drifting[:20])}")
        if caps:
            raise CommandError(f"cap usage drift for {len(caps)} customer(s)")
