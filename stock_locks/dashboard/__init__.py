"""The admin page: what it shows (:mod:`.snapshot`), its charts (:mod:`.charts` over
:mod:`.timeline`), the operator's actions (:mod:`.actions`) and the admin views
(:mod:`.views`). ``stock_locks.admin`` registers it."""

from .snapshot import (
    CHART_SECONDS,
    PAGE_SIZE,
    TOKEN_SHOWN,
    backend_locks,
    delay_queues,
    lock_holder,
    lock_page,
    semaphores,
    snapshot,
    stock,
)

__all__ = [
    "CHART_SECONDS",
    "PAGE_SIZE",
    "TOKEN_SHOWN",
    "backend_locks",
    "delay_queues",
    "lock_holder",
    "lock_page",
    "semaphores",
    "snapshot",
    "stock",
]
