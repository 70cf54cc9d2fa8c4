"""The demo's Celery app: configured from Django settings (CELERY_*), Redis as broker."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_shop.settings")

app = Celery("demo_shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _schedule_delay_queue_drain(sender: Celery, **kwargs) -> None:
    from stock_locks.tasks import beat_schedule

    sender.conf.beat_schedule = {**beat_schedule(), **(sender.conf.beat_schedule or {})}
