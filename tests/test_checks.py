"""System checks: missing or wrong Redis alias, unreachable Redis, bad settings."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test import override_settings

from stock_locks import checks
from tests.inventory import INVENTORY


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_a_working_configuration_passes(redis_server):
    assert checks.check_settings() == []
    assert checks.check_backends() == []
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
        "gone": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        },
    }
    with override_settings(STOCK_LOCKS={"REDIS_ALIAS": "gone"}):
        assert ids(checks.check_redis()) == ["stock_locks.W001"]


def test_bad_values_and_unknown_names_are_errors():
    bad = {
        "KEY_PREFIX": "a{b}",
        "LOCK_TTL": 0,
        "REPLICAS": -1,
        "LOCK_MAX_HOLD": "5",
        "TYPO_TTL": 3,
    }
    with override_settings(STOCK_LOCKS=bad):
        found = ids(checks.check_settings())
    assert found.count("stock_locks.E003") == 4
    assert found.count("stock_locks.E004") == 1


def test_stock_model_and_strategy_settings_are_checked():
    with override_settings(STOCK_LOCKS={"STOCK_MODEL": "inventory.Nope"}):
        assert ids(checks.check_settings()) == ["stock_locks.E005"]
    bad_field = {**INVENTORY, "STOCK_QUANTITY_FIELD": "qty"}
    with override_settings(STOCK_LOCKS=bad_field):
        assert ids(checks.check_settings()) == ["stock_locks.E005"]
    with override_settings(STOCK_LOCKS={"STRATEGY": "fast"}):
        assert ids(checks.check_settings()) == ["stock_locks.E003"]


@pytest.mark.parametrize("level", ["REPEATABLE_READ", "SERIALIZABLE"])
def test_postgresql_above_read_committed_is_a_warning(level):
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    settings_dict = connections["default"].settings_dict
    options = settings_dict.get("OPTIONS")
    try:
        settings_dict["OPTIONS"] = {**(options or {}), "isolation_level": IsolationLevel[level]}
        assert ids(checks.check_settings()) == ["stock_locks.W010"]
        settings_dict["OPTIONS"]["isolation_level"] = IsolationLevel.READ_COMMITTED
        assert ids(checks.check_settings()) == []
    finally:
        settings_dict["OPTIONS"] = options


def test_sharing_a_redis_database_with_another_cache_is_a_warning(settings, redis_server):
    django_redis = "django_redis.cache.RedisCache"
    options = {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1}
    settings.CACHES = {
        "default": {"BACKEND": django_redis, "LOCATION": redis_server.url, "OPTIONS": options},
        "sessions": {"BACKEND": django_redis, "LOCATION": redis_server.url.replace("/0", "/2")},
        "ours": {"BACKEND": django_redis, "LOCATION": redis_server.url, "OPTIONS": options},
    }
    with override_settings(STOCK_LOCKS={"REDIS_ALIAS": "ours"}):
        [warning] = checks.check_redis()
    assert warning.id == "stock_locks.W003" and "'default'" in warning.msg
    with override_settings(STOCK_LOCKS={"REDIS_ALIAS": "default"}):
        assert ids(checks.check_redis()) == ["stock_locks.W003"]
    with override_settings(STOCK_LOCKS={"REDIS_ALIAS": "sessions"}):
        assert "stock_locks.W003" not in ids(checks.check_redis())


def test_the_cache_key_prefix_goes_in_front_of_every_key(settings):
    from stock_locks.keys import lock_keys

    assert lock_keys("order:1").lock.startswith("sl:lock:")
    settings.CACHES = {
        **settings.CACHES,
        "stock_locks": {**settings.CACHES["stock_locks"], "KEY_PREFIX": "staging"},
    }
    assert lock_keys("order:1").lock.startswith("staging:sl:lock:")


def test_backends_that_cannot_be_built_are_errors():
    backends = {
        "typo": {"BACKEND": "stock_locks.backends.redlock.NoSuchBackend"},
        "two": {
            "BACKEND": "stock_locks.backends.redlock.RedLockBackend",
            "LOCATION": ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"],
        },
        "shape": "redis://127.0.0.1:1/0",
    }
    with override_settings(STOCK_LOCKS={**INVENTORY, "BACKENDS": backends}):
        found = checks.check_backends()
    assert ids(found) == ["stock_locks.E009"] * 3
    assert {"'typo'", "'two'", "'shape'"} == {m.msg.split("[")[2].split("]")[0] for m in found}


def test_the_lock_strategy_needs_a_fenced_backend_that_exists():
    with override_settings(STOCK_LOCKS={**INVENTORY, "STOCK_LOCK_BACKEND": "nope"}):
        assert ids(checks.check_backends()) == ["stock_locks.E010"]
    unfenced = {"plain": {"BACKEND": "tests.test_checks.UnfencedBackend"}}
    settings = {**INVENTORY, "BACKENDS": unfenced, "STOCK_LOCK_BACKEND": "plain"}
    with override_settings(STOCK_LOCKS=settings):
        (error,) = checks.check_backends()
    assert error.id == "stock_locks.E010" and "not fenced" in error.msg


def _unfenced_backend() -> type:
    from stock_locks.backends.base import Backend

    class Unfenced(Backend):
        """A backend that declares no capability."""

        def __init__(self, alias: str, **kwargs) -> None:
            super().__init__(alias)

    return Unfenced


UnfencedBackend = _unfenced_backend()


def test_a_stock_hash_tag_that_would_split_a_cart_is_an_error():
    for tag in ("", "a{b", "b}", 5):
        with override_settings(STOCK_LOCKS={"STOCK_HASH_TAG": tag}):
            assert ids(checks.check_settings()).count("stock_locks.E003") == 1, tag
