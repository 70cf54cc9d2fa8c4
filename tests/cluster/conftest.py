"""A real Redis Cluster (3 masters, 3 replicas) for the tests under tests/cluster.

- ``redis_cluster``: one :class:`RedisClusterServers` for the whole run (the
  process's :func:`shared_cluster`, stopped by PID when the run ends). A test that
  kills a node calls ``redis_cluster.heal()`` before it returns, so the next test
  finds it whole (and one left unhealed is healed before the next test).
- ``cluster_client``: a ``RedisCluster`` client of it (str replies), on a flushed cluster.
- ``redis_client`` (autouse; overrides the suite's single-server one): every test
  here runs with stock_locks configured the way a project would run it on a
  cluster, ``STOCK_LOCKS["BACKENDS"]["default"]`` = a ``RedisBackend`` whose
  ``LOCATION`` is a node's URL and ``OPTIONS["CLUSTER"]`` is True, on a flushed
  cluster; so does every process the test spawns (``DJANGO_SETTINGS_MODULE`` is
  ``tests.cluster.settings`` meanwhile). The fixture's value is a ``RedisCluster``
  client (bytes replies), so test bodies written for one Redis server run here
  unchanged when imported into a module of this folder.

No django-redis cache points at the cluster, and no single redis-server is
started for these tests: a code path that still took the django-redis client
would fail here instead of quietly using another server.

Nothing is skipped: without redis-server the fixture errors out as RedisServer does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings
from redis.cluster import RedisCluster

from stock_locks.backends.redis import registry
from tests.cluster.settings import CLUSTER_URL_ENV, cluster_backend
from tests.support.redis_cluster import RedisClusterServers, shared_cluster

SETTINGS_MODULE = "tests.cluster.settings"


@pytest.fixture(scope="session")
def redis_cluster() -> RedisClusterServers:
    return shared_cluster()


@pytest.fixture
def cluster_client(redis_cluster: RedisClusterServers) -> Iterator[RedisCluster]:
    redis_cluster.flushall()
    client = redis_cluster.client(decode_responses=True)
    yield client
    client.close()


def on_cluster(
    url: str | list[str], extra: dict | None = None, **options: object
) -> override_settings:
    """``override_settings`` putting stock_locks' default backend on the cluster at
    ``url`` (``options``: more backend OPTIONS, e.g. ``REPLICAS``; ``extra``: more
    BACKENDS entries); the rest of the suite's ``STOCK_LOCKS`` kept."""
    base = settings.STOCK_LOCKS
    backends = {
        **base.get("BACKENDS", {}),
        "default": cluster_backend(url, **options),
        **(extra or {}),
    }
    return override_settings(STOCK_LOCKS={**base, "BACKENDS": backends})


@pytest.fixture(autouse=True)
def redis_client(
    redis_cluster: RedisClusterServers, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RedisCluster]:
    if redis_cluster.killed:
        redis_cluster.heal()
    redis_cluster.flushall()
    registry.forget()  # FLUSHALL announces nothing: register every name again
    url = redis_cluster.url
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS_MODULE)
    monkeypatch.setenv(CLUSTER_URL_ENV, url)
    client = redis_cluster.client()
    with on_cluster(url):
        yield client
    client.close()
