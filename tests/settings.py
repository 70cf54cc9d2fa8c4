"""Settings for the test suite: the demo project, on PostgreSQL.

The suite's own redis-server is started by a fixture (tests/conftest.py), which
points CACHES at it; processes spawned by tests get its URL in REDIS_URL, and
the test database's name in STOCK_LOCKS_TEST_DB.
"""

import os

import dj_database_url

from demo_shop.settings import *  # noqa: F403
from demo_shop.settings import CACHES, STOCK_LOCKS

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/stock_locks")
    )
}
if os.environ.get("STOCK_LOCKS_TEST_DB"):
    # A process spawned by a test: use the test database pytest-django created.
    DATABASES["default"]["NAME"] = os.environ["STOCK_LOCKS_TEST_DB"]
    DATABASES["default"]["TEST"] = {"NAME": os.environ["STOCK_LOCKS_TEST_DB"]}

CACHES["default"]["LOCATION"] = os.environ.get("REDIS_URL", "redis://127.0.0.1:1/0")

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {"version": 1, "disable_existing_loggers": False}

# Celery workers started by the tests load the test-only delay-queue handlers,
# and may be given a short visibility timeout through the environment.
CELERY_IMPORTS = ("tests.support.celery_handlers",)
STOCK_LOCKS = {
    **STOCK_LOCKS,
    "DELAY_QUEUE_VISIBILITY": float(os.environ.get("DELAY_QUEUE_VISIBILITY", 30)),
}
