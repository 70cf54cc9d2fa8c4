"""Settings of the processes the delay-queue benchmark starts: the demo's, plus the
app whose module registers the benchmark's handler (``benchmarks/dq_handlers.py``)."""

from demo_shop.settings import *  # noqa: F403
from demo_shop.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.dq_handlers.DelayQueueBenchConfig"]
