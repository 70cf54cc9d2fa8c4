from django.core.management.base import BaseCommand

from ...stock.reconcile import stock_report, sync_counters
from ._stock_table import check_known, render


class Command(BaseCommand):
    help = (
        "Load missing Redis counters from the database and repair drifting ones "
        "(relative corrections, safe during sales)."
    )

    def add_arguments(self, parser):
        parser.add_argument("skus", nargs="*", help="only these SKUs (default: all)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def handle(self, *args, skus: list[str], json: bool, **options):
        check_known(skus, stock_report(skus or None))
        sync_counters(skus or None)
        self.stdout.write(render(stock_report(skus or None), json))
