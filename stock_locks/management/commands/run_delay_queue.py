import logging
import signal
import threading

from django.core.management.base import BaseCommand

from ...backends.redis.errors import REDIS_FAILURES
from ...delayqueue import DelayQueue, QueueWaiter

log = logging.getLogger("stock_locks.delayqueue")

IDLE_WAIT = 1.0  # seconds, longest sleep between looks when nothing is due
ERROR_BACKOFF = (0.1, 5.0)  # seconds: first and longest pause after a Redis error


class Command(BaseCommand):
    help = (
        "Handle a delay queue's items as they fall due, with sub-second lateness: sleeps "
        "until the next due time or until an earlier item is scheduled (no polling). "
        "Keeps going through Redis errors (backing off); items it could not acknowledge "
        "are delivered again after their visibility timeout."
    )

    def add_arguments(self, parser):
        parser.add_argument("--queue", default="default", help="queue name (default: default)")
        parser.add_argument("--batch", type=int, default=None, help="items per claim")
        parser.add_argument(
            "--exit-when-idle", action="store_true", help="stop once nothing is due or scheduled"
        )

    def handle(self, *args, queue: str, batch: int | None, exit_when_idle: bool, **options):
        delay_queue = DelayQueue(queue)
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        waiter = QueueWaiter(delay_queue)
        self.stdout.write(f"draining delay queue {queue!r}; Ctrl-C to stop")
        backoff = ERROR_BACKOFF[0]
        try:
            while not stopping.is_set():
                try:
                    result = delay_queue.drain(limit=batch)
                    if result.batches:
                        self.stdout.write(
                            f"handled {result.handled}, dispatched {result.dispatched}, "
                            f"failed {result.failed}, dead {result.dead}, "
                            f"given back {result.released}"
                        )
                    stats = delay_queue.stats()
                    if exit_when_idle and not stats["scheduled"] and not stats["in_flight"]:
                        break
                    waiter.wait(max_wait=IDLE_WAIT)  # wakes for due items and new earlier ones
                    backoff = ERROR_BACKOFF[0]
                except REDIS_FAILURES as exc:
                    log.warning(
                        "delay queue %r: runner: %s: %s; again in %.1f s",
                        queue, type(exc).__name__, exc, backoff,
                    )  # fmt: skip
                    stopping.wait(backoff)
                    backoff = min(backoff * 2, ERROR_BACKOFF[1])
        finally:
            waiter.close()
