"""Redis with Sentinel as a backend configuration: the two forms (a ``redis+sentinel://``
LOCATION, or OPTIONS SENTINELS and SERVICE_NAME), malformed ones refused, both clients
(sync and asyncio) following a failover, and the system checks of a replicated Redis
(W006-W009).

The live tests run one primary, one replica and three sentinels of their own
(:class:`~tests.support.redis_sentinel.RedisSentinelServers`); the failover test, which
leaves the deployment changed, starts one of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_redis.pool import ConnectionFactory
from redis.sentinel import SentinelConnectionPool

from stock_locks import Lock, aio, checks
from stock_locks.backends import get_backend
from stock_locks.backends.redis.client import ClientOptions, get_redis
from stock_locks.exceptions import RedisUnavailable
from stock_locks.keys import lock_keys
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.redis_sentinel import CONNECTION_FACTORY, SERVICE, RedisSentinelServers
from tests.support.waiting import wait_until


def ids(messages) -> list[str]:
    return [m.id for m in messages]


# -- configuration, no server ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "options", "addresses", "service", "connection"),
    [
        ("redis+sentinel://h1:26379/shop", {}, (("h1", 26379),), "shop", {}),
        (
            "redis+sentinel://u:p%40ss@h1:26379,h2:26380,[::1]:26381/shop/2",
            {},
            (("h1", 26379), ("h2", 26380), ("::1", 26381)),
            "shop",
            {"username": "u", "password": "p@ss", "db": 2},
        ),
        ("rediss+sentinel://:pw@h1:1/shop", {}, (("h1", 1),), "shop", {"password": "pw"}),
        (
            None,
            {"SENTINELS": [("h1", 26379), "h2:26380"], "SERVICE_NAME": "shop", "DB": 1},
            (("h1", 26379), ("h2", 26380)),
            "shop",
            {"db": 1},
        ),
    ],
)
def test_both_forms_name_the_sentinels_the_service_and_the_servers_arguments(
    location, options, addresses, service, connection
):
    parsed = ClientOptions.parse("x", location, options)
    assert parsed.sentinel is not None and parsed.direct and parsed.location is None
    assert parsed.sentinel.addresses == addresses
    assert parsed.sentinel.service == service
    for key, value in connection.items():
        assert parsed.kwargs[key] == value
    tls = bool(location and location.startswith("rediss"))
    assert parsed.kwargs.get("ssl", False) is tls
    assert parsed.sentinel.sentinel_kwargs.get("ssl", False) is tls


def test_the_sentinels_get_the_backends_timeouts_and_no_retries_unless_told():
    parsed = ClientOptions.parse("x", "redis+sentinel://h1:1/shop", {"SOCKET_TIMEOUT": 3})
    assert parsed.sentinel is not None
    kwargs = parsed.sentinel.client_kwargs({"socket_timeout": 3})
    assert (
        kwargs["socket_timeout"] == 3 and kwargs["retry"]._retries == 0
    )  # (get_retries(): redis-py >= 6 only)
    told = ClientOptions.parse(
        "x", "redis+sentinel://h1:1/shop", {"SENTINEL_KWARGS": {"socket_timeout": 1}}
    )
    assert told.sentinel is not None
    assert told.sentinel.client_kwargs({"socket_timeout": 3})["socket_timeout"] == 1


@pytest.mark.parametrize(
    ("location", "options", "says"),
    [
        ("redis+sentinel:///shop", {}, "names no sentinel"),
        ("redis+sentinel://h1:26379", {}, "one service"),
        ("redis+sentinel://h1:26379/shop/one", {}, "not a number"),
        ("redis+sentinel://h1:26379/shop/1/2", {}, "one service"),
        ("redis+sentinel://h1/shop", {}, "not host:port"),
        ("redis+sentinel://h1:26379/shop?db=1", {}, "query"),
        ("redis+sentinel://h1:26379/shop", {"CLUSTER": True}, "exclude each other"),
        ("redis+sentinel://h1:26379/shop", {"SENTINELS": ["h2:1"]}, "drop OPTIONS"),
        ("redis://h1:6379/0", {"SENTINELS": ["h2:1"], "SERVICE_NAME": "s"}, "remove it"),
        (None, {"SENTINELS": ["h2:1"]}, "SERVICE_NAME"),
        (None, {"SERVICE_NAME": "shop"}, "SENTINELS"),
        (None, {"SENTINELS": ["h2"], "SERVICE_NAME": "shop"}, "not host:port"),
        ("redis://h1:6379/0", {"SENTINEL_KWARGS": {}}, "without Sentinel"),
    ],
)
def test_a_malformed_sentinel_configuration_is_refused_with_what_is_wrong(location, options, says):
    with pytest.raises(ImproperlyConfigured, match=says):
        ClientOptions.parse("x", location, options)


def test_manage_py_check_reports_a_malformed_sentinel_backend():
    entry = {
        "BACKEND": "stock_locks.backends.redis.RedisBackend",
        "LOCATION": "redis+sentinel:///s",
    }
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "BACKENDS": {"default": entry}}):
        assert "stock_locks.E009" in ids(checks.check_backends())


# -- a live deployment ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers() -> Iterator[RedisSentinelServers]:
    with RedisSentinelServers() as deployment:
        yield deployment
    _forget_django_redis_pools()


def _forget_django_redis_pools() -> None:
    # django-redis keeps its pools process-wide by URL: those of stopped sentinels go.
    for url in [url for url in ConnectionFactory._pools if f"//{SERVICE}/" in url]:
        ConnectionFactory._pools.pop(url).disconnect()


def sentinel_url(deployment: RedisSentinelServers, db: int = 0) -> str:
    hosts = ",".join(f"{host}:{port}" for host, port in deployment.sentinel_addresses)
    return f"redis+sentinel://{hosts}/{deployment.service}/{db}"


def backend_entry(deployment: RedisSentinelServers, form: str, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"BACKEND": "stock_locks.backends.redis.RedisBackend"}
    if form == "location":
        entry["LOCATION"] = sentinel_url(deployment)
        entry["OPTIONS"] = dict(options)
    else:
        entry["OPTIONS"] = {
            "SENTINELS": deployment.sentinel_addresses,
            "SERVICE_NAME": deployment.service,
            **options,
        }
    return entry


def configured(
    deployment: RedisSentinelServers, form: str, extra: dict[str, Any] | None = None, **options: Any
):
    """Settings of a project whose default backend (and so get_redis()) is ``form``
    with OPTIONS ``options``; ``extra``: more STOCK_LOCKS settings."""
    stock_locks = {
        **settings.STOCK_LOCKS,
        **(extra or {}),
        "BACKENDS": {"default": backend_entry(deployment, form, **options)},
    }
    return override_settings(STOCK_LOCKS=stock_locks)


@contextmanager
def as_django_redis_alias(deployment: RedisSentinelServers, **options: Any) -> Iterator[None]:
    """Settings of a project on django-redis's SentinelConnectionFactory (no BACKENDS)
    whose stock_locks cache has OPTIONS ``options`` (django-redis's pools of an earlier
    configuration forgotten: it keeps them by URL)."""
    # (the factory per cache, as docs/backends.md advises: DJANGO_REDIS_CONNECTION_FACTORY
    # would apply to every cache of the project)
    factory = {"CONNECTION_FACTORY": CONNECTION_FACTORY}
    caches = {
        "default": deployment.cache(1, **factory),
        "stock_locks": deployment.cache(0, **factory, **options),
    }
    stock_locks = {**settings.STOCK_LOCKS, "REDIS_ALIAS": "stock_locks", "BACKENDS": {}}
    _forget_django_redis_pools()
    try:
        with override_settings(CACHES=caches, STOCK_LOCKS=stock_locks):
            yield
    finally:
        _forget_django_redis_pools()


def holder_on(server, name: str) -> bytes | None:
    client = server.client()
    try:
        return client.get(lock_keys(name).lock)
    finally:
        client.close()


async def _async_lock_cycle(name: str) -> bytes:
    lock = aio.Lock(name, ttl=30)
    assert await lock.acquire(timeout=5)
    try:
        return lock.token.encode() if isinstance(lock.token, str) else lock.token
    finally:
        await lock.release()


@pytest.mark.parametrize("form", ["location", "options"])
def test_locks_of_both_modes_are_granted_on_the_primary(servers, form):
    with configured(servers, form):
        with Lock(f"sentinel:{form}:sync", ttl=30) as lock:
            assert lock.token.encode() in (
                holder_on(servers.primary, f"sentinel:{form}:sync") or b""
            )
        assert isinstance(get_backend().client.connection_pool, SentinelConnectionPool)

        async def held() -> bool:
            lock = aio.Lock(f"sentinel:{form}:async", ttl=30)
            assert await lock.acquire(timeout=5)
            try:
                return holder_on(servers.primary, f"sentinel:{form}:async") is not None
            finally:
                await lock.release()

        assert asyncio.run(held())


@pytest.mark.django_db(transaction=True)
def test_a_reservation_through_the_default_backend_reaches_the_primary(servers):
    Item.objects.create(code="SENT-1", title="Sentinel kettle", on_hand=3)
    with configured(servers, "location"):
        assert get_redis() is get_backend().client
        get_strategy("lua").reserve("sentinel-order-1", {"SENT-1": 2})
        assert Item.objects.get(code="SENT-1").on_hand == 1
        primary = servers.primary.client()
        assert any(b"SENT-1" in key for key in primary.keys("*"))
        primary.close()


def test_a_replicated_sentinel_backend_with_our_sentinel_clients_passes_the_checks(servers):
    primary = servers.primary.client()
    primary.config_set("min-replicas-to-write", 1)
    try:
        with configured(servers, "location", REPLICAS=1):
            assert ids(checks.check_replication()) == []
    finally:
        primary.config_set("min-replicas-to-write", 0)
        primary.close()


@pytest.mark.parametrize("form", ["location", "options", "alias"])
def test_no_wait_and_no_min_replicas_are_warned_about(servers, form):
    context = (
        as_django_redis_alias(servers, SENTINEL_KWARGS={"socket_timeout": 5, "retry": None})
        if form == "alias"
        else configured(servers, form)
    )
    with context:
        found = ids(checks.check_replication())
    assert "stock_locks.W006" in found and "stock_locks.W007" in found


def test_a_sentinel_that_would_hold_a_call_past_the_socket_timeout_is_warned_about(servers):
    with as_django_redis_alias(servers, SENTINEL_KWARGS={"socket_timeout": 30}):
        assert "stock_locks.W008" in ids(checks.check_replication())
    with configured(servers, "location", SENTINEL_KWARGS={"socket_timeout": None}):
        assert "stock_locks.W008" in ids(checks.check_replication())
    with configured(servers, "location"):
        assert "stock_locks.W008" not in ids(checks.check_replication())


def test_a_replica_timeout_not_below_the_socket_timeout_is_warned_about(servers):
    with configured(servers, "location", {"REPLICA_TIMEOUT": 1}, REPLICAS=1, SOCKET_TIMEOUT=0.5):
        assert "stock_locks.W009" in ids(checks.check_replication())
    with configured(servers, "location", REPLICAS=1):
        assert "stock_locks.W009" not in ids(checks.check_replication())


# -- a failover ----------------------------------------------------------------------------


def _primary_port(deployment: RedisSentinelServers) -> int:
    sentinel = deployment.sentinels[0].client(decode_responses=True)
    try:
        return int(sentinel.sentinel_get_master_addr_by_name(deployment.service)[1])
    finally:
        sentinel.close()


@pytest.mark.parametrize("form", ["location", "options"])
def test_both_clients_follow_a_failover_to_the_promoted_replica(form):
    with RedisSentinelServers() as deployment, configured(deployment, form):
        assert deployment.primary is not None and deployment.replica is not None
        old, new = deployment.primary, deployment.replica

        loop = asyncio.new_event_loop()
        try:
            with Lock("failover:before", ttl=30):
                assert holder_on(old, "failover:before") is not None
            loop.run_until_complete(_async_lock_cycle("failover:before:async"))

            sentinel = deployment.sentinels[0].client()
            sentinel.execute_command("SENTINEL", "FAILOVER", deployment.service)
            sentinel.close()
            # Until the sentinels demote the old primary, both are primaries (a forced
            # failover's window): a client still on the old one is granted there, and
            # that grant is lost with the demotion (LockNotOwned on release).
            wait_until(
                lambda: (
                    _primary_port(deployment) == new.port
                    and _role(new) == "master"
                    and _role(old) == "slave"
                ),
                what="the replica to be promoted and the old primary demoted",
            )

            # The same clients (the sync one, the asyncio one on the same loop) now grant
            # on the promoted replica; the first calls may meet a connection the demotion
            # closed: RedisUnavailable, then a grant.
            def granted_on_new() -> bool:
                try:
                    with Lock("failover:after", ttl=30) as lock:
                        return lock.token.encode() in (holder_on(new, "failover:after") or b"")
                except RedisUnavailable:
                    return False

            wait_until(granted_on_new, what="a sync grant on the promoted replica")

            async def async_granted_on_new() -> bool:
                lock = aio.Lock("failover:after:async", ttl=30)
                try:
                    assert await lock.acquire(timeout=5)
                except RedisUnavailable:
                    return False
                on_new = holder_on(new, "failover:after:async") is not None
                await lock.release()
                return on_new

            wait_until(
                lambda: loop.run_until_complete(async_granted_on_new()),
                what="an asyncio grant on the promoted replica",
            )
        finally:
            loop.close()
    _forget_django_redis_pools()


def _role(server) -> str:
    client = server.client()
    try:
        return str(client.info("replication")["role"])
    except Exception:
        return "?"
    finally:
        client.close()


# -- a connection to a replica --------------------------------------------------------------


def test_a_replica_answers_unavailable_never_a_refusal(servers):
    """A client left talking to a replica (a demoted primary, a stale pooled connection)
    gets RedisUnavailable from every script that may write, before it runs: never
    "not held" read from a replica's copy, which may lag the primary's."""
    entry = backend_entry(servers, "location")
    on_replica = {"BACKEND": entry["BACKEND"], "LOCATION": servers.replica.url}
    stock_locks = {**settings.STOCK_LOCKS, "BACKENDS": {"default": entry, "replica": on_replica}}
    with override_settings(STOCK_LOCKS=stock_locks), Lock("sentinel:replica", ttl=30):
        with pytest.raises(RedisUnavailable, match="read only replica"):
            Lock("sentinel:replica:other", ttl=30, backend="replica").acquire(timeout=0)
        # A release whose token does not match would read "not held" and write
        # nothing: the replica must refuse to run it at all.
        stranger = Lock("sentinel:replica", ttl=30, backend="replica", token="a-stranger")
        with pytest.raises(RedisUnavailable, match="read only replica"):
            stranger.release()
