"""A delay queue in Redis: items due at a time, claimed in atomic batches, at least once.

    queue = DelayQueue("default")
    queue.schedule("shop.expire_order", {"order": 42}, delay=900, id="expire-order-42")
    queue.cancel("expire-order-42")              # paid in time

    @handler("shop.expire_order")
    def expire_order(payload): ...

    queue.drain()                                 # what the Celery beat task does

Delivery is at least once: ``claim`` moves a batch in flight in one script; an
item not acknowledged before its visibility timeout is due again, and after
``max_attempts`` deliveries it goes to the dead-letter set with its last
error. Handlers must therefore be idempotent (by business id). Two drainers
never get the same item while its visibility lasts.

Lost replies (the request ran, the answer never came back): ``schedule`` and
``cancel`` of an item id are safe to call again (one copy, or none); a
``claim`` whose reply was lost leaves its items in flight, unseen, and they are
due again when their visibility runs out (that delivery is counted); ``ack``
and ``release`` are safe to repeat, and ``drain`` repeats a failed ack itself.

The storage is :mod:`.queue`, draining :mod:`.runner`, the handler registry
:mod:`.handlers`.
"""

from ..exceptions import InvalidSchedule, MissingHandler
from .handlers import HANDLERS, Handler, discover_handlers, handler
from .queue import DelayQueue, Item
from .runner import DrainResult, QueueWaiter

__all__ = [
    "HANDLERS",
    "DelayQueue",
    "DrainResult",
    "Handler",
    "InvalidSchedule",
    "Item",
    "MissingHandler",
    "QueueWaiter",
    "discover_handlers",
    "handler",
]
