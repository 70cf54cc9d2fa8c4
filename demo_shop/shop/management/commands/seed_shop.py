from decimal import Decimal

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from demo_shop.shop.models import Order, Product
from demo_shop.shop.services import cancel_order
from stock_locks.stock.reconcile import sync_counters

CATALOGUE = [
    ("TEA-GREEN", "Green tea, 100 g", "6.50", 40),
    ("TEA-BLACK", "Black tea, 100 g", "5.90", 40),
    ("MUG-BLUE", "Blue mug", "12.00", 20),
    ("KETTLE", "Kettle, limited edition", "89.00", 5),
    ("SPOON", "Tea spoon", "2.50", 100),
]
DEMO_USER, DEMO_PASSWORD = "admin", "admin"


class Command(BaseCommand):
    help = "Create the demo catalogue (stock reset to its starting level) and a demo admin."

    def add_arguments(self, parser):
        parser.add_argument("--no-user", action="store_true", help="do not create the demo admin")

    def handle(self, *args, no_user: bool, **options):
        skus = [sku for sku, *_ in CATALOGUE]
        # Unpaid orders from an earlier run give their stock back (and will not expire later).
        for order in Order.objects.filter(
            status=Order.Status.PENDING, lines__sku__in=skus
        ).distinct():
            cancel_order(order)
        for sku, name, price, stock in CATALOGUE:
            Product.objects.update_or_create(
                sku=sku,
                defaults={"name": name, "price": Decimal(price), "stock": stock, "fence": 0},
            )
        sync_counters(skus)
        self.stdout.write(f"{len(CATALOGUE)} products ready")
        if not no_user:
            User = get_user_model()
            user, _ = User.objects.get_or_create(
                username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
            )
            user.set_password(DEMO_PASSWORD)
            user.save()
            self.stdout.write(f"demo admin: {DEMO_USER} / {DEMO_PASSWORD}")
