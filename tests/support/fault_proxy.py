"""A TCP proxy on 127.0.0.1 that loses replies, cuts or stalls connections on demand.

Put it between a client and a real server (redis-server, PostgreSQL) to stage
the faults a network gives: a request that ran but whose reply never came
back, a connection cut mid-call, a server that accepts connections and then
says nothing.

    proxy = FaultProxy(redis_server.port).start()
    client = redis.Redis(port=proxy.port)
    proxy.lose_reply(b"EVALSHA")      # the next request containing EVALSHA runs on the
                                      # server, its reply is dropped, the connection cut
    proxy.swallow_reply(b"EVALSHA")   # the same, but the connection stays open: the
                                      # client waits for a reply that never comes
    proxy.swallowing()                # such connections the client has not closed yet
    proxy.stall()                     # forward nothing either way until resume()
    proxy.cut()                       # close every open connection now
    proxy.refusing = True             # close each new connection as it is accepted
    proxy.held_requests               # while stalled: requests the "network" holds
    proxy.close()

Matching is on the raw bytes a client sends (RESP for Redis, the simple query
protocol for PostgreSQL: ``lose_reply(b"COMMIT")`` loses the answer to a commit
that did happen). ``lost`` counts the replies dropped so far, so a test can
assert its fault really fired.

Also here, for the tests that drive a proxy: ``RETRIES`` (a test with and
without redis-py's retries), ``client_through`` (a client with no socket
timeout), and ``Interrupted``/``raise_interrupted`` (a signal handler that
interrupts a call the way Ctrl-C does).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pytest
import redis

BUFFER = 65536

RETRIES = pytest.mark.parametrize("retries", [3, 0], ids=["redis-py retries", "no retries"])


class Interrupted(BaseException):
    """What a child's signal handler raises: not an Exception, like KeyboardInterrupt."""


def raise_interrupted(signum: int, frame: Any) -> None:
    """A signal handler: ``signal.signal(signal.SIGUSR1, raise_interrupted)``."""
    raise Interrupted


def client_through(url: str) -> redis.Redis:
    """A client of ``url`` (a proxy's): no socket timeout, so only the code under
    test may bound a wait on a stalled network."""
    return redis.Redis.from_url(url, socket_timeout=None)


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.lose_next_reply = False
        self.swallow_next_reply = False
        self.swallowing = False  # a reply was swallowed: nothing more reaches the client
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host``:``target_port``, with faults on demand."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._patterns: list[bytes] = []  # lose the reply to the next request matching each
        self._swallow: list[bytes] = []  # swallow the reply to the next request matching each
        self._flowing = threading.Event()
        self._flowing.set()
        self._closes = threading.Event()  # cleared: a client's close reaches the server later
        self._closes.set()
        self._closed = False
        self.held_requests = 0  # requests held back by a stall right now
        self.lost = 0  # replies dropped so far
        self.lost_event = threading.Event()  # set each time a reply is dropped
        self.swallowed = 0  # replies swallowed so far (swallow_reply)
        # While True, a new connection is accepted and closed at once (the server's side
        # of a storm of killed connections); the open ones keep flowing.
        self.refusing = False

    @property
    def url(self) -> str:
        """A redis:// URL through the proxy (db 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        self._listener.listen(128)
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()
        return self

    # -- faults ----------------------------------------------------------------

    def lose_reply(self, pattern: bytes, times: int = 1) -> None:
        """The next ``times`` requests containing ``pattern`` reach the server and run;
        each one's reply is dropped and its connection cut."""
        with self._lock:
            self._patterns.extend([pattern] * times)

    def swallow_reply(self, pattern: bytes) -> None:
        """The next request containing ``pattern`` reaches the server and runs; its reply
        (and whatever else the server sends on that connection) never reaches the
        client, and the connection stays open: the client waits as for a packet lost
        on the way back, until it gives up or is interrupted. Other connections,
        and connections opened later, are not affected."""
        with self._lock:
            self._swallow.append(pattern)

    def swallowing(self) -> int:
        """Connections whose reply was swallowed that the client has not closed yet."""
        with self._lock:
            return sum(1 for pair in self._pairs if pair.swallowing and not pair.closed)

    def hold_closes(self) -> None:
        """A client that closes its connection from now on: the server sees the close
        only at :meth:`pass_closes` (a FIN held up on the way, a proxy or a TLS
        terminator slow to pass it on); until then that connection stays open there."""
        self._closes.clear()

    def pass_closes(self) -> None:
        self._closes.set()

    def cancel_faults(self) -> None:
        """Forget reply losses not yet fired, and resume a stall and held closes."""
        with self._lock:
            self._patterns.clear()
            self._swallow.clear()
        self.resume()
        self.pass_closes()

    def stall(self) -> None:
        """Stop forwarding in both directions (bytes wait) until :meth:`resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        """Close every open connection (clients see a reset or EOF)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def close(self) -> None:
        self._closed = True
        self.resume()
        self.pass_closes()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    # -- plumbing ----------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._requests, args=(pair,), daemon=True).start()
            threading.Thread(target=self._replies, args=(pair,), daemon=True).start()

    def _requests(self, pair: _Pair) -> None:
        """Client -> server; arms a reply loss when a request matches a pattern."""
        while True:
            try:
                data = pair.client.recv(BUFFER)
            except OSError:
                data = b""
            if not data:
                self._closes.wait()
                pair.close()
                return
            self._hold_while_stalled()
            with self._lock:
                for i, pattern in enumerate(self._patterns):
                    if pattern in data:
                        del self._patterns[i]
                        pair.lose_next_reply = True
                        break
                for i, pattern in enumerate(self._swallow):
                    if pattern in data:
                        del self._swallow[i]
                        pair.swallow_next_reply = True
                        break
            try:
                pair.upstream.sendall(data)
            except OSError:
                pair.close()
                return

    def _hold_while_stalled(self) -> None:
        """Wait for :meth:`resume` if stalled, counted in ``held_requests`` meanwhile."""
        if self._flowing.is_set():
            return
        with self._lock:
            self.held_requests += 1
        try:
            self._flowing.wait()
        finally:
            with self._lock:
                self.held_requests -= 1

    def _replies(self, pair: _Pair) -> None:
        """Server -> client; drops the armed reply and cuts the connection."""
        while True:
            try:
                data = pair.upstream.recv(BUFFER)
            except OSError:
                data = b""
            if not data:
                pair.close()
                return
            self._flowing.wait()
            if pair.lose_next_reply:
                with self._lock:
                    self.lost += 1
                self.lost_event.set()
                pair.close()
                return
            if pair.swallow_next_reply and not pair.swallowing:
                with self._lock:
                    self.swallowed += 1
                pair.swallowing = True
            if pair.swallowing:
                continue
            try:
                pair.client.sendall(data)
            except OSError:
                pair.close()
                return
