"""The demo: a flash sale over HTTP against a production app server, then the shop stays up.

The shop is served by gunicorn (``--workers``, default 2 per CPU, each with
threads), not ``runserver``: a single development server would be the
bottleneck and every strategy would come out at its speed. Its other settings
(keep-alive, timeouts) are demo_shop/gunicorn.conf.py's.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

import demo_shop
from demo_shop.shop.flash_queue import SALE_EVENT, report_lines, run_sale
from demo_shop.shop.models import Order, Product
from demo_shop.shop.plot import flash_sale_png
from demo_shop.shop.services import pay_order, place_order
from stock_locks.exceptions import CapExceeded, OutOfStock
from stock_locks.management.commands.oversell_stress import Command as OversellStress

from .seed_shop import DEMO_PASSWORD, DEMO_USER

# gunicorn's settings (keep-alive, timeouts) as a production deployment has them.
GUNICORN_CONF = str(Path(demo_shop.__file__).with_name("gunicorn.conf.py"))
STARTUP_TIMEOUT = 30  # seconds for the server (or an expiry) to happen
SCENE_TTL = 4  # seconds an unpaid order lives in the expiry scene


class Command(BaseCommand):
    help = (
        "Seed the shop, start it and a Celery worker with beat, run a flash sale over HTTP "
        "with every stock strategy (oversell_stress), show unpaid orders expiring and their "
        "stock selling again, run a flash sale through the waiting room, then keep the shop "
        "and admin running until Ctrl-C."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--stock", type=int, default=100, help="units on sale per strategy")
        parser.add_argument(
            "--buyers", type=int, default=1000, help="purchase attempts per strategy"
        )
        parser.add_argument("--processes", type=int, default=8, help="buyer processes")
        parser.add_argument("--no-serve", action="store_true", help="stop after the report")
        parser.add_argument(
            "--workers", type=int, default=min(8, 2 * (os.cpu_count() or 1)),
            help="gunicorn worker processes (default: 2 per CPU, at most 8)",
        )  # fmt: skip
        parser.add_argument("--threads", type=int, default=4, help="threads per worker (4)")
        parser.add_argument(
            "--sale-buyers", type=int, default=200,
            help="buyers of the flash sale through the waiting room (200)",
        )  # fmt: skip
        parser.add_argument("--sale-stock", type=int, default=50, help="units of that sale (50)")

    def handle(
        self, *args, port, stock, buyers, processes, no_serve, workers, threads, sale_buyers,
        sale_stock, **options,
    ):  # fmt: skip
        signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's stop: clean up like Ctrl-C
        call_command("seed_shop", stdout=self.stdout)
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(
            f"starting the shop at {base} on gunicorn, {workers} workers x {threads} threads "
            f"(database: {_database_label()})"
        )
        (settings.BASE_DIR / ".cache").mkdir(exist_ok=True)
        # The flash sale compares strategies over HTTP: only this demo server lets
        # the order body pick one (SHOP_STRATEGY_FROM_REQUEST, off by default).
        server = _start(
            [sys.executable, "-m", "gunicorn", "demo_shop.wsgi:application", "-c", GUNICORN_CONF,
             "--bind", f"127.0.0.1:{port}", "--workers", str(workers), "--threads", str(threads)],
            SHOP_STRATEGY_FROM_REQUEST="1",
        )  # fmt: skip
        celery = _start(
            [sys.executable, "-m", "celery", "-A", "demo_shop", "worker", "--beat", "--pool=solo",
             "--loglevel=WARNING", f"--schedule={settings.BASE_DIR / '.cache' / 'celerybeat'}"]
        )  # fmt: skip
        try:
            _wait_until_up(f"{base}/api/products/", server)
            self.stdout.write(
                f"\nFlash sale: {buyers} buyers in {processes} processes race for {stock} units, "
                "once per strategy, over HTTP (POST /api/orders/), after a short unmeasured "
                "round that warms the server up:\n"
            )
            failed = None
            sale = {
                "strategy": "all", "via": "http", "url": f"{base}/api/orders/",
                "processes": processes, "fields": ["name=Flash sale {sku}"],
            }  # fmt: skip
            # Unmeasured: a fresh server's first requests pay for its connections and
            # caches, in whichever strategy's run they would fall.
            with contextlib.suppress(CommandError):
                call_command(OversellStress(), stock=5, buyers=10 * processes,
                             stdout=io.StringIO(), **sale)  # fmt: skip
            stress = OversellStress()
            try:
                call_command(stress, stock=stock, buyers=buyers, stdout=self.stdout, **sale)
            except CommandError as exc:
                failed = exc
            self.stdout.write(
                "\noversold must be 0 and final stock = initial - units sold, for every strategy."
            )
            self._plot(getattr(stress, "results", []), buyers, processes, workers, threads)
            self._expiry_scene()
            self._waiting_room_scene(base, sale_buyers, sale_stock)
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
            for process in (server, celery):
                process.terminate()
                process.wait(timeout=10)

    def _plot(self, results, buyers: int, processes: int, workers: int, threads: int) -> None:
        if not results:
            return
        title = (
            f"Flash sale over HTTP: {buyers} buyers in {processes} processes per strategy; "
            f"gunicorn {workers}x{threads}, {_database_label().split()[0]}"
        )
        path = flash_sale_png(results, settings.BASE_DIR / ".cache" / "demo" / "flash_sale.png",
                              title)  # fmt: skip
        if path is None:
            self.stdout.write("(no plot: matplotlib is not installed)")
        else:
            self.stdout.write(f"plot of the table (attempts/s and p99 per strategy): {path}")

    def _expiry_scene(self) -> None:
        say = self.stdout.write
        say(
            f"\nUnpaid orders expire: KETTLE has {_kettles()} in stock (one per customer), 6 "
            f"buyers want one, and an order not paid within {SCENE_TTL} s expires (Celery beat "
            "drains the delay queue):"
        )
        orders = []
        run = secrets.token_hex(3)  # this run's customers: the paid kettles of a past run stay

        def customer(buyer: int) -> str:
            return f"demo-{run}-buyer-{buyer}"

        for buyer in range(1, 7):
            try:
                order, _ = place_order(
                    {"KETTLE": 1}, "lua", ttl=SCENE_TTL, customer=customer(buyer)
                )
                orders.append(order)
                say(f"  buyer {buyer}: order {order.pk} reserved")
            except OutOfStock as exc:
                say(f"  buyer {buyer}: refused, {exc.available} left")
        for order in orders[:3]:
            pay_order(order)
        say(f"  buyers 1-3 pay; buyers 4-5 walk away. KETTLE in stock: {_kettles()}")
        unpaid = [order.pk for order in orders[3:]]
        deadline = time.monotonic() + SCENE_TTL + STARTUP_TIMEOUT
        while Order.objects.filter(pk__in=unpaid, status=Order.Status.EXPIRED).count() < len(
            unpaid
        ):
            if time.monotonic() > deadline:
                raise CommandError("the unpaid orders did not expire: is the Celery worker up?")
            time.sleep(0.2)
        say(f"  orders {unpaid} expired; KETTLE in stock again: {_kettles()}")
        try:
            place_order({"KETTLE": 1}, "lua", customer=customer(1))
            raise CommandError("buyer 1 bought a second KETTLE past its cap")
        except CapExceeded as exc:
            say(f"  buyer 1, who paid for one, tries a second: refused, {exc}")
        order, _ = place_order({"KETTLE": 1}, "lua", customer=customer(6))
        say(f"  buyer 6 tries again: order {order.pk} reserved from the returned stock")

    def _waiting_room_scene(self, base: str, buyers: int, stock: int) -> None:
        max_active, per_minute = 5, 300
        self.stdout.write(
            f"\nA flash sale through the waiting room: {buyers} buyers arrive at once for "
            f"{stock} toasters (POST /api/sale/order/); at most {max_active} shop at once, "
            f"{per_minute} let in per minute, one in four in the members' lane; each buyer "
            "asks again every 0.2 s until it is let in, orders, and leaves the room (the "
            "first few arrivals go straight in, before a queue forms; then members first):"
        )
        report = run_sale(base, buyers, stock, max_active=max_active,
                          admit_per_minute=per_minute)  # fmt: skip
        for line in report_lines(report):
            self.stdout.write(line)
        if report.oversold or not all(report.in_order.values()):
            raise CommandError("the waiting room's sale oversold or broke the arrival order")
        self.stdout.write(
            f"  the room's page: {base}/api/sale/order/ (behind it: a waiting page that "
            f"refreshes itself); its status: {base}/stock-locks/waiting-room/{SALE_EVENT}/"
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _start(command: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=settings.BASE_DIR,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kettles() -> int:
    return Product.objects.get(sku="KETTLE").stock


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
