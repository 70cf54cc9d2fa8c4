"""Real drainers as subprocesses of the test, on the suite's Redis and database: a Celery
worker, beat, and ``manage.py run_delay_queue`` (kind ``"drainer"``, extra ``args``).

Workers and beat run the suite's Celery app (``tests.celery_app``) unless given
another (``app="demo_shop"``: the demo's, for tests/demo).

Each process logs to a file; ``start()`` waits for its ready marker line.
``pause()``/``resume()`` SIGSTOP and SIGCONT it; ``kill()`` SIGKILLs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .fault_processes import is_stopped
from .processes import child_environment
from .waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


MARKERS = {"worker": "ready.", "beat": "beat: Starting...", "drainer": "draining delay queue"}


class CeleryProcess:
    def __init__(
        self,
        kind: str,
        name: str,
        env: dict[str, str],
        args: tuple[str, ...] = (),
        app: str = "tests.celery_app",
    ) -> None:
        self.kind, self.name, self.env, self.args, self.app = kind, name, env, args, app
        self.dir = tempfile.mkdtemp(prefix=f"sl-celery-{name}-")
        self.log = Path(self.dir) / "log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        if self.kind == "drainer":
            return [sys.executable, "manage.py", "run_delay_queue", *self.args]
        base = [sys.executable, "-m", "celery", "-A", self.app]
        if self.kind == "worker":
            return base + [
                "worker", "--pool=solo", "--loglevel=INFO", f"--hostname={self.name}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ]  # fmt: skip
        return base + ["beat", "--loglevel=INFO", f"--schedule={self.dir}/beat-schedule"]

    def start(self) -> CeleryProcess:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        marker = MARKERS[self.kind]
        wait_until(lambda: marker in self.output() or self.process.poll() is not None,
                   what=f"{self.name} to start")  # fmt: skip
        assert self.process.poll() is None, f"{self.name} exited:\n{self.output()}"
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stopped(self) -> bool:
        """True while the process is stopped (SIGSTOP), by anyone, itself included."""
        return self.process is not None and is_stopped(self.process.pid)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused process cannot exit
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def celery_environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, **child_environment(), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env
