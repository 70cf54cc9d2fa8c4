"""A lost reply is not a lost unit (issue 8, section 2).

A :class:`FaultProxy` sits between the strategy (in this process) and a real
server; the request it picks reaches the server and runs, its reply is
dropped and the connection cut, as a network or a failover does.

- Redis: the reply of a ``lua`` reserve (its EVALSHA), of a ``watch`` EXEC,
  of a release's Redis step. With django-redis's defaults the caller sees a
  ConnectionError; with redis-py retries the request runs a second time.
- PostgreSQL: the reply of the COMMIT of a reserve, or of the one statement
  that is a one-line reserve of ``lua``/``watch`` on PostgreSQL. The units
  are taken and the row exists; the caller sees the connection die.

What must hold, right after (no sweeper, no operator): retrying with the same
order ref goes on and returns the reservation (never "in flight"), a retried
release reports success, nothing is given back in Redis while the row
stayed, the units add up and every Redis counter equals the database.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from django.db import DatabaseError, close_old_connections

from stock_locks import scripts
from stock_locks.exceptions import RedisUnavailable
from stock_locks.keys import StockKeys
from stock_locks.models import Reservation
from stock_locks.stock import get_strategy
from tests.inventory.models import Item
from tests.support.fault_proxy import FaultProxy
from tests.support.stock_audit import audit, drift, stray_records

pytestmark = pytest.mark.django_db(transaction=True)

SKU, OTHER = "TEA", "CUP"
INITIAL = 10


def make_stock() -> None:
    for sku in (SKU, OTHER):
        Item.objects.create(code=sku, title=sku.title(), on_hand=INITIAL)


def assert_whole(open_units: int) -> None:
    """Units add up, ``open_units`` of SKU held, and Redis equals the database now."""
    book = audit(SKU, INITIAL)
    assert (book.oversold, book.lost) == (0, 0), book.summary()
    assert book.open == open_units, book.summary()
    assert drift() == {}, "a unit is stuck in (or was given back to) Redis"
    assert stray_records() == []


def arm(proxy: FaultProxy, redis_client, script) -> None:
    """Lose the reply of the next EVALSHA of ``script`` (loaded first, so that it runs)."""
    redis_client.script_load(script.script)
    proxy.lose_reply(script.sha.encode())


def reserve_until_answered(strategy, ref: str, cart: dict[str, int]):
    """What a client does after a lost reply: the same request again, same order ref.

    A RedisUnavailable is an honest "nothing reserved, retry"; anything else
    (ReservationError "in flight", a raw ConnectionError) fails the test.
    """
    try:
        return strategy.reserve(ref, cart)
    except RedisUnavailable:
        return strategy.reserve(ref, cart)


# -- Redis replies ---------------------------------------------------------------------

# Not tests.support.fault_proxy.RETRIES: other order and test ids.
RETRIES = pytest.mark.parametrize("retries", [0, 3], ids=["no-retry", "redis-py-retries"])


@RETRIES
def test_lost_reply_of_a_lua_reserve(redis_through_proxy, redis_client, retries):
    make_stock()
    proxy = redis_through_proxy(retries)
    lua = get_strategy("lua")
    lua.reserve("warm", {SKU: 1})  # counters loaded through the proxy
    arm(proxy, redis_client, scripts.STOCK_RESERVE)
    reservation = reserve_until_answered(lua, "lost", {SKU: 2})
    assert proxy.lost == 1
    assert reservation.order_ref == "lost" and reservation.lines == {SKU: 2}
    again = lua.reserve("lost", {SKU: 2})
    assert again.created is False
    assert Reservation.objects.filter(order_ref="lost", status="reserved").count() == 1
    assert_whole(open_units=3)


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_lost_reserve_reply_is_reported_as_what_is_known(redis_through_proxy, redis_client, mode):
    # The reserve ran and took the units in Redis; only its reply was lost. The error
    # must not say "nothing reserved": it says the units may be taken, nothing is in
    # the database, and how the outcome is learnt (the same order ref again).
    make_stock()
    proxy = redis_through_proxy(0)
    lua = get_strategy("lua")
    lua.reserve("warm", {SKU: 1})
    redis_client.script_load(scripts.STOCK_RESERVE.script)
    # Every reply lost until the test says otherwise (the transport sends a script
    # once more on a fresh connection after a connection error).
    proxy.lose_reply(scripts.STOCK_RESERVE.sha.encode(), times=1000)
    with pytest.raises(RedisUnavailable) as unanswered:
        if mode == "sync":
            lua.reserve("lost", {SKU: 2})
        else:
            asyncio.run(lua.areserve("lost", {SKU: 2}))
    message = str(unanswered.value)
    proxy.cancel_faults()
    assert proxy.lost >= 1
    assert "may have taken its units" in message and "same order ref" in message, message
    assert "nothing was written to the database" in message, message
    assert not Reservation.objects.filter(order_ref="lost").exists()
    assert redis_client.exists(StockKeys().record("lost"))  # Redis did take them
    assert lua.reserve("lost", {SKU: 2}).lines == {SKU: 2}  # the retry settles it, once
    assert_whole(open_units=3)


@RETRIES
def test_lost_reply_of_a_watch_exec(redis_through_proxy, retries):
    make_stock()
    proxy = redis_through_proxy(retries)
    watch = get_strategy("watch")
    watch.reserve("warm", {SKU: 1})
    proxy.lose_reply(b"\r\nEXEC\r\n")
    reservation = reserve_until_answered(watch, "lost", {SKU: 2})
    assert proxy.lost == 1
    assert reservation.order_ref == "lost"
    assert watch.reserve("lost", {SKU: 2}).created is False
    assert_whole(open_units=3)


@RETRIES
@pytest.mark.parametrize("strategy", ["lua", "watch"])
def test_lost_reply_of_a_release_redis_step(redis_through_proxy, redis_client, strategy, retries):
    make_stock()
    proxy = redis_through_proxy(retries)
    chosen = get_strategy(strategy)
    chosen.reserve("kept", {SKU: 1})
    chosen.reserve("lost", {SKU: 2})
    arm(proxy, redis_client, scripts.STOCK_RELEASE)
    assert chosen.release("lost") is True  # the database put the units back: success
    assert proxy.lost == 1
    assert chosen.release("lost") is False  # the retry: already released, no error
    assert Reservation.objects.get(order_ref="lost").status == "released"
    assert_whole(open_units=1)


# -- PostgreSQL replies ----------------------------------------------------------------


STRATEGIES = ["lua", "watch", "lock", "db_conditional", "db_row_lock"]
COMMIT_CASES = [(name, "commit") for name in STRATEGIES] + [
    ("lua", "one-statement"),
    ("watch", "one-statement"),
]


@pytest.mark.parametrize(
    ("strategy", "lost"), COMMIT_CASES, ids=[f"{s}-{w}" for s, w in COMMIT_CASES]
)
def test_lost_reply_of_the_database_commit_of_a_reserve(database_through, strategy, lost):
    """The database took the units and wrote the row; its answer never came. The
    Redis half must stay taken (the row stayed), and a retry returns the reservation."""
    make_stock()
    proxy = database_through()
    chosen = get_strategy(strategy)
    chosen.reserve("warm", {SKU: 1})
    if lost == "one-statement":  # a one-line cart on PostgreSQL: the INSERT is the commit
        cart = {SKU: 2}
        proxy.lose_reply(b'INSERT INTO "stock_locks_reservation"')
    else:
        cart = {SKU: 2, OTHER: 1}
        proxy.lose_reply(b"COMMIT")
    try:
        first = chosen.reserve("lost", cart)
    except (DatabaseError, RedisUnavailable) as exc:  # the connection died under it
        first = exc
    assert proxy.lost == 1, "the fault did not fire"
    close_old_connections()  # what Django does before the next request: drop a broken one
    assert Reservation.objects.get(order_ref="lost").status == "reserved", first
    assert drift() == {}, f"Redis gave the units back while the row stayed ({first!r})"
    retried = chosen.reserve("lost", cart)
    assert retried.order_ref == "lost" and retried.lines == cart
    assert retried.created is False
    assert Reservation.objects.filter(order_ref="lost").count() == 1
    assert_whole(open_units=3)
    other = audit(OTHER, INITIAL)
    assert other.conserved and other.open == cart.get(OTHER, 0), other.summary()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lost_reply_of_the_database_commit_of_a_release(database_through, strategy):
    """The database put the units back; its answer never came, so the Redis half
    may not have run. A retried release reports success and finishes it."""
    make_stock()
    chosen = get_strategy(strategy)
    chosen.reserve("kept", {SKU: 1})
    chosen.reserve("lost", {SKU: 2, OTHER: 1})
    proxy = database_through()
    proxy.lose_reply(b"COMMIT")
    with contextlib.suppress(DatabaseError, RedisUnavailable):
        chosen.release("lost")  # the connection may die under it: the caller retries
    assert proxy.lost == 1, "the fault did not fire"
    close_old_connections()
    assert Reservation.objects.get(order_ref="lost").status == "released"
    assert chosen.release("lost") is False  # already released: success, nothing moves
    assert_whole(open_units=1)
    assert audit(OTHER, INITIAL).conserved
