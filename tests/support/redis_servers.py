"""Private redis-server processes for the tests: free port, no persistence, 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis

from .waiting import TIMEOUT


def redis_server_binary() -> str:
    path = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
    if not path:
        raise RuntimeError(
            "redis-server not found: run `make test` (it installs it) or set REDIS_SERVER_BIN"
        )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening_socket() -> socket.socket:
    """A socket listening on a free 127.0.0.1 port, for a server that takes it over
    (gunicorn's ``--bind fd://N`` with ``pass_fds``): a port picked free and bound later
    by the server could be taken by another test's server first."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    return listener


class RedisServer:
    """One redis-server process. ``start()``, ``stop()`` (SIGTERM), ``kill()`` (SIGKILL),
    ``restart()`` on the same port (empty: nothing is persisted). ``config_file``: a
    config file redis-server reads first (a sentinel's: ``extra_args`` "--sentinel").
    ``password``: started with ``requirepass`` (``client()`` authenticates)."""

    def __init__(
        self,
        *extra_args: str,
        port: int | None = None,
        config_file: str | None = None,
        password: str | None = None,
    ) -> None:
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.config_file = config_file
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="sl-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def client(self, **kwargs) -> redis.Redis:
        if self.password is not None:
            kwargs.setdefault("password", self.password)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> RedisServer:
        for _attempt in range(5):
            self.process = subprocess.Popen(
                [
                    redis_server_binary(),
                    *([self.config_file] if self.config_file else []),
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", self.dir,
                    "--logfile", os.path.join(self.dir, "redis.log"),
                    *(["--requirepass", self.password] if self.password is not None else []),
                    *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if self._wait_ping():
                return self
            self.process.kill()
            self.process.wait()
            self.port = free_port()  # lost a race for the port: try another
        raise RuntimeError(f"redis-server did not start; log in {self.dir}")

    def _wait_ping(self) -> bool:
        deadline = time.monotonic() + TIMEOUT
        client = self.client(socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.ConnectionError:
                    time.sleep(0.01)
            return False
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, sig)
            self.process.wait(timeout=TIMEOUT)
        self.process = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self, snapshot: str | None = None) -> RedisServer:
        """Stop, then start on the same port: empty, or loaded from ``snapshot``
        (a file :meth:`snapshot` wrote), as after a restore from an old backup."""
        self.stop()
        dump = os.path.join(self.dir, "dump.rdb")
        if os.path.exists(dump):
            os.remove(dump)
        if snapshot is not None:
            shutil.copy(snapshot, dump)
        return self.start()

    def snapshot(self) -> str:
        """SAVE the dataset now and keep a copy of the file; returns its path."""
        client = self.client()
        try:
            client.save()
        finally:
            client.close()
        path = tempfile.mkstemp(prefix="snapshot-", suffix=".rdb", dir=self.dir)[1]
        shutil.copy(os.path.join(self.dir, "dump.rdb"), path)
        return path

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
