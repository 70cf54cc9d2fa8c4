import signal
import threading

from django.core.management.base import BaseCommand

from ...delayqueue import DelayQueue, QueueWaiter


class Command(BaseCommand):
    help = (
        "Handle a delay queue's items as they fall due, with sub-second lateness: sleeps "
        "until the next due time or until an earlier item is scheduled (no polling)."
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
        try:
            while not stopping.is_set():
                result = delay_queue.drain(limit=batch)
                if result.batches:
                    self.stdout.write(
                        f"handled {result.handled}, dispatched {result.dispatched}, "
                        f"failed {result.failed}, dead {result.dead}"
                    )
                stats = delay_queue.stats()
                if exit_when_idle and not stats["scheduled"] and not stats["in_flight"]:
                    break
                waiter.wait(max_wait=1.0)  # wakes for due items and new earlier ones
        finally:
            waiter.close()
