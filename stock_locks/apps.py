from django.apps import AppConfig


class StockLocksConfig(AppConfig):
    name = "stock_locks"
    verbose_name = "Stock locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks

        checks.register()
