"""``@locked`` on an async view under a real ASGI server: uvicorn, two worker processes.

The server is a subprocess of the test (``uvicorn --factory
django.core.asgi:get_asgi_application --workers 2``) on 127.0.0.1 and a free
port, on the suite's settings and its private Redis (REDIS_URL), stopped by
PID. Its views are tests/asgi_views.py (``asgi/`` in tests/urls.py). The test
process holds the views' lock with a sync :class:`stock_locks.Lock` on the same
Redis, and reads what the workers do three ways: over HTTP (the debug view, in
whichever worker the kernel hands the connection to), from /proc (each worker's
threads and sockets) and from ``CLIENT LIST``.

- A held lock: the view answers 423 once its timeout passes.
- 20 requests waiting on a held lock: each worker has one connection in BLPOP
  (its wake-up listener) whatever its number of waiters; no thread of any
  worker is in a Redis call or in stock_locks (every thread but the event loop's
  and uvicorn's own is idle in its pool); at most 3 Redis connections per worker
  (the listener's, one pooled, the metrics flusher's), however many of the 20
  it holds; all 20 answer 200 once the test releases the lock.
- Redis down (killed while a request waits, and for a new request): 503 with a
  JSON body, never a hang (every HTTP call is bounded by TIMEOUT).

Threads: Django's ASGI handler gives each request its own single-thread
executor (asgiref's ThreadSensitiveContext) once a sync middleware runs, and
tests/settings.py's middlewares are sync ones, so a worker has one idle thread
per request in flight, lock or not. What the test asserts is that none of them
is doing anything while the requests wait (with the sync lock in a thread, each
would be parked in BLPOP).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from stock_locks import Lock
from tests.support.redis_servers import RedisServer, free_port
from tests.support.waiting import TIMEOUT, wait_until

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
WAITERS = 20
STARTED = re.compile(r"Started server process \[(\d+)\]")


class AsgiServer:
    """``uvicorn --workers 2`` on the suite's Django settings and the Redis at ``redis_url``."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.dir = tempfile.mkdtemp(prefix="sl-uvicorn-")
        self.log = Path(self.dir) / "log"
        self.process: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> AsgiServer:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "REDIS_URL": self.redis_url,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        for _attempt in range(5):
            self.port = free_port()
            with open(self.log, "wb") as log:
                self.process = subprocess.Popen(
                    [
                        sys.executable, "-m", "uvicorn",
                        "--factory", "django.core.asgi:get_asgi_application",
                        "--workers", str(WORKERS),
                        "--host", "127.0.0.1", "--port", str(self.port),
                    ],
                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            wait_until(
                lambda: (
                    self.output().count("Application startup complete.") == WORKERS
                    or self.process.poll() is not None
                ),
                what="uvicorn's workers to start",
            )
            if self.process.poll() is None:
                return self
            if "address already in use" not in self.output().lower():
                break  # (not a lost race for the port)
        raise AssertionError(f"uvicorn did not start:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def worker_pids(self) -> list[int]:
        return [int(pid) for pid in STARTED.findall(self.output())]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        """GET ``path``: (status, JSON body); bounded by TIMEOUT, so a hang fails."""
        try:
            with urllib.request.urlopen(self.url(path), timeout=TIMEOUT) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as reply:
            return reply.code, json.loads(reply.read())

    def stop(self) -> None:
        workers = self.worker_pids
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in workers:  # (the parent stops them; a stray one is killed by its PID)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.process = None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _threads(pid: int) -> int:
    """The OS threads of process ``pid``."""
    return len(os.listdir(f"/proc/{pid}/task"))


def _local_ports_to(pid: int, port: int) -> set[int]:
    """Local ports of the TCP connections process ``pid`` has open to 127.0.0.1:``port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    with open(f"/proc/{pid}/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.split(":")[1], 16) == port:
                ports.add(int(local.split(":")[1], 16))
    return ports


def _redis_clients(redis_client, redis_port: int, pid: int) -> list[dict]:
    """CLIENT LIST entries of process ``pid``'s connections."""
    ports = _local_ports_to(pid, redis_port)
    return [c for c in redis_client.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports]


def _poll_workers(
    server: AsgiServer, done: Callable[[dict[int, dict]], bool], seen: dict[int, dict] | None = None
) -> dict[int, dict]:
    """Ask the debug view (in whichever worker the kernel picks) until every worker has
    answered and ``done(answers by pid)``; ``seen`` keeps earlier answers."""
    answers = {} if seen is None else seen
    pids = set(server.worker_pids)

    def ask() -> dict[int, dict] | None:
        status, body = server.get("/asgi/debug/")
        assert status == 200, body
        answers[body["pid"]] = body
        return answers if set(answers) == pids and done(answers) else None

    return wait_until(ask, what=f"every worker's debug answer to meet {done.__name__}")


def _busy_threads(answer: dict) -> list[dict]:
    """Threads of one worker doing anything: not its event loop, not this debug
    request's own executor, not uvicorn's, not idle in a pool, not the library's
    metrics flusher."""
    idle = {"loop", "mine", "idle", "uvicorn", "library"}
    return [t for t in answer["threads"] if t["state"] not in idle]


@pytest.fixture(scope="module")
def asgi_server(redis_server: RedisServer) -> Iterator[AsgiServer]:
    server = AsgiServer(redis_server.url).start()
    try:
        yield server
    finally:
        server.stop()
        assert not [pid for pid in server.worker_pids if _alive(pid)]


def test_a_held_lock_answers_423_once_the_views_timeout_passes(asgi_server):
    assert asgi_server.get("/asgi/orders/1/quick/")[0] == 200  # free: granted
    holder = Lock("asgi:1", ttl=TIMEOUT * 4)
    assert holder.acquire(blocking=False)
    try:
        status, body = asgi_server.get("/asgi/orders/1/quick/")
    finally:
        holder.release()
    assert status == 423, body
    assert body["error"] == "locked" and body["lock"] == "asgi:1"
    assert asgi_server.get("/asgi/orders/1/quick/")[0] == 200  # released: granted again


def test_waiting_requests_park_no_thread_and_hold_one_blpop_per_worker(
    asgi_server, redis_server, redis_client
):
    holder = Lock("asgi:2", ttl=TIMEOUT * 4)
    assert holder.acquire(blocking=False)
    pool = ThreadPoolExecutor(WAITERS)  # the test's HTTP clients
    replies = []
    answers: dict[int, dict] = {}
    try:
        # One request after another, each in the listener before the next is sent
        # (waiters only come while the test holds the lock: a stale count is a low one).
        for waiting in range(1, WAITERS + 1):
            replies.append(pool.submit(asgi_server.get, "/asgi/orders/2/wait/"))

            def all_waiting(answers: dict[int, dict], waiting: int = waiting) -> bool:
                return sum(a["waiters"] for a in answers.values()) == waiting

            _poll_workers(asgi_server, all_waiting, answers)
        assert not any(reply.done() for reply in replies)

        # Every worker now, fresh: its threads are all idle (a parked one never gets there).
        def threads_idle(answers: dict[int, dict]) -> bool:
            return not any(_busy_threads(a) for a in answers.values())

        now = {}
        try:
            _poll_workers(asgi_server, threads_idle, now)
        except AssertionError:
            busy = {pid: _busy_threads(a) for pid, a in now.items()}
            raise AssertionError(f"threads busy while requests wait: {busy}") from None
        assert sum(a["waiters"] for a in now.values()) == WAITERS
        for answer in now.values():
            # One executor per request in flight (Django's), the debug request's included.
            assert answer["request_executors"] == answer["waiters"] + 1, answer
            assert not [t for t in answer["threads"] if t["state"] == "redis"], answer

        # Redis connections of each worker: one BLPOP (the listener), whatever its waiters.
        connections = {
            pid: _redis_clients(redis_client, redis_server.port, pid)
            for pid in asgi_server.worker_pids
        }
        report = {
            pid: {
                "waiters": now[pid]["waiters"],
                "os_threads": _threads(pid),
                "connections": [(c["cmd"], c["flags"]) for c in clients],
            }
            for pid, clients in connections.items()
        }
        for pid, clients in connections.items():
            blocked = [c for c in clients if c["cmd"] == "blpop" and "b" in c["flags"]]
            assert len(blocked) == (1 if now[pid]["waiters"] else 0), report
            # The listener's, one pooled (the requests came one at a time) and the
            # metrics flusher's (sync, once a second): a bound that does not grow with
            # the worker's waiters.
            assert len(clients) <= 3, report
    finally:
        holder.release()
        results = [reply.result(timeout=TIMEOUT * 2) for reply in replies]
        pool.shutdown()
    assert [status for status, _ in results] == [200] * WAITERS, results
    assert {body["pid"] for _, body in results} <= set(asgi_server.worker_pids)

    def nobody_waits(answers: dict[int, dict]) -> bool:
        return not any(a["waiters"] for a in answers.values())

    _poll_workers(asgi_server, nobody_waits)


def test_redis_down_answers_503_and_never_hangs(redis_factory, use_redis, redis_client):
    redis = redis_factory()
    use_redis(redis)  # the test's holder lives on that server, as the view's lock does
    server = AsgiServer(redis.url).start()
    pool = ThreadPoolExecutor(1)
    try:
        holder = Lock("asgi:3", ttl=TIMEOUT * 4)
        assert holder.acquire(blocking=False)
        waiting = pool.submit(server.get, "/asgi/orders/3/wait/")

        def one_waiting(answers: dict[int, dict]) -> bool:
            return sum(a["waiters"] for a in answers.values()) == 1

        _poll_workers(server, one_waiting)
        redis.stop()  # the waiting request's listener loses its connection

        status, body = waiting.result(timeout=TIMEOUT)
        assert status == 503, body
        assert body == {
            "error": "unavailable",
            "lock": "asgi:3",
            "message": "lock service unavailable",
        }
        # A new request, nothing listening on the port any more.
        for path in ("/asgi/orders/4/wait/", "/asgi/orders/4/quick/"):
            status, body = server.get(path)
            assert status == 503, body
            assert body["error"] == "unavailable" and body["lock"] == "asgi:4"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        server.stop()
    assert not [pid for pid in server.worker_pids if _alive(pid)]
