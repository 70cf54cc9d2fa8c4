"""A real Celery worker and beat, as subprocesses of the test, on the suite's Redis and database.

Each process logs to a file; ``start()`` waits for its ready marker line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .processes import child_environment
from .waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


class CeleryProcess:
    def __init__(self, kind: str, name: str, env: dict[str, str]) -> None:
        self.kind, self.name, self.env = kind, name, env
        self.dir = tempfile.mkdtemp(prefix=f"sl-celery-{name}-")
        self.log = Path(self.dir) / "log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        base = [sys.executable, "-m", "celery", "-A", "demo_shop"]
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
        marker = "ready." if self.kind == "worker" else "beat: Starting..."
        wait_until(lambda: marker in self.output() or self.process.poll() is not None,
                   what=f"{self.name} to start")  # fmt: skip
        assert self.process.poll() is None, f"{self.name} exited:\n{self.output()}"
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def celery_environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, **child_environment(), "PYTHONPATH": str(ROOT)}
    env.update(extra)
    return env
