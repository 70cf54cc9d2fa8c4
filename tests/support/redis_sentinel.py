"""A private Redis Sentinel deployment for the tests: a primary, one replica, three sentinels.

Every process is a :class:`~tests.support.redis_servers.RedisServer` (free
127.0.0.1 port, no persistence, its own temp dir, stopped by PID): the primary,
a replica (``--replicaof`` the primary) and three sentinels
(``redis-server <conf> --sentinel``, each with ``sentinel monitor <service>
127.0.0.1 <port> 2`` and short down-after/failover timeouts in a config file of
its own, which Sentinel rewrites). :meth:`RedisSentinelServers.start` returns once
every sentinel knows the primary, the replica and the two other sentinels.

``front``: a function of the primary's port returning the port everybody else
uses to reach it (a :class:`~tests.support.fault_proxy.FaultProxy`'s, so that a
test can lose a reply of the primary); the replica replicates from that address
and the sentinels monitor it, so Sentinel hands it out as the primary's address.

Configure a Django project on it as a Sentinel shop does with django-redis:
:meth:`RedisSentinelServers.caches` and :data:`CONNECTION_FACTORY`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import redis

from .redis_servers import RedisServer
from .waiting import TIMEOUT, wait_until

HOST = "127.0.0.1"
SERVICE = "mymaster"
QUORUM = 2
# DJANGO_REDIS_CONNECTION_FACTORY of a project whose caches are reached through Sentinel.
CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"


class RedisSentinelServers:
    """``start()`` / ``stop()``; ``primary``, ``replica``, ``sentinels``;
    ``sentinel_addresses``; ``caches(...)``."""

    def __init__(
        self,
        service: str = SERVICE,
        sentinels: int = 3,
        front: Callable[[int], int] | None = None,
        timeout: float = TIMEOUT,
    ) -> None:
        self.service = service
        self.sentinel_count = sentinels
        self.front = front
        self.timeout = timeout
        self.primary: RedisServer | None = None
        self.replica: RedisServer | None = None
        self.sentinels: list[RedisServer] = []
        self.primary_port: int | None = None  # the address Sentinel hands out (front's, if any)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> RedisSentinelServers:
        try:
            self.primary = RedisServer("--repl-diskless-sync-delay", "0").start()
            self.primary_port = self.front(self.primary.port) if self.front else self.primary.port
            self.replica = RedisServer("--replicaof", HOST, str(self.primary_port)).start()
            for _ in range(self.sentinel_count):
                self.sentinels.append(self._start_sentinel())
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self) -> RedisServer:
        server = RedisServer("--sentinel")
        # (Sentinel rewrites its config file: one of its own, in its own dir)
        server.config_file = os.path.join(server.dir, "sentinel.conf")
        with open(server.config_file, "w", encoding="ascii") as out:
            out.write(
                f"sentinel monitor {self.service} {HOST} {self.primary_port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {self.service} 1000\n"
                f"sentinel failover-timeout {self.service} 2000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
        return server.start()

    def stop(self) -> None:
        """SIGTERM every process still running (by PID) and remove their temp dirs."""
        for server in [*self.sentinels, self.replica, self.primary]:
            if server is not None:
                server.cleanup()
        self.sentinels = []
        self.replica = self.primary = None

    def __enter__(self) -> RedisSentinelServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state --------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(HOST, sentinel.port) for sentinel in self.sentinels]

    def _ask(self, server: RedisServer, *command: Any) -> Any:
        client = server.client(socket_timeout=2, socket_connect_timeout=2, decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def _knows_everyone(self, sentinel: RedisServer) -> bool:
        try:
            host, port = self._ask(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            replicas = self._ask(sentinel, "SENTINEL", "REPLICAS", self.service)
            others = self._ask(sentinel, "SENTINEL", "SENTINELS", self.service)
        except (redis.RedisError, TypeError, ValueError):
            return False
        assert self.replica is not None
        known_replicas = {
            int(entry["port"]) for entry in map(_pairs, replicas) if "s_down" not in entry["flags"]
        }
        return (
            (host, int(port)) == (HOST, self.primary_port)
            and self.replica.port in known_replicas
            and len(others) == self.sentinel_count - 1
        )

    def _replica_in_sync(self) -> bool:
        assert self.replica is not None
        try:
            info = self.replica.client(socket_timeout=2).info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up"

    def wait_ready(self) -> None:
        """Until the replica's link to the primary is up and every sentinel knows the
        primary (at the address it hands out), the replica and every other sentinel."""
        wait_until(
            lambda: self._replica_in_sync() and all(map(self._knows_everyone, self.sentinels)),
            timeout=self.timeout,
            interval=0.05,
            what=f"sentinels {self.sentinel_addresses} to know {self.service}'s primary, "
            "replica and each other",
        )

    # -- Django settings ----------------------------------------------------

    def cache(self, db: int, **options: Any) -> dict[str, Any]:
        """A django-redis ``CACHES`` entry of database ``db`` of the service, through
        Sentinel (the project sets ``DJANGO_REDIS_CONNECTION_FACTORY`` to
        :data:`CONNECTION_FACTORY`); ``options``: more OPTIONS."""
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{self.service}/{db}",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
                "SENTINELS": self.sentinel_addresses,
                "SOCKET_CONNECT_TIMEOUT": 2,
                "SOCKET_TIMEOUT": 5,
                **options,
            },
        }


def _pairs(flat: Any) -> dict[str, str]:
    """A sentinel's reply entry (a flat [name, value, ...] list, or already a dict)."""
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
