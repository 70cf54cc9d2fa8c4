from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "demo_shop.shop"
    label = "shop"
    verbose_name = "Demo shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from . import expiry  # noqa: F401  connects the reservation_expired receiver
        from .checks import check_strategies

        checks.register(check_strategies)
