"""The demo's flash sale through the waiting room (stock_locks.waitingroom).

More buyers than the shop serves at once arrive together at POST /api/sale/order/,
which is behind the waiting room of the event ``SALE_EVENT``. Each buyer is a
thread with its own cookies (its session): it is told its place (429), asks
again until it is admitted, orders one unit, and leaves the room, which lets the
next one in. Once the units are gone, everyone still waiting is told "sold out"
(409) without waiting any longer. The report: waiting times per lane, whether
each lane was admitted in arrival order (the room's admission log against the
tickets the buyers were given), units sold against the stock, and how many were
told "sold out" while waiting.
"""

from __future__ import annotations

import datetime as dt
import http.cookiejar
import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from decimal import Decimal

from django.utils import timezone

from stock_locks.models import Event
from stock_locks.stock.reconcile import sync_counters
from stock_locks.waitingroom import WaitingRoom
from stock_locks.waitingroom.spec import spec_of

from .models import Order, Product
from .services import cancel_order

SALE_EVENT = "demo-sale"
SALE_SKU = "TOASTER"
POLL = 0.2  # seconds between a buyer's asks (faster than the room advises: a short demo)
LANES = ("members", "guests")


def prepare_sale(stock: int, max_active: int, admit_per_minute: int) -> WaitingRoom:
    """The sale's product with ``stock`` units and its event, open now, its room empty."""
    # Unpaid orders of an earlier run give their units back (and will not expire later).
    for order in Order.objects.filter(status=Order.Status.PENDING, lines__sku=SALE_SKU):
        cancel_order(order)
    Product.objects.update_or_create(
        sku=SALE_SKU,
        defaults={"name": "Toaster, flash sale", "price": Decimal("49.00"), "stock": stock,
                  "fence": 0},
    )  # fmt: skip
    sync_counters([SALE_SKU])
    event, _ = Event.objects.update_or_create(
        slug=SALE_EVENT,
        defaults={
            "name": "Toaster flash sale", "enabled": True, "prequeue_opens": None,
            "start": timezone.now() - dt.timedelta(seconds=1), "max_active": max_active,
            "admit_per_minute": admit_per_minute, "stock_factor": 1.0, "lanes": list(LANES),
            "skus": [SALE_SKU], "queue_ttl": 30, "session_ttl": 30,
        },
    )  # fmt: skip
    room = WaitingRoom(spec_of(event))
    room.clear()
    return room


@dataclass
class Buyer:
    lane: str
    ticket: int | None = None
    outcome: str = ""  # "ordered", "sold_out" (told while waiting), "out_of_stock" (admitted)
    waited: float = 0.0  # seconds from its first request to its answer
    asks: int = 0


@dataclass
class SaleReport:
    buyers: list[Buyer] = field(default_factory=list)
    stock: int = 0
    sold: int = 0
    left: int = 0
    in_order: dict[str, bool] = field(default_factory=dict)  # lane -> admitted in arrival order
    seconds: float = 0.0

    @property
    def oversold(self) -> int:
        return max(0, self.sold - self.stock)


def _buy(base: str, buyer: Buyer, start: threading.Event, deadline: float) -> None:
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    start.wait()
    began = time.monotonic()
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"{base}/api/sale/order/", data=b"", method="POST",
            headers={"Accept": "application/json", "X-Demo-Lane": buyer.lane},
        )  # fmt: skip
        buyer.asks += 1
        try:
            with opener.open(request, timeout=10) as response:
                token = response.headers.get("X-Waiting-Room-Pass", "")
                if buyer.ticket is None and token:
                    buyer.ticket = int(token.split(".")[0])
                buyer.outcome = "ordered"
                break
        except urllib.error.HTTPError as answer:
            body = json.loads(answer.read() or b"{}")
            if buyer.ticket is None and body.get("ticket"):
                buyer.ticket = int(body["ticket"])
            if answer.code == 429:
                time.sleep(POLL)
                continue
            buyer.outcome = body.get("state") or body.get("error") or f"HTTP {answer.code}"
            break
    buyer.waited = time.monotonic() - began


def run_sale(base: str, buyers: int, stock: int, max_active: int = 10,
             admit_per_minute: int = 1200, members_every: int = 4,
             timeout: float = 120.0) -> SaleReport:  # fmt: skip
    """The sale over HTTP at ``base`` (the shop must be up): ``buyers`` threads, every
    ``members_every``-th in the members' lane, for ``stock`` units."""
    room = prepare_sale(stock, max_active, admit_per_minute)
    before = Order.objects.filter(lines__sku=SALE_SKU).count()
    report = SaleReport(stock=stock)
    report.buyers = [Buyer("members" if i % members_every == 0 else "guests")
                     for i in range(buyers)]  # fmt: skip
    start = threading.Event()
    deadline = time.monotonic() + timeout
    threads = [threading.Thread(target=_buy, args=(base, b, start, deadline), daemon=True)
               for b in report.buyers]  # fmt: skip
    for thread in threads:
        thread.start()
    began = time.monotonic()
    start.set()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()) + 10)
    report.seconds = time.monotonic() - began
    report.sold = Order.objects.filter(lines__sku=SALE_SKU).count() - before
    report.left = Product.objects.get(sku=SALE_SKU).stock
    admitted = room.admitted_log()
    for lane in LANES:
        mine = {b.ticket for b in report.buyers if b.lane == lane and b.ticket is not None}
        order = [ticket for ticket in admitted if ticket in mine]
        report.in_order[lane] = order == sorted(order)
    return report


def report_lines(report: SaleReport) -> list[str]:
    """The report as the demo prints it."""
    lines = [f"  {'lane':<8} {'buyers':>6} {'ordered':>7} {'told sold out':>13} "
             f"{'wait p50 (s)':>12} {'wait max (s)':>12}  admitted in arrival order"]  # fmt: skip
    for lane in LANES:
        mine = [b for b in report.buyers if b.lane == lane]
        ordered = [b for b in mine if b.outcome == "ordered"]
        waits = [b.waited for b in ordered] or [0.0]
        lines.append(
            f"  {lane:<8} {len(mine):>6} {len(ordered):>7} "
            f"{sum(b.outcome == 'sold_out' for b in mine):>13} "
            f"{statistics.median(waits):>12.1f} {max(waits):>12.1f}  "
            f"{'yes' if report.in_order.get(lane) else 'NO'}"
        )
    others = [b.outcome for b in report.buyers if b.outcome not in ("ordered", "sold_out")]
    lines.append(
        f"  {report.sold} sold of {report.stock} ({report.left} left), oversold "
        f"{report.oversold}; admitted and then out of stock: "
        f"{others.count('out_of_stock')}; other answers: "
        f"{len(others) - others.count('out_of_stock')}; {report.seconds:.1f} s"
    )
    return lines
