"""The fault suite: real servers and processes killed, paused or cut.

Every test here is marked ``faults`` (by tests/conftest.py; run them alone
with ``make test ARGS="-m faults"``) and counts what matters from the
database afterwards: units oversold, stranded, moved twice.

- ``fault_proxy``, ``redis_through_proxy``: a :class:`FaultProxy` in front of a server.
- ``database_through``: this process's database connection through a FaultProxy.
- ``no_child_left``: SIGKILL the test's fault_processes children before the
  database flush; a module opts in with ``pytest.mark.usefixtures("no_child_left")``.
- ``redis``: a redis-server of the test's own, used by stock_locks and children.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from tests.support.fault_processes import kill_children
from tests.support.fault_proxy import FaultProxy
from tests.support.redis_servers import RedisServer


@pytest.fixture
def no_child_left() -> Iterator[None]:
    yield
    kill_children()  # before the database flush: a stopped child holds its transaction


@pytest.fixture
def redis(redis_factory, use_redis) -> RedisServer:
    """A redis-server of this test's own (it may be killed), used by stock_locks and children."""
    server = redis_factory()
    use_redis(server)
    return server


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[int], FaultProxy]]:
    """``fault_proxy(port)``: a started :class:`FaultProxy` to 127.0.0.1:port, closed after."""
    proxies: list[FaultProxy] = []

    def start(port: int) -> FaultProxy:
        proxy = FaultProxy(port).start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def redis_through_proxy(redis_server, fault_proxy) -> Iterator[Callable[[int], FaultProxy]]:
    """``redis_through_proxy(retries)``: stock_locks talks to the suite's redis-server
    through a FaultProxy; its client retries ``retries`` times on a broken connection."""
    contexts = []

    def start(retries: int) -> FaultProxy:
        proxy = fault_proxy(redis_server.port)
        caches = copy.deepcopy(settings.CACHES)
        ours = caches["stock_locks"]
        ours["LOCATION"] = proxy.url
        # (explicitly: redis-py >= 6 retries 3 times unless told otherwise)
        ours["OPTIONS"] = {
            **ours.get("OPTIONS", {}),
            "CONNECTION_POOL_KWARGS": {
                "retry": Retry(NoBackoff(), retries),
                "retry_on_error": [RedisConnectionError] if retries else [],
            },
        }
        context = override_settings(CACHES=caches)
        context.__enter__()
        contexts.append(context)
        return proxy

    yield start
    while contexts:
        contexts.pop().__exit__(None, None, None)


@pytest.fixture
def database_through(fault_proxy) -> Iterator[Callable[[], FaultProxy]]:
    """``database_through()``: this process's default connection goes through a
    FaultProxy to the same PostgreSQL (the test database, as pytest-django made it)."""
    connection = connections["default"]
    saved = (connection.settings_dict["HOST"], connection.settings_dict["PORT"])
    target = int(saved[1] or 5432)

    def start() -> FaultProxy:
        proxy = fault_proxy(target)
        connection.close()
        connection.settings_dict["HOST"] = "127.0.0.1"
        connection.settings_dict["PORT"] = proxy.port
        return proxy

    yield start
    connection.close()
    connection.settings_dict["HOST"], connection.settings_dict["PORT"] = saved
