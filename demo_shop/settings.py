"""Settings of the stock_locks demo shop.

``DATABASE_URL`` picks the database (default: SQLite in the repo, the embedded
default for the demo; the test suite runs on PostgreSQL). ``REDIS_URL`` picks
Redis (default ``redis://127.0.0.1:6379/0``). Both come from the environment so
that a deployment or an outside test harness can point the app elsewhere.
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "stock_locks",
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

ROOT_URLCONF = "demo_shop.urls"

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

WSGI_APPLICATION = "demo_shop.wsgi.application"
ASGI_APPLICATION = "demo_shop.asgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=60,
    )
}

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The demo's runserver writes from many threads: take the write lock at BEGIN
    # (so SELECT ... FOR UPDATE's absence on SQLite is still safe) and wait for it.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,  # seconds
        "init_command": "PRAGMA journal_mode=WAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` of the same server."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


_REDIS_OPTIONS = {
    "CLIENT_CLASS": "django_redis.client.DefaultClient",
    "SOCKET_CONNECT_TIMEOUT": 2,  # seconds
    "SOCKET_TIMEOUT": 5,  # seconds; lock waits are sliced to stay under it
}

# stock_locks gets a cache alias (and Redis database) of its own, so that
# cache.clear() on Django's cache never deletes locks, reservations or the
# delay queue (check stock_locks.W003).
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": _REDIS_OPTIONS,
    },
    "stock_locks": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("STOCK_LOCKS_REDIS_URL") or redis_db(REDIS_URL, 1),
        "OPTIONS": _REDIS_OPTIONS,
    },
}

# Celery: Redis is the broker by default; beat drains the delay queues
# (stock_locks.tasks.beat_schedule, added by demo_shop/celery.py).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Unpaid orders expire (and their stock returns) this many seconds after they are placed.
ORDER_TTL = float(os.environ.get("ORDER_TTL", 15 * 60))

# Which stock strategy sells what is the server's decision, never the client's.
# SHOP_SKU_STRATEGIES maps a SKU to its strategy; every other SKU is sold by
# SHOP_STRATEGY (unset: STOCK_LOCKS["STRATEGY"]). A cart mixing SKUs of two
# strategies is refused with 400 (checked: shop.E001).
SHOP_STRATEGY = os.environ.get("SHOP_STRATEGY") or None
SHOP_SKU_STRATEGIES: dict[str, str] = {}
# Demo only: let an order's body pick the strategy ({"strategy": "watch"}) so the
# flash sale compares strategies over HTTP. `manage.py demo` turns it on for its
# server; off, a body naming a strategy is a 400.
SHOP_STRATEGY_FROM_REQUEST = os.environ.get("SHOP_STRATEGY_FROM_REQUEST") == "1"

STOCK_LOCKS = {
    "KEY_PREFIX": "sl",
    "STOCK_MODEL": "shop.Product",
    "STOCK_SKU_FIELD": "sku",
    "STOCK_QUANTITY_FIELD": "stock",
    "DELAY_QUEUE_INTERVAL": float(os.environ.get("DELAY_QUEUE_INTERVAL", 1)),
    "DECORATOR_TIMEOUT": 5,  # seconds a pay or cancel waits for its order's lock
    # The limited edition: one per customer (the API names the customer: see shop.views).
    "CAPS": {"kettle-limit": {"skus": ["KETTLE"], "max": 1}},
}

AUTH_PASSWORD_VALIDATORS = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".cache" / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"stock_locks": {"handlers": ["console"], "level": "INFO"}},
}
