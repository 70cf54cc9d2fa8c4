"""System checks: missing or wrong Redis alias, unreachable Redis, bad settings."""

from __future__ import annotations

from django.test import override_settings

from stock_locks import checks


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_a_working_configuration_passes(redis_server):
    assert checks.check_settings() == []
    assert checks.check_redis() == []


def test_missing_alias_is_an_error():
    with override_settings(STOCK_LOCKS={"REDIS_ALIAS": "nope"}):
        assert ids(checks.check_redis()) == ["stock_locks.E001"]


def test_non_django_redis_cache_is_an_error(settings):
    settings.CACHES = {
        **settings.CACHES,
        "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with override_settings(STOCK_LOCKS={"REDIS_ALIAS": "local"}):
        assert ids(checks.check_redis()) == ["stock_locks.E002"]


def test_unreachable_redis_is_a_warning(settings, redis_factory):
    server = redis_factory()
    server.kill()
    settings.CACHES = {
        **settings.CACHES,
        "gone": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url},
    }
    with override_settings(STOCK_LOCKS={"REDIS_ALIAS": "gone"}):
        assert ids(checks.check_redis()) == ["stock_locks.W001"]


def test_bad_values_and_unknown_names_are_errors():
    bad = {"KEY_PREFIX": "a{b}", "LOCK_TTL": 0, "REPLICAS": -1, "TYPO_TTL": 3}
    with override_settings(STOCK_LOCKS=bad):
        found = ids(checks.check_settings())
    assert found.count("stock_locks.E003") == 3
    assert found.count("stock_locks.E004") == 1


def test_stock_model_and_strategy_settings_are_checked():
    with override_settings(STOCK_LOCKS={"STOCK_MODEL": "shop.Nope"}):
        assert ids(checks.check_settings()) == ["stock_locks.E005"]
    bad_field = {"STOCK_MODEL": "shop.Product", "STOCK_QUANTITY_FIELD": "qty"}
    with override_settings(STOCK_LOCKS=bad_field):
        assert ids(checks.check_settings()) == ["stock_locks.E005"]
    with override_settings(STOCK_LOCKS={"STRATEGY": "fast"}):
        assert ids(checks.check_settings()) == ["stock_locks.E003"]
