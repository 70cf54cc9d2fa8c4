"""Settings for the test suite, on PostgreSQL.

The library's tests sell ``tests.inventory``'s ``Item(code, on_hand)`` (its own
stock model, not the demo's); the demo shop's app is installed too, for the
demo's tests in ``tests/demo``, which switch to the demo's settings
(``tests/demo/settings.py``) per test. Library tests never import it.

The suite's own redis-server is started by a fixture (tests/conftest.py), which
points CACHES at it; processes spawned by tests get its URL in REDIS_URL, and
the test database's name in STOCK_LOCKS_TEST_DB.
"""

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import dj_database_url

from tests.inventory import INVENTORY


def redis_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` of the same server."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "tests-only-not-secret"
DEBUG = True  # as the demo had it; pytest-django turns it off in the test process
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "stock_locks",
    # A stock model with other names than the demo's: what the library's tests sell.
    "tests.inventory",
    # The demo shop, for tests/demo only (one settings module per pytest run).
    "demo_shop.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/stock_locks")
    )
}
if os.environ.get("STOCK_LOCKS_TEST_DB"):
    # A process spawned by a test: use the test database pytest-django created.
    DATABASES["default"]["NAME"] = os.environ["STOCK_LOCKS_TEST_DB"]
    DATABASES["default"]["TEST"] = {"NAME": os.environ["STOCK_LOCKS_TEST_DB"]}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:1/0")

_REDIS_OPTIONS = {
    "CLIENT_CLASS": "django_redis.client.DefaultClient",
    "SOCKET_CONNECT_TIMEOUT": 2,  # seconds
    "SOCKET_TIMEOUT": 5,  # seconds; lock waits are sliced to stay under it
}

# stock_locks on db 0 of the suite's redis-server (tests read its keys there),
# Django's own cache on db 1: the recommended split (check W003).
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": redis_db(REDIS_URL, 1),
        "OPTIONS": _REDIS_OPTIONS,
    },
    "stock_locks": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": _REDIS_OPTIONS,
    },
}

# Celery workers and beat started by the tests (tests/celery_app.py): Redis as
# broker, the test-only delay-queue handlers loaded.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_IMPORTS = ("tests.support.celery_handlers",)

# Processes started by the tests may be given a short drain interval and
# visibility timeout through the environment.
STOCK_LOCKS = {
    "KEY_PREFIX": "sl",
    **INVENTORY,
    "DELAY_QUEUE_INTERVAL": float(os.environ.get("DELAY_QUEUE_INTERVAL", 1)),
    "DELAY_QUEUE_VISIBILITY": float(os.environ.get("DELAY_QUEUE_VISIBILITY", 30)),
    "DECORATOR_TIMEOUT": 5,  # seconds
    "METRICS_TOKEN": "test-metrics-token",  # the scrape endpoint (tests/test_metrics.py)
}


def redlock_backend(urls: list[str], node_timeout: float = 0.2) -> dict:
    """The BACKENDS entry of a RedLock over the masters at ``urls``."""
    return {
        "BACKEND": "stock_locks.backends.redlock.RedLockBackend",
        "LOCATION": urls,
        "OPTIONS": {"NODE_TIMEOUT": node_timeout},
    }


# Processes spawned by a test that uses RedLock (the `redlock` fixture) get its masters.
if os.environ.get("STOCK_LOCKS_REDLOCK_URLS"):
    STOCK_LOCKS["BACKENDS"] = {
        "redlock": redlock_backend(os.environ["STOCK_LOCKS_REDLOCK_URLS"].split(","))
    }

AUTH_PASSWORD_VALIDATORS: list[dict] = []
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".cache" / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {"version": 1, "disable_existing_loggers": False}
