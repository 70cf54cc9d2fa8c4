"""A Redis Sentinel deployment to fail over on purpose: kill, partition, lag, restart.

Two redis-servers (one primary, one replica at the start) and three sentinels,
every process on a free 127.0.0.1 port, started and stopped by PID. Everybody
reaches a server through its :class:`Front`, one address per server
(``127.0.0.1:<front port>``, the address the sentinels monitor and hand out, and
the one each server announces as a replica), which sends every connection down
one of three paths by where it comes from:

- ``sentinels``: the sentinels' links (they connect from ``127.0.0.2``,
  ``bind-source-addr``);
- ``replication``: the other server's replication link (servers connect from
  ``127.0.0.3``);
- ``clients``: everybody else (the shop's processes, from ``127.0.0.1``).

Each path is a :class:`~tests.support.fault_proxy.FaultProxy` to the server, so
a test stalls or cuts one path and leaves the others: cut the primary off from
the sentinels and its replica while clients still reach it (:meth:`partition`),
or hold the replication stream so that the replica lags (:meth:`hold_replication`).
``far_sentinels``: a FaultProxy in front of each sentinel, the sentinels as the
clients on the primary's side of a partition reach them (configure those clients
with ``far=True``); :meth:`partition` stalls them too.

    with FailoverDeployment() as deployment:
        old = deployment.primary()
        deployment.hold_replication()          # the replica stops hearing the primary
        ...                                    # writes the replica never sees
        lag = deployment.kill(old)             # SIGKILL; the held stream is dropped
        new = deployment.wait_promoted(old)
        deployment.restart(old)
        deployment.wait_rejoined(old)          # a replica of the new primary, in sync

Django settings of a project on it, in the two forms a backend takes (a
``redis+sentinel://`` LOCATION, or OPTIONS SENTINELS and SERVICE_NAME), serve its
sync and asyncio clients alike: :meth:`FailoverDeployment.backend_entry` and
:meth:`FailoverDeployment.stock_locks_settings`.

Nothing here judges an outcome: helpers return what they saw (roles, lag in bytes,
the new primary), so that a benchmark can drive the same deployment and count; a
wait that does not get there in ``timeout`` raises AssertionError (``wait_until``).
A promotion takes about 2 s after a kill or a partition (down-after 1 s); a primary
restarted or healed rejoins as a replica about 10 s later (Sentinel waits 8 s before
it reconfigures a server that reports itself a primary).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from .fault_proxy import FaultProxy
from .redis_servers import RedisServer
from .waiting import TIMEOUT, wait_until

HOST = "127.0.0.1"
SERVICE = "mymaster"
QUORUM = 2
SENTINEL_SOURCE = "127.0.0.2"  # where the sentinels' connections come from
REPLICATION_SOURCE = "127.0.0.3"  # where the servers' replication connections come from
PATHS = ("clients", "sentinels", "replication")
DOWN_AFTER_MS = 1000  # a primary silent this long is subjectively down
FAILOVER_TIMEOUT_MS = 2000
BUFFER = 65536
BACKEND = "stock_locks.backends.redis.RedisBackend"


def _path_of(peer: str) -> str:
    if peer == SENTINEL_SOURCE:
        return "sentinels"
    if peer == REPLICATION_SOURCE:
        return "replication"
    return "clients"


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either end closes; then close both."""
    try:
        while data := source.recv(BUFFER):
            sink.sendall(data)
    except OSError:
        pass
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


class Front:
    """``127.0.0.1:port``: the one address of a redis-server, each connection sent down
    the path of where it comes from (``paths``: path name -> its FaultProxy to the
    server; see the module). ``start()``, ``close()``; :meth:`stall`, :meth:`resume`,
    :meth:`cut` take path names (none: every path)."""

    def __init__(self, target_port: int) -> None:
        self.paths: dict[str, FaultProxy] = {path: FaultProxy(target_port) for path in PATHS}
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False

    def start(self) -> Front:
        for proxy in self.paths.values():
            proxy.start()
        self._listener.listen(128)
        threading.Thread(target=self._accept, name=f"front-{self.port}", daemon=True).start()
        return self

    def retarget(self, port: int) -> None:
        """Send the paths to the server at ``port`` from now on (a server that had to
        start on another port)."""
        for proxy in self.paths.values():
            proxy.target = (HOST, port)

    def _chosen(self, paths: Iterable[str]) -> list[FaultProxy]:
        names = list(paths) or list(PATHS)
        return [self.paths[name] for name in names]

    def stall(self, *paths: str) -> None:
        """Forward nothing on ``paths`` (bytes wait, connections stay open) until resumed."""
        for proxy in self._chosen(paths):
            proxy.stall()

    def resume(self, *paths: str) -> None:
        for proxy in self._chosen(paths):
            proxy.resume()

    def cut(self, *paths: str) -> None:
        """Close every open connection of ``paths`` (what they held is dropped)."""
        for proxy in self._chosen(paths):
            proxy.cut()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        for proxy in self.paths.values():
            proxy.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, (peer, _) = self._listener.accept()
            except OSError:
                return
            path = self.paths[_path_of(peer)]
            try:
                upstream = socket.create_connection((HOST, path.port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open = [s for s in self._open if s.fileno() != -1] + [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


@dataclass
class Node:
    """One redis-server of the deployment and its :class:`Front`. ``address``: where
    everybody reaches it (the front); :meth:`client`: straight to the server (an
    observer's client, past every fault)."""

    name: str
    server: RedisServer
    front: Front

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self.front.port)

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 2)
        kwargs.setdefault("socket_connect_timeout", 2)
        return self.server.client(**kwargs)

    def ask(self, *command: Any) -> Any:
        """``command``'s reply, straight from the server (decoded)."""
        client = self.client(decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def replication(self) -> dict[str, Any]:
        """The server's INFO replication; {} when it does not answer (killed, stopped)."""
        client = self.client(decode_responses=True)
        try:
            return dict(client.info("replication"))
        except (redis.RedisError, OSError):
            return {}
        finally:
            client.close()

    def role(self) -> str:
        """The server's role: "master", "slave", or "" when it does not answer."""
        return str(self.replication().get("role", ""))

    @property
    def running(self) -> bool:
        process = self.server.process
        return process is not None and process.poll() is None

    def __repr__(self) -> str:
        return f"<Node {self.name} server :{self.server.port} front :{self.front.port}>"


class FailoverDeployment:
    """Two redis-servers (``nodes``; the first starts as the primary) and three
    sentinels, each server behind a :class:`Front`; see the module. ``start()`` /
    ``stop()`` (every process by PID, every proxy closed), or a context manager."""

    def __init__(
        self,
        service: str = SERVICE,
        sentinels: int = 3,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
        timeout: float = TIMEOUT,
    ) -> None:
        self.service = service
        self.sentinel_count = sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.timeout = timeout
        self.nodes: list[Node] = []
        self.sentinels: list[RedisServer] = []
        self.far_sentinels: list[FaultProxy] = []
        self.promoted_at = 0.0  # (wait_promoted)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FailoverDeployment:
        """Start both servers and the sentinels; return once the replica is in sync and
        every sentinel knows the primary, the replica and the other sentinels."""
        try:
            first = self._start_node("a", replica_of=None)
            self._start_node("b", replica_of=first)
            for _ in range(self.sentinel_count):
                self.sentinels.append(self._start_sentinel(first))
            self.far_sentinels = [FaultProxy(s.port).start() for s in self.sentinels]
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, name: str, replica_of: Node | None) -> Node:
        server = RedisServer()  # (its port is chosen now, the process starts below)
        front = Front(server.port).start()
        server.extra_args += [
            "--protected-mode", "no",
            "--bind-source-addr", REPLICATION_SOURCE,
            "--replica-announce-ip", HOST,
            "--replica-announce-port", str(front.port),
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if replica_of is not None:
            server.extra_args += ["--replicaof", HOST, str(replica_of.front.port)]
        node = Node(name, server, front)
        self.nodes.append(node)
        self._start_server(node)
        return node

    @staticmethod
    def _start_server(node: Node) -> None:
        node.server.start()
        node.front.retarget(node.server.port)  # (start() moves to another port on a race)

    def _start_sentinel(self, primary: Node) -> RedisServer:
        server = RedisServer(
            "--sentinel", "--protected-mode", "no", "--bind-source-addr", SENTINEL_SOURCE
        )
        # (Sentinel rewrites its config file: one of its own, in its own dir)
        server.config_file = os.path.join(server.dir, "sentinel.conf")
        with open(server.config_file, "w", encoding="ascii") as out:
            out.write(
                f"sentinel monitor {self.service} {HOST} {primary.front.port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {self.service} 1\n"
                # (its links come from SENTINEL_SOURCE; the others must dial it here)
                f"sentinel announce-ip {HOST}\n"
            )
        return server.start()

    def stop(self) -> None:
        """SIGTERM every process still running (by PID), remove their temp dirs, close
        every proxy."""
        for proxy in self.far_sentinels:
            proxy.close()
        for server in self.sentinels:
            server.cleanup()
        for node in self.nodes:
            node.front.close()
            node.server.cleanup()
        self.far_sentinels, self.sentinels, self.nodes = [], [], []

    def __enter__(self) -> FailoverDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the sentinels say ----------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(HOST, s.port) for s in self.sentinels]

    @property
    def far_sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(HOST, p.port) for p in self.far_sentinels]

    def _ask_sentinel(self, sentinel: RedisServer, *command: Any) -> Any:
        client = sentinel.client(socket_timeout=2, socket_connect_timeout=2, decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def _named_by(self, sentinel: RedisServer) -> int | None:
        """The front port ``sentinel`` names as the primary's (None: no answer)."""
        try:
            reply = self._ask_sentinel(
                sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
            )
        except (redis.RedisError, OSError):
            return None
        return int(reply[1]) if reply else None

    def _replicas_known_by(self, sentinel: RedisServer) -> dict[int, dict[str, str]]:
        """Front port -> the replica's entry, as ``sentinel`` knows them ({}: no answer)."""
        try:
            replies = self._ask_sentinel(sentinel, "SENTINEL", "REPLICAS", self.service)
        except (redis.RedisError, OSError):
            return {}
        return {int(e["port"]): e for e in map(_pairs, replies)}

    def node_at(self, port: int | None) -> Node | None:
        return next((n for n in self.nodes if n.front.port == port), None)

    def other(self, node: Node) -> Node:
        return next(n for n in self.nodes if n is not node)

    def primary(self) -> Node:
        """The node the sentinels name as the primary now (the first one's answer)."""
        for sentinel in self.sentinels:
            node = self.node_at(self._named_by(sentinel))
            if node is not None:
                return node
        raise LookupError(f"no sentinel names a primary of {self.service}")

    def _agreed_on(self, node: Node) -> bool:
        return all(self._named_by(s) == node.front.port for s in self.sentinels)

    def _heard_by_all(self, node: Node) -> bool:
        """Every sentinel names ``node`` as the primary and has heard it since: a link up
        and no PING waiting for a reply (``last-ping-sent`` 0; a switch starts the wait).

        A sentinel that switches to a new primary counts that primary's silence from the
        switch, but may wait up to a second (its reconnect period) before it dials it:
        with down-after 1 s, a new primary a sentinel has not heard yet can be judged
        down at once and failed over again, to whichever replica answers, such as the
        old primary just restarted empty."""
        for sentinel in self.sentinels:
            entry = _pairs(self._ask_sentinel(sentinel, "SENTINEL", "MASTER", self.service))
            if not (
                int(entry["port"]) == node.front.port
                and entry["flags"] == "master"
                and int(entry["last-ping-sent"]) == 0
            ):
                return False
        return True

    def _in_sync(self, replica: Node, primary: Node) -> bool:
        """``replica`` replicates ``primary`` (at its front), link up, and every sentinel
        lists it as a replica that is neither down nor disconnected."""
        info = replica.replication()
        if not (
            info.get("role") == "slave"
            and int(info.get("master_port", 0)) == primary.front.port
            and info.get("master_link_status") == "up"
        ):
            return False
        for sentinel in self.sentinels:
            entry = self._replicas_known_by(sentinel).get(replica.front.port)
            if entry is None or any(f in entry["flags"] for f in ("s_down", "disconnected")):
                return False
        return True

    def wait_ready(self) -> None:
        """Until the replica is in sync with the primary (as the sentinels see it too)
        and every sentinel knows the primary and the other sentinels."""
        primary, replica = self.nodes[0], self.nodes[1]

        def ready() -> bool:
            others = [
                self._ask_sentinel(s, "SENTINEL", "SENTINELS", self.service) for s in self.sentinels
            ]
            return (
                self._agreed_on(primary)
                and all(len(o) == self.sentinel_count - 1 for o in others)
                and self._in_sync(replica, primary)
            )

        wait_until(
            _quietly(ready),
            timeout=self.timeout,
            interval=0.05,
            what=f"the sentinels to know {self.service}'s primary, replica and each other",
        )

    # -- faults ----------------------------------------------------------------------------------

    def hold_replication(self, primary: Node | None = None) -> None:
        """The replica stops hearing ``primary`` (default: the current one): its
        replication stream (and the replica's acknowledgements) wait in the network, the
        connection stays up. Writes the primary acknowledges from now on are on the
        primary alone until :meth:`release_replication`."""
        (primary or self.primary()).front.stall("replication")

    def release_replication(self, primary: Node | None = None) -> None:
        (primary or self.primary()).front.resume("replication")

    def replication_lag(self, primary: Node | None = None) -> int:
        """Bytes of ``primary``'s replication stream its replica has not processed
        (0 when either does not answer)."""
        primary = primary or self.primary()
        sent = int(primary.replication().get("master_repl_offset", 0) or 0)
        heard = int(self.other(primary).replication().get("slave_repl_offset", 0) or 0)
        return max(0, sent - heard) if sent and heard else 0

    def kill(self, node: Node) -> int:
        """SIGKILL ``node``'s server (by PID), then drop whatever its front still held
        (a held replication stream: writes its replica never gets) and let the front
        flow again (to nothing: connections to a dead server fail at once). Returns the
        replication lag in bytes just before the kill."""
        lag = self.replication_lag(node) if node.role() == "master" else 0
        node.server.kill()
        node.front.cut()
        node.front.resume()
        return lag

    def partition(self, node: Node) -> None:
        """Cut ``node`` off from the sentinels and from the other server (packets held,
        no reset, as a network partition does), and the far sentinels off from their
        clients; clients still reach ``node`` through its front."""
        node.front.stall("sentinels", "replication")
        for proxy in self.far_sentinels:
            proxy.stall()

    def heal(self, node: Node) -> None:
        """Undo :meth:`partition`: what was held flows, late."""
        node.front.resume("sentinels", "replication")
        for proxy in self.far_sentinels:
            proxy.resume()

    def failover(self) -> None:
        """``SENTINEL FAILOVER`` (the old primary stays up; both are primaries until the
        sentinels demote it)."""
        self._ask_sentinel(self.sentinels[0], "SENTINEL", "FAILOVER", self.service)

    def restart(self, node: Node, *, as_replica_of: Node | None = None) -> None:
        """Start ``node``'s server again on its port, empty (nothing is persisted): as the
        primary it was configured as (the sentinels then convert it into a replica), or
        ``as_replica_of`` a node (as a configuration rewritten by hand would)."""
        args = node.server.extra_args
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
        if as_replica_of is not None:
            args += ["--replicaof", HOST, str(as_replica_of.front.port)]
        node.server.stop()
        node.front.cut()
        node.front.resume()
        self._start_server(node)

    def config_set(self, node: Node, name: str, value: Any) -> None:
        node.ask("CONFIG", "SET", name, value)

    # -- waiting for the sentinels ---------------------------------------------------------------

    def wait_promoted(self, old: Node, timeout: float | None = None) -> Node:
        """Until the other node is a primary and every sentinel names it (then
        :attr:`promoted_at` is the monotonic time), and until every sentinel has heard
        it answer since (:meth:`_heard_by_all`: before, the sentinels may fail it over
        again); returns it."""
        new = self.other(old)
        deadline = time.monotonic() + (timeout or self.timeout)
        wait_until(
            _quietly(lambda: new.role() == "master" and self._agreed_on(new)),
            timeout=timeout or self.timeout,
            interval=0.02,
            what=f"{new} promoted and named by every sentinel",
        )
        self.promoted_at = time.monotonic()
        wait_until(
            _quietly(lambda: self._heard_by_all(new)),
            timeout=max(0.0, deadline - self.promoted_at),
            interval=0.02,
            what=f"every sentinel to hear {new} since its promotion",
        )
        return new

    def wait_rejoined(self, node: Node, timeout: float | None = None) -> Node:
        """Until ``node`` is a replica of the primary the sentinels name (link up, known
        to every sentinel as a replica neither down nor disconnected); returns that
        primary. (A restarted primary, or one healed after a partition, reports itself
        a primary for a while: the sentinels reconfigure it after about 8 s.)"""
        primary = self.other(node)
        try:
            wait_until(
                _quietly(lambda: self._agreed_on(primary) and self._in_sync(node, primary)),
                timeout=timeout or self.timeout,
                interval=0.05,
                what=f"{node} to rejoin as a replica of {primary}",
            )
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}\n{self.state(node)}") from None
        return primary

    def state(self, node: Node, lines: int = 40) -> str:
        """What the servers and sentinels say of ``node`` now, and the end of their logs
        (for a wait's failure message: the deployment's directories go with it)."""
        keys = ("role", "master_port", "master_link_status", "master_sync_in_progress")
        out = []
        for each in self.nodes:
            info = each.replication()
            out.append(f"{each}: " + ", ".join(f"{k}={info.get(k)}" for k in keys))
        for sentinel in self.sentinels:
            entry = self._replicas_known_by(sentinel).get(node.front.port, {})
            try:
                tilt = self._ask_sentinel(sentinel, "INFO", "sentinel").get("sentinel_tilt")
            except (redis.RedisError, OSError) as exc:
                tilt = exc
            out.append(
                f"sentinel :{sentinel.port}: names :{self._named_by(sentinel)}, tilt={tilt}, "
                f"{node} flags={entry.get('flags')}"
            )
        for server in [*(each.server for each in self.nodes), *self.sentinels]:
            try:
                with open(os.path.join(server.dir, "redis.log"), encoding="utf-8") as log:
                    tail = log.readlines()[-lines:]
            except OSError as exc:
                tail = [f"({exc})\n"]
            out.append(f"-- log of :{server.port} --\n" + "".join(tail))
        return "\n".join(out)

    def wait_in_sync(self, timeout: float | None = None) -> None:
        """Until the replica has processed everything the primary sent (offsets equal)."""
        primary = self.primary()
        replica = self.other(primary)

        def caught_up() -> bool:
            sent = primary.replication().get("master_repl_offset")
            heard = replica.replication().get("slave_repl_offset")
            return sent is not None and sent == heard

        wait_until(
            caught_up,
            timeout=timeout or self.timeout,
            interval=0.01,
            what=f"{replica} to catch up with {primary}",
        )

    # -- Django settings ------------------------------------------------------------------------

    def sentinel_url(self, db: int = 0, *, far: bool = False) -> str:
        addresses = self.far_sentinel_addresses if far else self.sentinel_addresses
        hosts = ",".join(f"{host}:{port}" for host, port in addresses)
        return f"redis+sentinel://{hosts}/{self.service}/{db}"

    def backend_entry(
        self, form: str = "location", *, far: bool = False, db: int = 0, **options: Any
    ) -> dict[str, Any]:
        """A ``STOCK_LOCKS["BACKENDS"]`` entry of database ``db`` of the service: by a
        ``redis+sentinel://`` LOCATION (``form="location"``) or by OPTIONS SENTINELS,
        SERVICE_NAME and DB (``form="options"``); ``options``: more OPTIONS. ``far``:
        through :attr:`far_sentinels`, as the clients on the primary's side of a
        partition reach the sentinels."""
        entry: dict[str, Any] = {"BACKEND": BACKEND}
        if form == "location":
            entry["LOCATION"] = self.sentinel_url(db, far=far)
            entry["OPTIONS"] = dict(options)
        elif form == "options":
            addresses = self.far_sentinel_addresses if far else self.sentinel_addresses
            entry["OPTIONS"] = {
                "SENTINELS": addresses,
                "SERVICE_NAME": self.service,
                "DB": db,
                **options,
            }
        else:
            raise ValueError(f"form is 'location' or 'options', not {form!r}")
        return entry

    def stock_locks_settings(
        self,
        base: Mapping[str, Any],
        form: str = "location",
        *,
        far: bool = False,
        extra: Mapping[str, Any] | None = None,
        backends: Mapping[str, dict[str, Any]] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """A ``STOCK_LOCKS`` setting: ``base`` (the project's), ``extra`` settings over it,
        and a default backend :meth:`backend_entry` ``(form, far=far, **options)``, so
        that locks, the asyncio primitives and :func:`get_redis` (stock strategies,
        delay queue, sweeper) all use the service; ``backends``: more aliases."""
        return {
            **base,
            **(extra or {}),
            "BACKENDS": {
                "default": self.backend_entry(form, far=far, **options),
                **(backends or {}),
            },
        }


def _quietly(predicate: Callable[[], Any]) -> Callable[[], Any]:
    """``predicate`` with a server or sentinel that does not answer read as "not yet"."""

    def call() -> Any:
        try:
            return predicate()
        except (redis.RedisError, OSError, LookupError):
            return False

    return call


def _pairs(flat: Any) -> dict[str, str]:
    """A sentinel's reply entry (a flat [name, value, ...] list, or already a dict)."""
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
