"""The suite's settings with stock_locks on a Redis Cluster: for the processes that
tests under tests/cluster start (``DJANGO_SETTINGS_MODULE`` is this module while
such a test runs, and ``STOCK_LOCKS_CLUSTER_URL`` lists the cluster's node URLs,
comma-separated).

The cluster is configured the way a project would: the default backend with a
``LOCATION`` and ``OPTIONS["CLUSTER"]``, no django-redis cache for stock_locks.
``tests.delayapp`` is installed so a drainer process knows its handlers.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, STOCK_LOCKS

CLUSTER_URL_ENV = "STOCK_LOCKS_CLUSTER_URL"


def cluster_backend(urls: str | list[str], **options: object) -> dict:
    """The ``BACKENDS`` entry of a Redis Cluster reached through the node(s) at ``urls``."""
    return {
        "BACKEND": "stock_locks.backends.redis.RedisBackend",
        "LOCATION": urls,
        "OPTIONS": {"CLUSTER": True, **options},
    }


INSTALLED_APPS = [*INSTALLED_APPS, "tests.delayapp"]

if os.environ.get(CLUSTER_URL_ENV):
    STOCK_LOCKS = {
        **STOCK_LOCKS,
        "BACKENDS": {
            **STOCK_LOCKS.get("BACKENDS", {}),
            "default": cluster_backend(os.environ[CLUSTER_URL_ENV].split(",")),
        },
    }
