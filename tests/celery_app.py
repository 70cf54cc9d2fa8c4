"""The suite's Celery app: the workers and beat the tests start (tests/support/celery_processes.py).

Configured as a project's own would be: from the Django settings (CELERY_*),
tasks found in the installed apps, and stock_locks' beat schedule (the
delay-queue drains and the sweeper).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _schedule_delay_queue_drain(sender: Celery, **kwargs) -> None:
    from stock_locks.tasks import beat_schedule

    sender.conf.beat_schedule = {**beat_schedule(), **(sender.conf.beat_schedule or {})}
