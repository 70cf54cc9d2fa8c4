from django.core.management.base import BaseCommand, CommandError

from ...stock.reconcile import fix_drift, stock_report
from ._stock_table import check_known, render


class Command(BaseCommand):
    help = (
        "Report per-SKU drift between Redis counters and the database, counting work in "
        "flight (a SKU that keeps moving is shown as 'moving', not as drift); exit 1 on "
        "drift. --fix repairs it with relative corrections, safe during sales."
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
        self.stdout.write(render(report, json))
        drifting = [row.sku for row in report if row.drift]
        if drifting:
            raise CommandError(f"drift on {len(drifting)} SKU(s): {', '.join(drifting[:20])}")
