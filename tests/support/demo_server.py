"""The demo shop under gunicorn, as ``make demo`` serves it, for a test.

    with gunicorn_demo(workers=2, threads=2) as shop:
        urllib.request.urlopen(shop.url + "/api/products/")

gunicorn runs with the demo's own settings file (demo_shop/gunicorn.conf.py,
what ``manage.py demo`` passes) on a free port, in this test's database and
Redis (``child_environment``: the demo's tests hand their settings module to
children). It is stopped (SIGTERM, then waited for) when the block ends; its
output is in ``shop.log``, read into the message of a failure to start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from demo_shop.shop.management.commands.demo import GUNICORN_CONF

from .processes import child_environment
from .redis_servers import listening_socket
from .waiting import TIMEOUT, wait_until

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoServer:
    url: str  # http://127.0.0.1:<port>
    port: int
    log: Path  # gunicorn's output
    process: subprocess.Popen


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as reply:
        return reply.code, reply.read()


@contextmanager
def gunicorn_demo(workers: int = 2, threads: int = 2, **env: str) -> Iterator[DemoServer]:
    """The demo on gunicorn with ``workers`` x ``threads``; ``env`` on top of the test's
    (e.g. ``SHOP_STRATEGY_FROM_REQUEST="1"``). Yields once every worker has booted and
    the shop answers."""
    listener = listening_socket()
    port = listener.getsockname()[1]
    log = Path(tempfile.mkdtemp(prefix="sl-demo-")) / "gunicorn.log"
    environment = {**os.environ, **child_environment(), "PYTHONPATH": str(ROOT), **env}
    with listener, open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "demo_shop.wsgi:application", "-c", GUNICORN_CONF,
             "--workers", str(workers), "--threads", str(threads),
             "--bind", f"fd://{listener.fileno()}"],
            cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT,
            pass_fds=[listener.fileno()],
        )  # fmt: skip
    server = DemoServer(f"http://127.0.0.1:{port}", port, log, process)
    try:

        def up() -> bool:
            assert process.poll() is None, f"gunicorn exited:\n{log.read_text()}"
            if log.read_text().count("Booting worker") < workers:
                return False
            try:
                return get(f"{server.url}/api/products/")[0] == 200
            except OSError:
                return False

        wait_until(up, what="gunicorn to serve the demo shop")
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=TIMEOUT)
