"""Duplicate requests in flight over HTTP: the demo shop under gunicorn (issue 23, items 1-2).

A double click, or a client retrying on its timeout with the same Idempotency-Key,
sends one order two or three times at once. The shop runs as ``make demo`` runs it
(gunicorn, several workers with threads, its own settings file) in the test's
PostgreSQL and Redis; buyer processes started together each send their share of the
orders, every copy of one key released at the same instant from its own pooled
connection. Carts of one hot SKU (one unit each: every sale is of the last unit) and
of several SKUs (in any order in the body) are mixed, some keys sent once; demand is
above supply, so copies meet "out of stock" in Redis or in the database while their
twin's order is being written.

What must hold, for each strategy: no HTTP 500 (a PostgreSQL deadlock between a
twin's write and a batch, or any other error, is one), every copy of a key gets the
same answer (the same order, or the same refusal), one order per key that bought,
units sold equal to the stock that went, never below zero, and Redis's counters equal
to the database once quiet. The library's side of it, forced interleaving by forced
interleaving, is tests/faults/test_stock_duplicates.py. Without 4d8789b's library change
it failed in each of 3 runs (copies told "order N" and "out_of_stock": lua each time,
watch twice); without the database strategies' and watch's fixes after it, likewise
(lock, db_row_lock and db_conditional each time).

The shop runs as the demo does, lua's sold-out cache on: a copy landing in a worker
that remembers its SKU sold out still finds its twin's reservation in Redis.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
from collections import Counter, defaultdict

import pytest

from demo_shop.shop.models import Order, OrderLine, Product
from stock_locks.models import Reservation
from stock_locks.stock.reconcile import stock_report
from tests.support.demo_server import gunicorn_demo
from tests.support.processes import run_in_processes
from tests.support.stock_audit import audit, drift
from tests.support.waiting import TIMEOUT

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_child_left"),
]

STRATEGIES = ["lua", "watch", "lock", "db_row_lock", "db_conditional"]
# Hot SKUs of one unit each: every sale of one is of the last unit, where a twin that
# wrote first leaves the other none; several SKUs in one group-commit batch.
HOTS, PARTS = [f"HOT-{n}" for n in range(8)], ["PART-A", "PART-B", "PART-C"]
STOCK = {**dict.fromkeys(HOTS, 1), **dict.fromkeys(PARTS, 6)}
BUYERS = 4  # processes
KEYS = 16  # Idempotency-Keys per process
COPIES = 3  # the most copies of one key sent at once (threads per process)
WORKERS, THREADS = 3, 4  # gunicorn


def plan(seed: int) -> list[tuple[str, dict[str, int], int]]:
    """(key, cart, copies) of every order: a third multi-SKU carts, a fifth sent once."""
    rng = random.Random(seed)
    orders = []
    for n in range(BUYERS * KEYS):
        if n % 3 == 2:
            skus = rng.sample(PARTS, rng.choice([2, 3]))
            cart = {sku: rng.choice([1, 2]) for sku in skus}
        else:
            cart = {HOTS[n % len(HOTS)]: 1}
        copies = 1 if n % 5 == 4 else rng.choice([2, 3])
        orders.append((f"dup-{seed}-{n}", cart, copies))
    return orders


def _post(connection: http.client.HTTPConnection, key: str, body: bytes) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    connection.request("POST", "/api/orders/", body, headers)
    reply = connection.getresponse()
    data = reply.read()
    try:
        return reply.status, json.loads(data)
    except ValueError:
        return reply.status, {"body": data.decode(errors="replace")[:500]}


def _buyer(index: int, port: int, strategy: str, orders: list) -> list[tuple[str, int, dict]]:
    """In a child: for each of this process's keys, its copies sent at once, one per
    thread, each thread on its own kept-alive connection. (key, status, body) per copy."""
    mine = orders[index::BUYERS]
    answers: list[tuple[str, int, dict]] = []
    lock = threading.Lock()
    together = threading.Barrier(COPIES)

    def send(copy: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            for key, cart, copies in mine:
                together.wait(timeout=TIMEOUT)  # every copy of this key leaves at once
                if copy >= copies:
                    continue
                # Each copy lists the lines in its own order: the shop must not care.
                lines = [{"sku": sku, "qty": qty} for sku, qty in cart.items()]
                random.Random(f"{key}-{copy}").shuffle(lines)
                body = json.dumps({"items": lines, "strategy": strategy}).encode()
                try:
                    status, data = _post(connection, key, body)
                except (OSError, http.client.HTTPException) as exc:  # (reported, not hidden)
                    status, data = 0, {"exception": repr(exc)}
                    connection.close()  # the next request opens a new connection
                with lock:
                    answers.append((key, status, data))
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(copy,)) for copy in range(COPIES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT * 4)
    return answers


def answer(status: int, data: dict) -> tuple:
    """What a customer is told: the order, or the refusal (its kind). (Which SKU a
    refusal names may differ between two copies: each names the first line short when
    it was decided, and the stock moves in between.)"""
    if status in (200, 201):
        return ("order", data["order"])
    return ("refused", status, data.get("error"))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_duplicate_orders_in_flight_over_gunicorn_get_one_answer_each(strategy):
    for sku, units in STOCK.items():
        Product.objects.create(sku=sku, name=sku.title(), stock=units)
    orders = plan(STRATEGIES.index(strategy))
    demand: Counter[str] = Counter()
    for _, cart, _ in orders:
        demand.update(cart)
    assert all(demand[sku] > units for sku, units in STOCK.items()), demand  # sells out
    assert {copies for _, _, copies in orders} == {1, 2, 3}
    with gunicorn_demo(WORKERS, THREADS, SHOP_STRATEGY_FROM_REQUEST="1") as shop:
        replies = [
            reply
            for share in run_in_processes(_buyer, BUYERS, shop.port, strategy, orders)
            for reply in share
        ]
        log = shop.log.read_text()

    sent = sum(copies for _, _, copies in orders)
    assert len(replies) == sent
    statuses = Counter(status for _, status, _ in replies)
    failed = [(key, status, data) for key, status, data in replies if status not in (200, 201, 409)]
    assert not failed, f"{statuses}: {failed[:5]}\n{log[-4000:]}"

    told: dict[str, set[tuple]] = defaultdict(set)
    for key, status, data in replies:
        told[key].add(answer(status, data))
    different = {
        key: [(status, data) for k, status, data in replies if k == key]
        for key, answers in told.items()
        if len(answers) > 1
    }
    assert not different, f"copies of one key told different things: {different}"

    one = {key: answers.pop() for key, answers in told.items()}  # (one answer per key)
    bought = {key: told_[1] for key, told_ in one.items() if told_[0] == "order"}
    assert bought, "nothing sold: the sale did not happen"
    assert len(bought) < len(orders), "nothing refused: the sale never sold out"
    orders_made = dict(Order.objects.values_list("ref", "pk"))
    assert orders_made == {f"shop-{key}": pk for key, pk in bought.items()}
    carts = {key: cart for key, cart, _ in orders}
    for key, pk in bought.items():
        assert dict(OrderLine.objects.filter(order_id=pk).values_list("sku", "qty")) == carts[key]
    assert sorted(Reservation.objects.values_list("order_ref", flat=True)) == sorted(orders_made)

    sold: Counter[str] = Counter()
    for key in bought:
        sold.update(carts[key])
    left = dict(Product.objects.values_list("sku", "stock"))
    for sku, units in STOCK.items():
        assert left[sku] >= 0, (sku, left[sku])
        assert sold[sku] == units - left[sku], (sku, sold[sku], units, left[sku])
        book = audit(sku, units)
        assert book.conserved and book.open == sold[sku], book.summary()
    report = {row.sku: row for row in stock_report(list(STOCK))}
    assert all(row.drift == 0 and row.settled for row in report.values()), report
    assert drift() == {}, "Redis's counters differ from the database"
