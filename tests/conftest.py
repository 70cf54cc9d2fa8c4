"""Fixtures: the suite's own redis-server processes, and a clean Redis per test.

- ``redis_server``: one private redis-server for the whole run; stock_locks'
  cache alias points at its db 0, Django's default cache at its db 1.
- ``redis_client``: a client of it; every test starts with it flushed.
- ``redis_factory``: more servers (Redlock, replicas, fault tests), each stopped
  by PID when the test ends.
- ``use_redis``: point stock_locks at another server for one test.
- ``redlock``: the ``"redlock"`` backend over three private masters (flushed, and
  restarted when a test killed one), for this test and the processes it spawns.
- ``cluster_client``: a ``RedisCluster`` client (bytes replies) of the test
  process's shared Redis Cluster (3 masters), flushed; tests/cluster/conftest.py
  has its own (str replies).
- ``django_db_setup``: pytest-django's, which also closes, before the test
  database is dropped, the connection left in asgiref's thread.

Tests under a ``faults/`` directory (tests/faults, tests/demo/faults) are marked ``faults``.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.test import override_settings

from stock_locks.backends.redis import registry
from stock_locks.stock import soldout
from tests.settings import redis_db, redlock_backend
from tests.support.redis_servers import RedisServer

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "faults" in Path(item.path).resolve().relative_to(TESTS).parts[:-1]:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    yield
    # A test that runs async code with asyncio.run() (no async_to_sync around it) leaves
    # the connection of its ORM calls open in asgiref's one thread for sync_to_async,
    # where no request ends to close it; the test database could not be dropped.
    asyncio.run(sync_to_async(connections.close_all)())


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    os.environ["REDIS_URL"] = server.url  # for processes the tests spawn
    with _default_cache_at(server.url):
        yield server
    server.cleanup()


@contextmanager
def _default_cache_at(url: str) -> Iterator[None]:
    caches = copy.deepcopy(settings.CACHES)
    caches["stock_locks"]["LOCATION"] = url
    caches["default"]["LOCATION"] = redis_db(url, 1)
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(autouse=True)
def redis_client(redis_server: RedisServer):
    client = redis_server.client()
    client.flushall()
    soldout.reset()  # FLUSHALL announces nothing: no sold-out SKU of a previous test
    registry.forget()  # ...and no semaphore or queue this process registered before it
    yield client
    client.close()


@pytest.fixture
def redis_factory() -> Iterator[Callable[..., RedisServer]]:
    servers: list[RedisServer] = []

    def start(*extra_args: str, port: int | None = None) -> RedisServer:
        server = RedisServer(*extra_args, port=port).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.cleanup()


@pytest.fixture
def use_redis() -> Iterator[Callable[[RedisServer], None]]:
    """``use_redis(server)`` points stock_locks (and Django's cache) at ``server``."""
    stack = []

    def point(server: RedisServer) -> None:
        context = _default_cache_at(server.url)
        context.__enter__()
        stack.append(context)

    yield point
    while stack:
        stack.pop().__exit__(None, None, None)


@pytest.fixture(scope="session")
def redlock_servers() -> Iterator[list[RedisServer]]:
    servers = [RedisServer().start() for _ in range(3)]
    yield servers
    for server in servers:
        server.cleanup()


@pytest.fixture
def redlock(redlock_servers: list[RedisServer]) -> Iterator[list[RedisServer]]:
    """stock_locks' ``"redlock"`` backend over three masters; yields the servers."""
    for server in redlock_servers:
        if server.process is None or server.process.poll() is not None:
            server.restart()
        server.client().flushall()
    urls = [server.url for server in redlock_servers]
    os.environ["STOCK_LOCKS_REDLOCK_URLS"] = ",".join(urls)
    backends = {"redlock": redlock_backend(urls)}
    try:
        with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "BACKENDS": backends}):
            yield redlock_servers
    finally:
        del os.environ["STOCK_LOCKS_REDLOCK_URLS"]


@pytest.fixture
def cluster_client():
    """A client of the test process's shared Redis Cluster (3 masters), flushed."""
    from tests.support.redis_cluster import shared_cluster  # started on first use only

    cluster = shared_cluster()
    cluster.flushall()
    client = cluster.client()
    yield client
    client.close()
