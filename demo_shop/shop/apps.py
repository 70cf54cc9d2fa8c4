from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "demo_shop.shop"
    label = "shop"
    verbose_name = "Demo shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import expiry  # noqa: F401  registers the delay-queue handler
