"""Private ZooKeeper servers for the tests: Debian's ``zookeeper`` package, 127.0.0.1,
free ports, a data directory of their own, stopped by PID.

``ZooKeeperServer().start()`` is one standalone server (most tests);
``ZooKeeperEnsemble(3).start()`` three peers that elect a leader (the failover
tests); the fixtures ``zookeeper_server`` (session-wide) and
``zookeeper_ensemble`` (per test) start them, and a test module imports the
fixture it uses. Both tick every ``TICK_MS`` so that sessions may be short (the server
accepts session timeouts from 2 to 150 ticks) and a dead leader is noticed
quickly (``SYNC_LIMIT`` ticks). The JVM flags trade throughput for start-up
time; nothing is fsynced (a killed server keeps what it wrote: the kernel
still has it), and the transaction log is not preallocated.

A server is ready when it answers the ``srvr`` four-letter command with its
``Mode`` (standalone, leader or follower): it then serves requests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .redis_servers import free_port
from .waiting import TIMEOUT, wait_until

ZOOKEEPER_JAR = os.environ.get("ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar")
TICK_MS = 200
SYNC_LIMIT = 5  # ticks a follower may lag before the leader drops it (and vice versa)
INIT_LIMIT = 25  # ticks a follower may take to connect and sync to a new leader
JVM_FLAGS = (
    "-Xmx96m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
    "-Djava.net.preferIPv4Stack=true", "-Dzookeeper.admin.enableServer=false",
)  # fmt: skip


def java_binary() -> str:
    path = os.environ.get("JAVA_BIN") or shutil.which("java")
    if not path or not Path(ZOOKEEPER_JAR).is_file():
        raise RuntimeError(
            f"ZooKeeper not found ({ZOOKEEPER_JAR}, java): run scripts/setup.sh "
            "(it installs Debian's zookeeper package) or set ZOOKEEPER_JAR and JAVA_BIN"
        )
    return path


def four_letters(port: int, command: bytes, timeout: float = 1.0) -> str:
    """The reply of a four-letter command (``ruok``, ``srvr``...), '' when none came."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(command)
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""


class ZooKeeperServer:
    """One ZooKeeper server process: ``start()``, ``stop()`` (SIGTERM), ``kill()``
    (SIGKILL), ``pause()``/``resume()`` (SIGSTOP/SIGCONT). ``peers`` (myid -> the
    quorum ports of every member, itself included) makes it an ensemble member."""

    def __init__(self, myid: int = 0, peers: dict[int, tuple[int, int]] | None = None) -> None:
        self.myid = myid
        self.peers = peers
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="sl-zookeeper-")
        self.process: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _config(self) -> Path:
        data = Path(self.dir, "data")
        data.mkdir(exist_ok=True)
        lines = [
            f"tickTime={TICK_MS}",
            f"initLimit={INIT_LIMIT}",
            f"syncLimit={SYNC_LIMIT}",
            f"dataDir={data}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "maxSessionTimeout=30000",
            "4lw.commands.whitelist=*",
            "admin.enableServer=false",
            "forceSync=no",
            "preAllocSize=1024",
            "maxClientCnxns=0",
        ]
        if self.peers:
            (data / "myid").write_text(f"{self.myid}\n")
            for myid, (quorum, election) in sorted(self.peers.items()):
                lines.append(f"server.{myid}=127.0.0.1:{quorum}:{election}")
            lines.append("electionPortBindRetry=3")
        config = Path(self.dir, "zoo.cfg")
        config.write_text("\n".join(lines) + "\n")
        return config

    def launch(self) -> ZooKeeperServer:
        """Start the process without waiting for it to serve (an ensemble starts
        its members together, then waits)."""
        main = (
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            if self.peers
            else "org.apache.zookeeper.server.ZooKeeperServerMain"
        )
        log = open(Path(self.dir, "server.log"), "ab")  # noqa: SIM115 (the child keeps it)
        with log:
            self.process = subprocess.Popen(
                [java_binary(), *JVM_FLAGS, "-cp", ZOOKEEPER_JAR, main, str(self._config())],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def mode(self) -> str | None:
        """standalone, leader or follower once serving; None before (or when down)."""
        for line in four_letters(self.port, b"srvr").splitlines():
            if line.startswith("Mode: "):
                return line[len("Mode: ") :].strip()
        return None

    def serving(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(
                f"zookeeper on port {self.port} exited; log in {self.dir}/server.log"
            )
        return self.mode() is not None

    def start(self) -> ZooKeeperServer:
        self.launch()
        wait_until(self.serving, interval=0.05, what=f"zookeeper on port {self.port}")
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)  # (a paused one must see the signal)
                os.kill(self.process.pid, sig)
            self.process.wait(timeout=TIMEOUT)
        self.process = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def cleanup(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


class ZooKeeperEnsemble:
    """``size`` ZooKeeper peers on 127.0.0.1 that elect a leader among themselves."""

    def __init__(self, size: int = 3) -> None:
        peers = {myid: (free_port(), free_port()) for myid in range(1, size + 1)}
        self.members = [ZooKeeperServer(myid, peers) for myid in peers]

    @property
    def hosts(self) -> str:
        """The connect string of every member (what a client is configured with)."""
        return ",".join(member.hosts for member in self.members)

    def start(self) -> ZooKeeperEnsemble:
        for member in self.members:
            member.launch()
        self.wait_for_quorum()
        return self

    def running(self) -> list[ZooKeeperServer]:
        return [m for m in self.members if m.process and m.process.poll() is None]

    def wait_for_quorum(self, timeout: float = TIMEOUT) -> ZooKeeperServer:
        """Wait until the running members serve with one leader among them; the leader."""

        def leader() -> ZooKeeperServer | None:
            modes = {m.myid: m.mode() for m in self.running()}
            if None in modes.values():
                return None
            leaders = [m for m in self.running() if modes[m.myid] == "leader"]
            return leaders[0] if len(leaders) == 1 else None

        return wait_until(leader, timeout, interval=0.05, what="a ZooKeeper leader")

    def leader(self) -> ZooKeeperServer:
        return self.wait_for_quorum()

    def restart(self, member: ZooKeeperServer) -> None:
        """Start a member that was killed again (same ports, same data)."""
        member.launch()
        wait_until(member.serving, interval=0.05, what=f"member {member.myid} to rejoin")

    def cleanup(self) -> None:
        for member in self.members:
            member.cleanup()


def zookeeper_backend(hosts: str, root: str | None = None, session_timeout: float = 4.0) -> dict:
    """The BACKENDS entry of a ZooKeeperBackend on ``hosts`` under ``root`` (default: a
    root of its own, so that nothing another test left behind is in its way)."""
    return {
        "BACKEND": "stock_locks.backends.zookeeper.ZooKeeperBackend",
        "LOCATION": hosts,
        "OPTIONS": {
            "ROOT": root or f"/sl-{uuid.uuid4().hex[:12]}",
            "SESSION_TIMEOUT": session_timeout,
        },
    }


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper server for the whole session (tests use roots of their own)."""
    server = ZooKeeperServer()
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture
def zookeeper_ensemble() -> Iterator[ZooKeeperEnsemble]:
    """A 3-node ensemble of the test's own (it may kill its members)."""
    ensemble = ZooKeeperEnsemble(3)
    try:
        yield ensemble.start()
    finally:
        ensemble.cleanup()
