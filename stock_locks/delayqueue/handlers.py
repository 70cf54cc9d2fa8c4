"""Delay-queue handlers: what a claimed item's task runs, registered per process.

Where handlers live: a module named ``delay_handlers`` in any installed app
(``STOCK_LOCKS["DELAY_QUEUE_HANDLERS_MODULE"]``). stock_locks imports it in
every process when Django is ready, the way Celery finds ``tasks`` modules, so
a Celery worker or ``run_delay_queue`` knows every handler before it drains.
An item whose task has no handler (nor a Celery task of that name) is retried
with the usual backoff, then dead-lettered: a deploy that briefly runs a
drainer without the new handler loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.module_loading import autodiscover_modules

from ..conf import settings
from ..exceptions import InvalidSchedule

Handler = Callable[[Any], Any]
# Task name -> handler, for every queue of this process.
HANDLERS: dict[str, Handler] = {}


def handler(task: str) -> Callable[[Handler], Handler]:
    """Register ``func(payload)`` as the handler of ``task`` in this process, for
    every queue.

    Put handlers in a ``delay_handlers.py`` module of one of your installed apps
    (the name is ``STOCK_LOCKS["DELAY_QUEUE_HANDLERS_MODULE"]``): stock_locks
    imports it in every process when Django is ready (:func:`discover_handlers`),
    so Celery workers and ``run_delay_queue`` know the handler before they drain.
    """
    if not isinstance(task, str) or not task:
        raise InvalidSchedule(f"task must be a non-empty string, got {task!r}")

    def register(func: Handler) -> Handler:
        HANDLERS[task] = func
        return func

    return register


def discover_handlers(module_name: str | None = None) -> None:
    """Import ``<app>.<module_name>`` of every installed app that has one.

    ``module_name`` defaults to ``STOCK_LOCKS["DELAY_QUEUE_HANDLERS_MODULE"]``
    (``"delay_handlers"``; empty or None turns discovery off). Called by
    stock_locks' ``AppConfig.ready()``, as Celery finds ``tasks`` modules and
    the admin finds ``admin`` modules. A module that exists but fails to import
    raises: a drainer must not start without its handlers.
    """
    name = settings.DELAY_QUEUE_HANDLERS_MODULE if module_name is None else module_name
    if not name:
        return
    autodiscover_modules(name)


def celery_task_named(name: str) -> Any:
    """The Celery task registered as ``name`` in this process, or None (also when
    Celery is not installed: it is an optional extra)."""
    try:
        from celery import current_app  # (the optional extra)
    except ImportError:
        return None
    return current_app.tasks.get(name)
