"""The demo: a flash sale over HTTP against a real server, then the shop stays up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from .seed_shop import DEMO_PASSWORD, DEMO_USER

STARTUP_TIMEOUT = 30  # seconds for the server to answer


class Command(BaseCommand):
    help = (
        "Seed the shop, start it on 127.0.0.1, run a flash sale over HTTP with every stock "
        "strategy (oversell_stress), then keep the shop and admin running until Ctrl-C."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--stock", type=int, default=100, help="units on sale per strategy")
        parser.add_argument(
            "--buyers", type=int, default=1000, help="purchase attempts per strategy"
        )
        parser.add_argument("--processes", type=int, default=8, help="buyer processes")
        parser.add_argument("--no-serve", action="store_true", help="stop after the report")

    def handle(self, *args, port, stock, buyers, processes, no_serve, **options):
        call_command("seed_shop", stdout=self.stdout)
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(f"starting the shop at {base} (database: {_database_label()})")
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=settings.BASE_DIR,
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_until_up(f"{base}/api/products/", server)
            self.stdout.write(
                f"\nFlash sale: {buyers} buyers in {processes} processes race for {stock} units, "
                "once per strategy, over HTTP (POST /api/orders/):\n"
            )
            failed = None
            try:
                call_command(
                    "oversell_stress", strategy="all", via="http", url=f"{base}/api/orders/",
                    stock=stock, buyers=buyers, processes=processes, stdout=self.stdout,
                )  # fmt: skip
            except CommandError as exc:
                failed = exc
            self.stdout.write(
                "\noversold must be 0 and final stock = initial - units sold, for every strategy."
            )
            if failed or no_serve:
                if failed:
                    raise failed
                return
            self.stdout.write(
                f"\nThe shop:  {base}/\nThe admin: {base}/admin/  (login {DEMO_USER} / "
                f"{DEMO_PASSWORD})\nCtrl-C to stop."
            )
            server.wait()
        except KeyboardInterrupt:
            self.stdout.write("\nstopping")
        finally:
            server.terminate()
            server.wait(timeout=10)


def _database_label() -> str:
    db = settings.DATABASES["default"]
    return f"{db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}"


def _wait_until_up(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise CommandError(f"the server exited with {server.returncode}; is the port taken?")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise CommandError(f"the server did not answer {url} within {STARTUP_TIMEOUT}s")
