"""Fixtures: the suite's own redis-server processes, and a clean Redis per test.

- ``redis_server``: one private redis-server for the whole run; Django's
  default cache (and so stock_locks) points at it.
- ``redis_client``: a client of it; every test starts with it flushed.
- ``redis_factory``: more servers (Redlock, replicas, fault tests), each stopped
  by PID when the test ends.
- ``use_redis``: point stock_locks at another server for one test.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.conf import settings
from django.test import override_settings

from tests.support.redis_servers import RedisServer


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
    caches["default"]["LOCATION"] = url
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(autouse=True)
def redis_client(redis_server: RedisServer):
    client = redis_server.client()
    client.flushall()
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
    """``use_redis(server)`` points the default cache (and stock_locks) at ``server``."""
    stack = []

    def point(server: RedisServer) -> None:
        context = _default_cache_at(server.url)
        context.__enter__()
        stack.append(context)

    yield point
    while stack:
        stack.pop().__exit__(None, None, None)
