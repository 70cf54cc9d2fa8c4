"""The lua strategy answers sold-out SKUs itself, until units come back
(stock_locks.stock.soldout): never a unit sold that is not there, and a unit
that came back is sellable once its announcement arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from stock_locks.backends.redis import get_redis
from stock_locks.exceptions import OutOfStock
from stock_locks.keys import StockKeys
from stock_locks.stock import get_strategy, soldout
from stock_locks.stock.sync import restock, stock_changed
from tests.inventory.models import Item
from tests.support.processes import run_in_processes
from tests.support.stock_audit import audit
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def listening() -> soldout.SoldOutCache:
    """This process's cache, once its listener is subscribed."""
    cache = soldout.cache_for(get_redis(), StockKeys().versions)
    assert cache is not None
    wait_until(lambda: cache.ticket() is not None, what="the sold-out listener to subscribe")
    return cache


def calls(client: Any, command: str) -> int:
    """How many ``command``s Redis has run."""
    return client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def reserve_calls(client: Any) -> int:
    """How many scripts Redis has run (every reserve that reached it is one)."""
    return calls(client, "evalsha")


def sell_out(cache: soldout.SoldOutCache, sku: str = "HOT") -> None:
    """Sell the one unit of ``sku`` (order "a"), then let Redis refuse order "b"."""
    Item.objects.create(code=sku, title=sku, on_hand=1)
    lua = get_strategy("lua")
    lua.reserve("a", {sku: 1})
    with pytest.raises(OutOfStock):
        lua.reserve("b", {sku: 1})
    assert cache.short_line({sku: 1}) == (sku, 1, 0)


def test_a_refusal_is_answered_here_until_this_process_gives_units_back(redis_client):
    cache = listening()
    sell_out(cache)
    lua = get_strategy("lua")
    scripts_run, lookups = reserve_calls(redis_client), calls(redis_client, "exists")
    for n in range(20):
        with pytest.raises(OutOfStock) as refused:
            lua.reserve(f"late-{n}", {"HOT": 1}, fresh_ref=True)
        assert (refused.value.sku, refused.value.available) == ("HOT", 0)
    assert reserve_calls(redis_client) == scripts_run, "a remembered refusal went to Redis"
    assert calls(redis_client, "exists") == lookups, "a fresh ref was looked up"
    with pytest.raises(OutOfStock):
        lua.reserve("maybe-again", {"HOT": 1})  # a ref that may repeat: is it recorded?
    assert (reserve_calls(redis_client), calls(redis_client, "exists")) == (
        scripts_run,
        lookups + 1,
    )

    lua.release("a")  # this process gave the unit back: sellable at once
    assert lua.reserve("c", {"HOT": 1}).created
    book = audit("HOT", 1)
    assert book.conserved and book.open == 1, book.summary()


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_retry_of_an_order_whose_reply_was_lost_gets_its_units(mode, redis_client):
    # The first attempt's script took the last unit, its reply was lost (the Redis half
    # alone here); then this process saw the SKU refused to another buyer. The retry with
    # the same order ref is answered with the units it holds, not "sold out".
    cache = listening()
    Item.objects.create(code="HOT", title="HOT", on_hand=1)
    lua = get_strategy("lua")
    ref, lines, _ = lua.validate("lost", {"HOT": 1}, None)
    assert lua.reserve_in_redis(ref, lines)[0], "the first attempt took the unit"
    with pytest.raises(OutOfStock):
        lua.reserve("other", {"HOT": 1})
    assert cache.short_line({"HOT": 1}) == ("HOT", 1, 0)
    if mode == "sync":
        assert lua.reserve("lost", {"HOT": 1}).order_ref == "lost"
    else:
        assert asyncio.run(lua.areserve("lost", {"HOT": 1})).order_ref == "lost"
    book = audit("HOT", 1)
    assert book.conserved and book.open == 1, book.summary()


def test_warm_up_returns_with_the_listener_subscribed(redis_client):
    """A worker warmed up before a sale remembers Redis's very first refusal."""
    lua = get_strategy("lua")
    lua.warm_up()
    cache = soldout.cache_for(get_redis(), StockKeys().versions)
    assert cache is not None and cache.ticket() is not None, "not listening after warm_up"
    sell_out(cache)
    scripts_run = reserve_calls(redis_client)
    with pytest.raises(OutOfStock):
        lua.reserve("late", {"HOT": 1}, fresh_ref=True)
    assert reserve_calls(redis_client) == scripts_run, "the first refusal was not remembered"


def test_a_cart_asking_what_is_left_still_goes_to_redis(redis_client):
    cache = listening()
    Item.objects.create(code="PAIR", title="pair", on_hand=3)
    lua = get_strategy("lua")
    lua.reserve("a", {"PAIR": 2})
    with pytest.raises(OutOfStock):
        lua.reserve("b", {"PAIR": 2})  # 1 left: remembered as "1 at most"
    assert cache.short_line({"PAIR": 2}) == ("PAIR", 2, 1)
    assert lua.reserve("c", {"PAIR": 1}).created  # asks no more than that: Redis decides
    with pytest.raises(OutOfStock):
        lua.reserve("d", {"PAIR": 1})
    assert audit("PAIR", 3).conserved


def _release(index: int, ref: str) -> None:
    get_strategy("lua").release(ref)


def _restock(index: int, sku: str) -> None:
    restock(sku, 2)


def _admin_edit(index: int, sku: str) -> None:
    Item.objects.filter(code=sku).update(on_hand=3)  # behind the strategies' back,
    stock_changed(sku)  # then the documented call


GIVE_BACK: dict[str, tuple[Callable[..., None], Callable[[], Any], int]] = {
    "release": (_release, lambda: "a", 0),
    "restock": (_restock, lambda: "HOT", 2),
    "admin edit": (_admin_edit, lambda: "HOT", 3),
}


@pytest.mark.parametrize("way", GIVE_BACK)
def test_units_given_back_in_another_process_are_announced_and_sellable(way, redis_client):
    cache = listening()
    sell_out(cache)
    give_back, argument, restocked = GIVE_BACK[way]
    run_in_processes(give_back, 1, argument())
    wait_until(lambda: cache.short_line({"HOT": 1}) is None, what=f"the {way}'s announcement")
    assert get_strategy("lua").reserve("c", {"HOT": 1}).created
    assert audit("HOT", 1, restocked).conserved


def test_counters_loaded_again_after_redis_lost_them_are_announced(redis_client):
    cache = listening()
    sell_out(cache)
    get_strategy("lua").release("a")  # the unit is back in the database and in Redis ...
    with pytest.raises(OutOfStock):
        get_strategy("lua").reserve("b2", {"HOT": 2})  # (remember "1 at most")
    redis_client.flushall()  # ... then Redis loses everything, announcing nothing
    assert cache.short_line({"HOT": 2}) is not None  # still remembered (bounded by the TTL)
    # Whoever meets the loss first rebuilds the counters; the load is announced.
    run_in_processes(_reserve_one, 1, "HOT")
    wait_until(lambda: cache.short_line({"HOT": 2}) is None, what="the reload's announcement")


def _reserve_one(index: int, sku: str) -> None:
    with pytest.raises(OutOfStock):
        get_strategy("lua").reserve(f"elsewhere-{index}", {sku: 2})


def test_sold_out_ttl_zero_turns_it_off(redis_client):
    with override_settings(STOCK_LOCKS={**settings.STOCK_LOCKS, "SOLD_OUT_TTL": 0}):
        assert soldout.cache_for(get_redis(), StockKeys().versions) is None


# -- many processes, units coming back mid-sale ------------------------------------


def _buy_and_give_back(index: int, attempts: int) -> dict[str, int]:
    lua = get_strategy("lua")
    outcome = {"sold": 0, "refused": 0, "released": 0}
    for n in range(attempts):
        ref = f"p{index}-{n}"
        try:
            lua.reserve(ref, {"HOT": 1})
        except OutOfStock:
            outcome["refused"] += 1
            continue
        if n % 3 == 0:  # a third of the buyers change their minds
            lua.release(ref)
            outcome["released"] += 1
        else:
            outcome["sold"] += 1
    return outcome


def test_eight_processes_never_sell_more_than_is_there_while_units_come_back():
    Item.objects.create(code="HOT", title="hot", on_hand=40)
    outcomes = run_in_processes(_buy_and_give_back, 8, 150)
    sold = sum(o["sold"] for o in outcomes)
    assert sum(o["refused"] for o in outcomes) > 0  # the sale did sell out
    book = audit("HOT", 40)
    assert book.conserved, book.summary()
    assert sold == book.open == 40 - book.stock


def test_threads_with_their_own_clients_share_one_listener(redis_client):
    # Django's caches, hence django-redis clients, are per thread; their pool is per
    # process. One listener per process, not one per thread taking turns.
    import threading

    mine = soldout.cache_for(get_redis(), StockKeys().versions)
    theirs: list[Any] = []

    def other_thread() -> None:
        client = get_redis()
        theirs.append((client, soldout.cache_for(client, StockKeys().versions)))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    [(client, cache)] = theirs
    assert client is not get_redis() and client.connection_pool is get_redis().connection_pool
    assert cache is mine
