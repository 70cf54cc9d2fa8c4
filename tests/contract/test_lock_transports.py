"""The lock contract over the ways a shop reaches its Redis: a password and a database
number, and Redis Sentinel (django-redis's ``SentinelConnectionFactory``).

"One way to reach a coordinator": every connection comes from the configured pool,
the give-back of an interrupted acquire included. That give-back runs on a
connection of its own (bounded), so it is where a transport that forgets the
password, the database or Sentinel shows: the lock then stays held for its whole
ttl. Each give-back test runs in both modes (``tests.contract.modes``: sync, and the
``stock_locks.aio`` twins). ``manage.py check``'s PING through Sentinel is checked too.

How the give-back is provoked: a :class:`FaultProxy` in front of the server
swallows the reply to the try (``swallow_reply`` of lock_acquire.lua's SHA): the
try runs and is granted, its caller never hears it, and is interrupted (a signal
raising in the main thread; a cancellation) while it waits. Its give-back, on a
new connection, passes the proxy untouched. The verdict is read from Redis.
"""

from __future__ import annotations

import asyncio
import copy
import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django_redis.pool import ConnectionFactory

from stock_locks import scripts
from stock_locks.keys import lock_keys
from tests.contract import modes
from tests.contract.modes import Lock
from tests.contract.support import (
    backends_configured,
    interrupted_acquire,
    mode,  # noqa: F401  (a fixture: each test in both modes)
)
from tests.support.fault_proxy import FaultProxy, Interrupted
from tests.support.lock_state import held
from tests.support.redis_sentinel import CONNECTION_FACTORY, RedisSentinelServers
from tests.support.redis_servers import RedisServer
from tests.support.waiting import wait_until

PASSWORD = "s3cret"
DB = 3
TTL = 300  # seconds: a lock still held after the test's give-back is held for good
# Seconds for the client to close the connection of an interrupted try: it does so before
# the acquire raises; well under the pool's 5 s socket timeout, after which another user
# of that connection (e.g. the metrics flusher) would close it instead.
DROPPED_WITHIN = 2.0


def given_back_at_once(proxy: FaultProxy, observer, name: str, backend: str) -> BaseException:
    """Warm ``backend`` up (its pooled connection open, the scripts loaded), swallow the
    reply of the next try, interrupt the acquire once the try was granted on the
    server; the exception the acquire ended with."""
    with Lock(f"{name}:warm-up", ttl=30, backend=backend):
        pass
    key = lock_keys(name).lock
    swallowed = proxy.swallowed + 1
    proxy.swallow_reply(scripts.LOCK_ACQUIRE.sha.encode())
    ended = interrupted_acquire(
        name,
        backend=backend,
        ttl=TTL,
        sent=lambda: proxy.swallowed == swallowed and held(observer, key),
    )
    assert proxy.swallowed == swallowed  # granted, and the caller never heard of it
    return ended


def assert_free(proxy: FaultProxy, observer, name: str, backend: str) -> None:
    """The lock is free now: its key is gone, another caller gets it without waiting.
    And the connection that carried the unanswered try was dropped, not pooled again
    (its reply, had it come late, would have been read by its next user)."""
    assert not held(observer, lock_keys(name).lock), "the granted try was not given back"
    wait_until(
        lambda: proxy.swallowing() == 0,
        timeout=DROPPED_WITHIN,
        what="the interrupted try's connection to be closed (it went back to the pool with "
        "its reply unread)",
    )
    other = Lock(name, ttl=30, timeout=0, backend=backend)
    assert other.acquire()
    other.release()


def interruption() -> type[BaseException]:
    """What an interrupted acquire raises in the current mode."""
    return asyncio.CancelledError if modes.mode() == "async" else Interrupted


# -- a password and a database number -----------------------------------------------------


@pytest.fixture
def secured() -> Iterator[tuple[RedisServer, FaultProxy]]:
    """A redis-server with ``requirepass``, and a FaultProxy in front of it."""
    server = RedisServer(password=PASSWORD).start()
    proxy = FaultProxy(server.port).start()
    try:
        yield server, proxy
    finally:
        proxy.close()
        server.cleanup()


@contextmanager
def configured_as(form: str, proxy: FaultProxy) -> Iterator[None]:
    """stock_locks' backend ``"secured"`` on db ``DB`` of the proxied server: by
    ``LOCATION`` (password and db in the URL), or by a django-redis cache alias
    (``OPTIONS["PASSWORD"]``, the db in its LOCATION)."""
    entry: dict[str, Any] = {"BACKEND": "stock_locks.backends.redis.RedisBackend"}
    caches = copy.deepcopy(settings.CACHES)
    if form == "location":
        entry["LOCATION"] = f"redis://:{PASSWORD}@127.0.0.1:{proxy.port}/{DB}"
    else:
        caches["secured"] = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{proxy.port}/{DB}",
            "OPTIONS": {"PASSWORD": PASSWORD, "SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
        }
        entry["OPTIONS"] = {"CACHE_ALIAS": "secured"}
    with override_settings(CACHES=caches), backends_configured({"secured": entry}):
        yield


@pytest.mark.faults
@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("form", ["location", "cache_alias"])
def test_an_interrupted_acquire_gives_its_grant_back_on_a_password_protected_redis(form, secured):
    server, proxy = secured
    observer = server.client(db=DB)
    with configured_as(form, proxy):
        ended = given_back_at_once(proxy, observer, "secured:give-back", "secured")
        assert isinstance(ended, interruption())
        assert_free(proxy, observer, "secured:give-back", "secured")
    observer.close()


# -- Redis Sentinel -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel() -> Iterator[tuple[RedisSentinelServers, FaultProxy]]:
    """A primary (behind a FaultProxy: the address Sentinel hands out), a replica and
    three sentinels, for this module's tests."""
    proxies: list[FaultProxy] = []

    def front(port: int) -> int:
        proxies.append(FaultProxy(port).start())
        return proxies[-1].port

    servers = RedisSentinelServers(front=front)
    try:
        servers.start()
        yield servers, proxies[0]
    finally:
        servers.stop()
        for proxy in proxies:
            proxy.close()
        # django-redis keeps its pools process-wide by URL ("redis://mymaster/0..."):
        # pools of these (now stopped) sentinels must not serve a later test.
        for url in [url for url in ConnectionFactory._pools if "//mymaster/" in url]:
            ConnectionFactory._pools.pop(url).disconnect()


@pytest.fixture
def through_sentinel(sentinel) -> Iterator[tuple[RedisSentinelServers, FaultProxy]]:
    """The project configured as a Sentinel shop: every cache through django-redis's
    SentinelConnectionFactory (stock_locks' on db 0, Django's on db 1), stock_locks on
    the ``REDIS_ALIAS`` cache; the primary flushed."""
    servers, proxy = sentinel
    proxy.cancel_faults()
    assert servers.primary is not None
    primary = servers.primary.client()
    primary.flushall()
    primary.close()
    caches = {"default": servers.cache(1), "stock_locks": servers.cache(0)}
    stock_locks = {**settings.STOCK_LOCKS, "REDIS_ALIAS": "stock_locks", "BACKENDS": {}}
    with override_settings(
        DJANGO_REDIS_CONNECTION_FACTORY=CONNECTION_FACTORY, CACHES=caches, STOCK_LOCKS=stock_locks
    ):
        yield servers, proxy


@pytest.mark.faults
@pytest.mark.usefixtures("mode")
def test_an_interrupted_acquire_gives_its_grant_back_through_sentinel(through_sentinel):
    servers, proxy = through_sentinel
    observer = servers.primary.client()
    ended = given_back_at_once(proxy, observer, "sentinel:give-back", "default")
    assert isinstance(ended, interruption())
    assert_free(proxy, observer, "sentinel:give-back", "default")
    observer.close()


def test_manage_py_check_reaches_redis_through_sentinel(through_sentinel):
    out, err = io.StringIO(), io.StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "stock_locks.W001" not in out.getvalue() + err.getvalue(), err.getvalue()
