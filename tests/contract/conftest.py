"""The contract suite: every test runs once per backend kind, through its alias.

``backend`` is the alias a test passes as ``backend=`` to the public API; the
fixture points ``STOCK_LOCKS["BACKENDS"]`` (django's ``override_settings``, the
rest of the suite's STOCK_LOCKS kept) at real servers, empty at the start:

- ``redis``: the implicit ``"default"``, the session's redis-server (tests/conftest.py);
- ``redis_cluster``: ``RedisBackend`` on the test process's one Redis Cluster (3
  masters, 3 replicas; :func:`~tests.support.redis_cluster.shared_cluster`, the
  one tests/cluster uses too);
- ``redlock3``: ``RedLockBackend`` over 3 session-wide redis-servers;
- ``zookeeper``: ``ZooKeeperBackend`` on one session-wide ZooKeeper server
  (tests/support/zookeeper_servers.py), under a root znode of the test's own.

Each kind runs in both execution modes (``tests.contract.modes``): ``sync``, and
``async`` (the ``stock_locks.aio`` twins, same test bodies) on a backend that
declares ``ASYNCIO``. A test marked ``@requires(CAPABILITY, ...)`` (``tests.contract.support``) is
skipped on a backend whose class does not declare every one of them, the reason
naming what is missing. Nothing else is skipped: a backend that cannot be
imported or reached fails its tests. Servers start only when a test of their
kind is selected (``-k "not redlock"`` starts no RedLock servers).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from stock_locks.backends import get_backend
from stock_locks.backends.base import ALL_CAPABILITIES, ASYNCIO
from tests.contract import modes
from tests.contract.support import backends_configured
from tests.support.redis_cluster import shared_cluster
from tests.support.redis_servers import RedisServer
from tests.support.zookeeper_servers import (  # noqa: F401  (a fixture)
    ZooKeeperServer,
    zookeeper_backend,
    zookeeper_server,
)

ALL_KINDS = ("redis", "redis_cluster", "redlock3", "zookeeper")
# STOCK_LOCKS_CONTRACT_KINDS="redis zookeeper": only these kinds (the lowest-versions run).
KINDS = tuple(os.environ.get("STOCK_LOCKS_CONTRACT_KINDS", "").split() or ALL_KINDS)
REDLOCK_NODES = 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(*capabilities): a contract test skipped on backends that do not "
        "declare these capabilities (stock_locks.backends.base)",
    )


@pytest.fixture(scope="session")
def redlock_servers() -> Iterator[list[RedisServer]]:
    servers: list[RedisServer] = []
    try:
        for _ in range(REDLOCK_NODES):
            servers.append(RedisServer().start())
        yield servers
    finally:
        for server in servers:
            server.cleanup()


def _flush(server: RedisServer) -> None:
    client = server.client()
    try:
        client.flushall()
    finally:
        client.close()


def _configure(kind: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """(alias, BACKENDS) of ``kind``, its servers started and flushed."""
    if kind == "redis":
        return "default", {}  # the session's server, flushed by the autouse redis_client
    if kind == "redis_cluster":
        cluster = shared_cluster()  # (healed first if a test left a node killed)
        cluster.flushall()
        entry = {
            "BACKEND": "stock_locks.backends.redis.RedisBackend",
            # Any running node: the client finds every master from it.
            "LOCATION": f"redis://127.0.0.1:{cluster.live()[0].port}",
            "OPTIONS": {"CLUSTER": True},
        }
        return kind, {kind: entry}
    if kind == "redlock3":
        servers: list[RedisServer] = request.getfixturevalue("redlock_servers")
        for server in servers:
            _flush(server)
        entry = {
            "BACKEND": "stock_locks.backends.redlock.RedLockBackend",
            "LOCATION": [server.url for server in servers],
        }
        return kind, {kind: entry}
    if kind == "zookeeper":
        server: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        return kind, {kind: zookeeper_backend(server.hosts)}  # (under a root of its own)
    raise AssertionError(f"unknown backend kind {kind!r}")


def _skip_unless_capable(request: pytest.FixtureRequest, alias: str, kind: str, mode: str) -> None:
    wanted = [c for mark in request.node.iter_markers("requires") for c in mark.args]
    if mode == "async":
        wanted.append(ASYNCIO)
    unknown = [c for c in wanted if c not in ALL_CAPABILITIES]
    if unknown:
        raise AssertionError(f"@requires names unknown capabilities {unknown}")
    declared = get_backend(alias).capabilities
    missing = [c for c in wanted if c not in declared]
    if missing:
        pytest.skip(
            f"backend {kind} ({type(get_backend(alias)).__name__}) does not declare "
            f"capability {', '.join(str(c.name).lower() for c in missing)}"
        )


@pytest.fixture(params=[f"{kind}-{mode}" for kind in KINDS for mode in modes.MODES])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The alias of a backend of each kind, configured in STOCK_LOCKS["BACKENDS"], in
    each execution mode (the test bodies' primitives follow it)."""
    kind, mode = request.param.rsplit("-", 1)
    alias, backends = _configure(kind, request)
    with backends_configured(backends):
        if kind == "redis_cluster":
            assert get_backend(alias).cluster, "the cluster kind must run on a RedisCluster client"
        _skip_unless_capable(request, alias, kind, mode)
        monkeypatch.setenv(modes.MODE_ENV, mode)
        try:
            yield alias
        finally:
            if mode == "async":
                modes.close_async_resources()
