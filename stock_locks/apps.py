from django.apps import AppConfig


class StockLocksConfig(AppConfig):
    name = "stock_locks"
    verbose_name = "Stock locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, metrics  # (app loading: checks read models; metrics: signals)
        from .delayqueue import discover_handlers  # (app loading: handlers import models)
        from .stock import expiry, sync  # noqa: F401  # (app loading; expiry registers its handler)

        checks.register()
        sync.connect_signals()  # the stock model's saves keep the Redis counters in line
        metrics.connect_roles()  # web processes, Celery workers and beat write heartbeats
        discover_handlers()  # every installed app's delay_handlers module
