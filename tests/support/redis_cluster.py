"""A private Redis Cluster for the tests: N masters, each with its replicas, on 127.0.0.1.

Every node is a :class:`~tests.support.redis_servers.RedisServer` (free port, no
persistence, its own temp dir) started with ``--cluster-enabled yes`` and a short
node timeout, so a killed master's replica takes over in a couple of seconds.
The nodes are joined with ``redis-cli --cluster create``; :meth:`start` returns
once every node agrees the cluster is ``ok``, all 16384 slots are served and
every replica's link to its master is up.

The topology (who is master of which slot) is read from the nodes themselves on
each call, never cached, so it stays right after a failover.

:func:`shared_cluster` is the test process's one cluster, for every suite of a
run that needs one (tests/cluster, the contract suite): starting six nodes once
is what a cluster costs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from stock_locks.backends.redis.protocol import decoded

from .redis_servers import RedisServer, free_port, redis_server_binary
from .waiting import TIMEOUT, wait_until

HOST = "127.0.0.1"
SLOTS = 16384
BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000


def redis_cli_binary() -> str:
    """redis-cli: $REDIS_CLI_BIN, next to redis-server, or on PATH."""
    path = os.environ.get("REDIS_CLI_BIN")
    if path:
        return path
    beside = os.path.join(os.path.dirname(redis_server_binary()), "redis-cli")
    if os.access(beside, os.X_OK):
        return beside
    path = shutil.which("redis-cli")
    if not path:
        raise RuntimeError("redis-cli not found: install redis-tools or set REDIS_CLI_BIN")
    return path


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too and exists: a node on
    a port above 55535 exits at once ("Redis port number too high")."""
    for _attempt in range(200):
        port = free_port()
        if port + BUS_OFFSET > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port + BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000) for a cluster node")


class RedisClusterServers:
    """``masters`` masters with ``replicas_per_master`` replicas each.

    ``start()`` / ``stop()``; ``client()`` is a ``RedisCluster`` of it;
    ``master_for_key(key)``, ``kill_master_for_key(key)`` and ``wait_failover(key)``
    drive a failover; ``heal()`` restarts killed nodes (they rejoin as replicas).
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1000,
        timeout: float = TIMEOUT,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.masters = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.timeout = timeout
        self.servers: list[RedisServer] = []
        self.killed: list[RedisServer] = []

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> RedisClusterServers:
        try:
            for _ in range(self.masters * (1 + self.replicas_per_master)):
                server = RedisServer(port=cluster_port())
                server.extra_args += [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", os.path.join(server.dir, "nodes.conf"),
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    # A replica may always take over, however long since it last heard its master.
                    "--cluster-replica-validity-factor", "0",
                    # Replicas sync at once (the 5 s default waits for more replicas to batch).
                    "--repl-diskless-sync-delay", "0",
                ]  # fmt: skip
                self.servers.append(server)
                server.start()
            self._create()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self) -> None:
        command = [
            redis_cli_binary(),
            "--cluster", "create",
            *(f"{HOST}:{server.port}" for server in self.servers),
            "--cluster-replicas", str(self.replicas_per_master),
            "--cluster-yes",
        ]  # fmt: skip
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=self.timeout,
        )
        if result.returncode != 0 or "[OK] All 16384 slots covered" not in result.stdout:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            )

    def stop(self) -> None:
        """SIGTERM every node still running (by PID) and remove their temp dirs."""
        for server in self.servers:
            server.cleanup()
        self.servers = []
        self.killed = []

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and clients ----------------------------------------------

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, server.port) for server in self.servers]

    @property
    def url(self) -> str:
        """``redis://`` of the first node (in start order) that is a master now."""
        return f"redis://{HOST}:{self.current_masters()[0].port}"

    @property
    def urls(self) -> list[str]:
        """``redis://`` of every node (running or not), in start order: seed nodes, of
        which any reachable one finds the others."""
        return [f"redis://{HOST}:{server.port}" for server in self.servers]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A ``RedisCluster`` seeded with every node still running; ``kwargs`` go to it."""
        nodes = [ClusterNode(HOST, server.port) for server in self.live()]
        return RedisCluster(startup_nodes=nodes, **kwargs)

    def live(self) -> list[RedisServer]:
        """The nodes whose process is running."""
        return [s for s in self.servers if s.process is not None and s.process.poll() is None]

    def node_on_port(self, port: int) -> RedisServer:
        """The node (running or not) listening on ``port``."""
        for server in self.servers:
            if server.port == port:
                return server
        raise LookupError(f"no node of this cluster on port {port}")

    def _ask(self, server: RedisServer, call: Callable[[redis.Redis], Any]) -> Any:
        client = server.client(socket_timeout=2, socket_connect_timeout=2)
        try:
            return call(client)
        finally:
            client.close()

    # -- topology (read from the nodes each time) ---------------------------

    def _cluster_slots(self, server: RedisServer) -> list[tuple[int, int, int]]:
        reply = self._ask(server, lambda c: c.execute_command("CLUSTER", "SLOTS"))
        return [(int(entry[0]), int(entry[1]), int(entry[2][1])) for entry in reply]

    def _info(self, server: RedisServer, section: str) -> dict[str, str]:
        """CLUSTER INFO (``section`` "cluster") or INFO ``section`` of ``server``, as text."""
        if section == "cluster":
            raw = decoded(self._ask(server, lambda c: c.execute_command("CLUSTER", "INFO")))
            pairs = (line.split(":", 1) for line in raw.splitlines() if ":" in line)
            return {name: value.strip() for name, value in pairs}
        return {k: str(v) for k, v in self._ask(server, lambda c: c.info(section)).items()}

    def current_masters(self) -> list[RedisServer]:
        """Running nodes that report ``role:master``, in start order."""
        return [s for s in self.live() if self._info(s, "replication").get("role") == "master"]

    def current_replicas(self) -> list[RedisServer]:
        """Running nodes that report ``role:slave``, in start order."""
        return [s for s in self.live() if self._info(s, "replication").get("role") == "slave"]

    def slot_for_key(self, key: str | bytes) -> int:
        return key_slot(key.encode() if isinstance(key, str) else key)

    def master_for_key(self, key: str | bytes) -> RedisServer:
        """The node serving ``key``'s slot now, as the first running node sees it."""
        slot = self.slot_for_key(key)
        for server in self.live():
            try:
                for start, end, port in self._cluster_slots(server):
                    if start <= slot <= end:
                        return self.node_on_port(port)
            except redis.RedisError:
                continue
        raise LookupError(f"no running node knows who serves slot {slot} (key {key!r})")

    def kill_master_for_key(self, key: str | bytes) -> RedisServer:
        """SIGKILL the master serving ``key``'s slot; returns it (its process is gone)."""
        server = self.master_for_key(key)
        server.kill()
        self.killed.append(server)
        return server

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The running replicas of ``master`` (by their own INFO replication)."""
        return [
            server
            for server in self.current_replicas()
            if int(self._info(server, "replication").get("master_port", 0)) == master.port
        ]

    def sync_replicas(self, key: str | bytes, timeout: float | None = None) -> None:
        """Until every replica of ``key``'s master has everything written to it so far:
        one write on that master (a key of the same slot) and ``WAIT`` for its replicas
        (replication is one stream, so the later write's ack covers every earlier one)."""
        from stock_locks.keys import slot_tag

        master = self.master_for_key(key)
        replicas = len(self.replicas_of(master))
        marker = f"{{{slot_tag(self.slot_for_key(key))}}}:sync"
        wait_ms = int((timeout or self.timeout) * 1000)

        def write_and_wait(client: redis.Redis) -> int:
            client.incr(marker)
            return int(client.execute_command("WAIT", replicas, wait_ms))

        client = master.client(socket_timeout=(timeout or self.timeout) + 1)
        try:
            confirmed = write_and_wait(client)
        finally:
            client.close()
        if confirmed < replicas:
            raise AssertionError(f"{confirmed} of {replicas} replicas of {master.port} synced")

    def detach_replica(self, master: RedisServer) -> RedisServer:
        """Stop ``master``'s replica receiving anything more (returns the replica).

        The replica is paused (SIGSTOP) and the master then drops its replication
        link (``CLIENT KILL TYPE replica``); a paused replica cannot reconnect, so
        what the master writes from now on reaches no replica. (A pause alone is not
        enough: the kernel keeps receiving what the master sends, and the replica
        applies it when it resumes.) :meth:`resume` lets it run again.
        """
        [replica] = self.replicas_of(master)
        os.kill(replica.pid, signal.SIGSTOP)
        self._ask(master, lambda c: c.execute_command("CLIENT", "KILL", "TYPE", "replica"))
        return replica

    @staticmethod
    def resume(server: RedisServer) -> None:
        """SIGCONT a node that :meth:`detach_replica` paused."""
        os.kill(server.pid, signal.SIGCONT)

    def failover(self, key: str | bytes, timeout: float | None = None) -> RedisServer:
        """A manual ``CLUSTER FAILOVER``: a replica of ``key``'s master takes its slots
        over after catching up with it (nothing is lost) and the old master becomes
        its replica. Returns the new master once every node agrees (3 + 3 again)."""
        old = self.master_for_key(key)
        new = self.replicas_of(old)[0]
        self._ask(new, lambda c: c.execute_command("CLUSTER", "FAILOVER"))

        def promoted() -> bool:
            return self._healthy(expect_replicas=True) and self.master_for_key(key) is new

        wait_until(
            promoted, timeout=timeout or self.timeout, interval=0.05, what="a manual failover"
        )
        return new

    def node_id(self, server: RedisServer) -> str:
        return decoded(self._ask(server, lambda c: c.execute_command("CLUSTER", "MYID")))

    def master_of_slot(self, slot: int) -> RedisServer:
        """The node serving ``slot`` now, as the first running node that answers sees it."""
        for server in self.live():
            try:
                for start, end, port in self._cluster_slots(server):
                    if start <= slot <= end:
                        return self.node_on_port(port)
            except redis.RedisError:
                continue
        raise LookupError(f"no running node knows who serves slot {slot}")

    def move_slot(
        self, slot: int, target: RedisServer, timeout: float | None = None
    ) -> RedisServer:
        """Reshard one slot to the master ``target``, the way ``redis-cli --cluster
        reshard`` does: ``CLUSTER SETSLOT slot IMPORTING`` on the target, ``MIGRATING``
        on the source, ``MIGRATE`` of its keys (TTLs kept), then ``CLUSTER SETSLOT slot
        NODE target`` on every master (target first, then source). Returns the source
        once every running node (replicas too) names the target for the slot and the
        cluster is healthy again. A client's cached slot map is stale from then on."""
        source = self.master_of_slot(slot)
        if source is target:
            return source
        source_id, target_id = self.node_id(source), self.node_id(target)
        self._ask(
            target, lambda c: c.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        )
        self._ask(
            source, lambda c: c.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        )

        def migrate_some(client: redis.Redis) -> bool:
            keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if keys:  # (TTLs travel with them)
                client.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys)
            return bool(keys)

        while self._ask(source, migrate_some):
            pass
        others = [m for m in self.current_masters() if m is not source and m is not target]
        for server in (target, source, *others):
            self._ask(
                server, lambda c: c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            )

        def everyone_agrees() -> bool:
            for server in self.live():
                try:
                    owners = [p for a, b, p in self._cluster_slots(server) if a <= slot <= b]
                except redis.RedisError:
                    return False
                if owners != [target.port]:
                    return False
            return self._healthy(expect_replicas=True)

        wait_until(
            everyone_agrees,
            timeout=timeout or self.timeout,
            interval=0.05,
            what=f"every node to name {target.port} as the master of slot {slot}",
        )
        return source

    # -- waits --------------------------------------------------------------

    def _healthy(self, expect_replicas: bool) -> bool:
        live = self.live()
        if not live:
            return False
        views = []
        try:
            for server in live:
                info = self._info(server, "cluster")
                if info.get("cluster_state") != "ok":
                    return False
                if int(info.get("cluster_slots_ok", 0)) != SLOTS:
                    return False
                if int(info.get("cluster_known_nodes", 0)) < len(live):
                    return False
                views.append(sorted(self._cluster_slots(server)))
            if any(view != views[0] for view in views):
                return False  # the nodes do not agree yet on who serves what
            masters = {port for _, _, port in views[0]}
            if not masters <= {server.port for server in live}:
                return False  # a dead node still listed as serving slots
            replicas_of = dict.fromkeys(masters, 0)
            for server in live:
                info = self._info(server, "replication")
                if info.get("role") == "slave":
                    master_port = int(info.get("master_port", 0))
                    if info.get("master_link_status") != "up" or master_port not in masters:
                        return False
                    replicas_of[master_port] += 1
                elif server.port not in masters:
                    return False  # a master without slots: not the layout asked for
            if expect_replicas and (
                len(masters) != self.masters
                or any(n != self.replicas_per_master for n in replicas_of.values())
            ):
                return False
        except redis.RedisError:
            return False
        return True

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Until every running node: cluster_state ok, 16384 slots ok, the same
        slot map, every replica's link to its master up; ``masters`` masters with
        ``replicas_per_master`` replicas each."""
        wait_until(
            lambda: self._healthy(expect_replicas=True),
            timeout=timeout or self.timeout,
            interval=0.05,
            what=f"a healthy cluster on {self.startup_nodes}",
        )

    def wait_failover(self, key: str | bytes, timeout: float | None = None) -> RedisServer:
        """Until a running node other than the killed ones serves ``key``'s slot,
        and every running node says cluster_state ok with that slot map. Returns
        the new master."""
        slot = self.slot_for_key(key)
        dead = {server.port for server in self.killed}

        def promoted() -> RedisServer | None:
            if not self._healthy(expect_replicas=False):
                return None
            server = self.master_for_key(key)
            if server.port in dead:
                return None
            if self._info(server, "replication").get("role") != "master":
                return None
            return server

        return wait_until(
            promoted,
            timeout=timeout or self.timeout,
            interval=0.05,
            what=f"a replica to take over slot {slot} (key {key!r})",
        )

    def heal(self, timeout: float | None = None) -> None:
        """Restart every killed node on its port with its nodes.conf: it rejoins
        as a replica of whoever took its slots. Then :meth:`wait_healthy`."""
        while self.killed:
            self.killed.pop().start()
        self.wait_healthy(timeout)

    # -- data ---------------------------------------------------------------

    def flushall(self) -> None:
        """FLUSHALL on every master (replicas follow)."""
        for server in self.current_masters():
            self._ask(server, lambda c: c.flushall())


_shared: RedisClusterServers | None = None
_shared_lock = threading.Lock()


def shared_cluster() -> RedisClusterServers:
    """The test process's one cluster (3 masters, 3 replicas), started on first use
    and stopped (SIGTERM by PID) when the process exits. Its users flush it as they
    need; one that kills a node heals it before it returns, and one that finds a node
    still killed (a test that failed half-way) heals it first."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = RedisClusterServers().start()
            atexit.register(_shared.stop)
        elif _shared.killed:
            _shared.heal()
        return _shared
