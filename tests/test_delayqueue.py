"""DelayQueue against a real Redis: due order, de-duplication, at-least-once, dead letters,
handlers found by discovery, batches that outlive a long handler."""

from __future__ import annotations

import datetime as dt
import sys

import pytest
from django.conf import settings
from django.test import override_settings

from stock_locks import DelayQueue
from stock_locks.delayqueue import HANDLERS, InvalidSchedule, handler, runner
from tests.delayapp import delay_handlers as test_app_handlers
from tests.support.celery_processes import CeleryProcess, celery_environment
from tests.support.processes import run_in_processes
from tests.support.redis_stats import data_keys, redis_ms
from tests.support.waiting import wait_until


def in_the_past(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)


def expire_visibility(queue: DelayQueue, redis_client, item_id: str) -> None:
    """Make an in-flight item's visibility run out now (state written, not slept for)."""
    assert redis_client.zadd(queue.keys.inflight, {item_id: 1}, xx=True, ch=True) == 1


@pytest.fixture
def queue() -> DelayQueue:
    return DelayQueue("test", max_attempts=3, visibility_timeout=30)


def test_only_due_items_are_claimed_in_due_order(queue):
    queue.schedule("t", {"n": "a"}, eta=in_the_past(3), id="a")
    queue.schedule("t", {"n": "b"}, eta=in_the_past(1), id="b")
    queue.schedule("t", {"n": "c"}, eta=in_the_past(2), id="c")
    queue.schedule("t", {"n": "later"}, delay=60, id="later")
    claimed = queue.claim(10)
    assert [item.id for item in claimed] == ["a", "c", "b"]
    assert [item.payload for item in claimed] == [{"n": "a"}, {"n": "c"}, {"n": "b"}]
    assert all(item.task == "t" and item.attempts == 1 for item in claimed)
    assert queue.claim(10) == []  # in flight, and "later" is not due
    stats = queue.stats()
    assert (stats["due_now"], stats["scheduled"], stats["in_flight"], stats["dead"]) == (0, 1, 3, 0)
    assert 55 < stats["next_due_in"] <= 60


def test_delay_counts_from_the_redis_clock(queue, redis_client):
    before = redis_ms(redis_client)
    queue.schedule("t", delay=10, id="x")
    after = redis_ms(redis_client)
    due = redis_client.zscore(queue.keys.due, "x")
    assert before + 10_000 <= due <= after + 10_000


def test_scheduling_an_id_again_replaces_it_never_duplicates(queue, redis_client):
    queue.schedule("t", {"v": 1}, delay=60, id="order-7")
    queue.schedule("t", {"v": 2}, eta=in_the_past(1), id="order-7")
    assert redis_client.zcard(queue.keys.due) == 1
    [item] = queue.claim(10)
    assert (item.id, item.payload) == ("order-7", {"v": 2})


def test_unacked_item_is_delivered_again_after_its_visibility(queue, redis_client):
    queue.schedule("t", {"v": 1}, id="crash")
    [first] = queue.claim(1)  # ...and the drainer dies without acking
    assert queue.claim(1) == []  # invisible while its visibility lasts
    expire_visibility(queue, redis_client, "crash")
    [again] = queue.claim(1)
    assert (again.id, again.attempts) == ("crash", 2)
    assert queue.ack("crash") == 1
    assert queue.stats()["in_flight"] == 0 and not redis_client.hexists(queue.keys.items, "crash")


def test_item_goes_to_dead_letters_after_max_attempts_with_its_last_error(queue, redis_client):
    queue.schedule("t", {"v": 1}, id="poison")
    for attempt in (1, 2):
        [item] = queue.claim(1)
        assert item.attempts == attempt
        assert queue.fail("poison", f"boom {attempt}", delay=0) == "retry"
    [item] = queue.claim(1)
    assert queue.fail("poison", "boom 3", delay=0) == "dead"
    assert queue.claim(1) == []
    [letter] = queue.dead_letters()
    assert (letter["id"], letter["attempts"], letter["error"]) == ("poison", 3, "boom 3")
    assert queue.stats()["dead"] == 1
    assert queue.requeue("poison") is True
    [item] = queue.claim(1)
    assert item.attempts == 1  # fresh deliveries


def test_a_lost_drainer_on_the_last_attempt_also_ends_in_dead_letters(queue, redis_client):
    queue.schedule("t", id="lost")
    for _ in range(3):
        queue.claim(1)
        expire_visibility(queue, redis_client, "lost")
    assert queue.claim(1) == []
    [letter] = queue.dead_letters()
    assert "visibility timeout" in letter["error"]


def test_ack_leaves_an_item_rescheduled_while_it_was_handled(queue, redis_client):
    queue.schedule("t", {"v": 1}, id="r")
    queue.claim(1)
    queue.schedule("t", {"v": 2}, delay=60, id="r")  # rescheduled by someone meanwhile
    assert queue.ack("r") == 0
    assert redis_client.zscore(queue.keys.due, "r") is not None


def test_cancel_removes_it_wherever_it_is(queue):
    queue.schedule("t", delay=60, id="due")
    queue.schedule("t", id="flying")
    queue.claim(5)
    assert queue.cancel("due") and queue.cancel("flying")
    assert not queue.cancel("due")
    stats = queue.stats()
    assert (stats["scheduled"], stats["in_flight"]) == (0, 0)


def test_ack_of_a_batch_is_one_round_trip(queue, redis_client):
    for n in range(50):
        queue.schedule("t", id=f"i{n}")
    items = queue.claim(50)
    redis_client.config_resetstat()
    assert queue.ack(*(item.id for item in items)) == 50
    assert redis_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 1


def test_batches_larger_than_one_lua_chunk_are_claimed_and_acked_whole(queue, redis_client):
    pipe = redis_client.pipeline(transaction=False)
    for n in range(2500):
        pipe.zadd(queue.keys.due, {f"i{n}": 1})
        pipe.hset(queue.keys.items, f"i{n}", '{"task":"t","payload":null}')
    pipe.execute()
    items = queue.claim(2500)
    assert len({item.id for item in items}) == 2500 and {item.attempts for item in items} == {1}
    assert queue.ack(*(item.id for item in items), "i0") == 2500  # a repeated id counts once
    assert data_keys(redis_client) == []


def test_bad_arguments_change_nothing(queue, redis_client):
    bad_calls = [
        lambda: queue.schedule("", {}),
        lambda: queue.schedule("t", {"x": {1, 2}}),  # a set is not JSON
        lambda: queue.schedule("t", delay=-1),
        lambda: queue.schedule("t", delay=True),
        lambda: queue.schedule("t", eta=dt.datetime(2030, 1, 1)),  # naive
        lambda: queue.schedule("t", delay=1, eta=in_the_past(1)),
        lambda: queue.schedule("t", id=""),
        lambda: queue.claim(0),
        lambda: DelayQueue(""),
        lambda: DelayQueue("q", max_attempts=0),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidSchedule):
            call()
    assert data_keys(redis_client) == []


# -- draining ------------------------------------------------------------------------


@pytest.fixture
def handled():
    seen: list = []
    handler("tests.record")(seen.append)

    @handler("tests.explode")
    def explode(payload):
        raise RuntimeError(f"cannot handle {payload}")

    yield seen
    HANDLERS.pop("tests.record", None)
    HANDLERS.pop("tests.explode", None)


def test_drain_runs_handlers_acks_and_retries_unknown_tasks(queue, handled, redis_client):
    queue.schedule("tests.record", {"n": 1}, id="ok-1")
    queue.schedule("tests.record", {"n": 2}, id="ok-2")
    queue.schedule("no.such.task", {"n": 3}, id="unknown")
    queue.schedule("tests.explode", {"n": 4}, id="bad")
    before = redis_ms(redis_client)
    result = queue.drain()
    after = redis_ms(redis_client)
    assert handled == [{"n": 1}, {"n": 2}]
    assert (result.handled, result.dead, result.failed) == (2, 0, 2)
    stats = queue.stats()
    assert (stats["in_flight"], stats["scheduled"], stats["dead"]) == (0, 2, 0)  # both retry
    due = redis_client.zscore(queue.keys.due, "unknown")
    # The usual backoff: 2**1 s after the first delivery failed, during the drain.
    assert before + 2_000 <= due <= after + 2_000


def test_an_item_without_handler_waits_for_one_then_dies_after_its_deliveries(
    queue, handled, redis_client
):
    queue.schedule("tests.later", {"n": 1}, id="early")
    queue.schedule("tests.never", {"n": 2}, id="orphan")
    for _ in range(2):
        assert queue.drain().failed == 2
        redis_client.zadd(queue.keys.due, {"early": 1, "orphan": 1}, xx=True)  # due now
    handler("tests.later")(handled.append)  # e.g. the drainer was restarted with the new code
    try:
        result = queue.drain()
    finally:
        HANDLERS.pop("tests.later", None)
    assert (result.handled, result.dead) == (1, 1)
    assert handled == [{"n": 1}]
    [letter] = queue.dead_letters()
    assert (letter["id"], letter["attempts"]) == ("orphan", 3)
    assert "no handler or Celery task is registered for task 'tests.never'" in letter["error"]
    assert "'delay_handlers'" in letter["error"]


def test_release_gives_unstarted_items_back_without_counting_the_delivery(queue, redis_client):
    for n in range(3):
        queue.schedule("t", {"n": n}, id=f"r{n}")
    items = queue.claim(3)
    assert items[0].deadline_ms == redis_client.zscore(queue.keys.inflight, "r0")
    assert queue.release(*items[1:]) == 2
    assert queue.release(*items[1:]) == 0  # a repeat (a lost reply) changes nothing
    again = queue.claim(3)
    assert sorted((i.id, i.attempts) for i in again) == [("r1", 1), ("r2", 1)]
    # r1's visibility runs out and another drainer claims it: the first claim's
    # late release must not take it from that drainer.
    expire_visibility(queue, redis_client, "r1")
    [third] = queue.claim(1)
    assert (third.id, third.attempts) == ("r1", 2)
    assert queue.release(*[i for i in again if i.id == "r1"]) == 0
    assert redis_client.zscore(queue.keys.inflight, "r1") == third.deadline_ms
    assert queue.release(third) == 1
    [fourth] = queue.claim(1)
    assert (fourth.id, fourth.attempts) == ("r1", 2)  # the released delivery was not counted


HANG_AT = 9  # of 20


@pytest.fixture
def short_queue() -> DelayQueue:
    # Give-back after 0.5 s (GIVE_BACK_SHARE of 2 s); a wait for it is bounded by TIMEOUT.
    return DelayQueue("short", max_attempts=3, visibility_timeout=2)


def test_a_long_handler_holds_up_only_its_own_item(short_queue, redis_client):
    """Items finished before it are acknowledged and the unstarted rest goes back to
    the queue while it runs, not left in flight until the whole batch's visibility ends."""
    queue = short_queue
    seen: list[int] = []
    observed: dict[str, int] = {}

    def work(payload: int) -> None:
        seen.append(payload)
        if payload == HANG_AT and seen.count(HANG_AT) == 1:
            # Runs until the drain's keeper has settled the batch around it.
            wait_until(lambda: queue.stats()["in_flight"] == 1, what="the batch to be settled")
            observed.update(queue.stats())

    handler("tests.long")(work)
    try:
        for n in range(20):
            queue.schedule("tests.long", n, eta=in_the_past(100 - n), id=f"l{n}")
        result = queue.drain()
    finally:
        HANDLERS.pop("tests.long", None)
    assert (observed["in_flight"], observed["due_now"]) == (1, 20 - HANG_AT - 1)
    assert sorted(seen) == list(range(20))  # each exactly once, the long one included
    assert (result.handled, result.released, result.batches) == (20, 20 - HANG_AT - 1, 2)
    stats = queue.stats()
    assert (stats["scheduled"], stats["in_flight"], stats["dead"]) == (0, 0, 0)
    assert not redis_client.exists(queue.keys.attempts)  # given back: no delivery counted


def _claim_and_record(index: int, batch: int) -> list[str]:
    queue = DelayQueue("race", visibility_timeout=60)
    seen = []
    while items := queue.claim(batch):
        seen.extend(item.id for item in items)
        queue.ack(*(item.id for item in items))
    return seen


@pytest.mark.django_db(transaction=True)
def test_concurrent_drainers_never_get_the_same_item(redis_client):
    queue = DelayQueue("race")
    pipe = redis_client.pipeline(transaction=False)
    for n in range(3000):
        pipe.zadd(queue.keys.due, {f"i{n}": 1})
        pipe.hset(queue.keys.items, f"i{n}", '{"task":"t","payload":null}')
    pipe.execute()
    per_process = run_in_processes(_claim_and_record, 4, 25)
    claimed = [item for seen in per_process for item in seen]
    assert len(claimed) == 3000
    assert len(set(claimed)) == 3000
    assert queue.stats()["scheduled"] == 0 and queue.stats()["in_flight"] == 0


def test_a_batch_past_its_give_back_time_still_makes_progress(queue, handled, monkeypatch):
    """Every batch is "late" at once: each claim starts its first item only and gives the
    rest back, so the drain still hands out every item, once, without counting deliveries."""
    monkeypatch.setattr(runner, "GIVE_BACK_SHARE", 0)
    for n in range(5):
        queue.schedule("tests.record", n, eta=in_the_past(10 - n), id=f"p{n}")
    result = queue.drain()
    assert handled == [0, 1, 2, 3, 4]
    assert (result.handled, result.batches, result.released) == (5, 5, 4 + 3 + 2 + 1)
    assert queue.stats()["scheduled"] == 0 and queue.stats()["in_flight"] == 0


# -- handler discovery -------------------------------------------------------------------

TEST_APP = "tests.delayapp"
TEST_APP_HANDLERS = f"{TEST_APP}.delay_handlers"


@pytest.fixture
def undiscovered():
    """The test app's handler module neither imported nor registered, before and after."""

    def forget() -> None:
        sys.modules.pop(TEST_APP_HANDLERS, None)
        HANDLERS.pop(test_app_handlers.COUNT_TASK, None)

    forget()
    yield
    forget()


def test_handlers_of_an_installed_app_are_found_when_django_is_ready(undiscovered):
    assert test_app_handlers.COUNT_TASK not in HANDLERS
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, TEST_APP]):  # ready() again
        assert test_app_handlers.COUNT_TASK in HANDLERS
        assert HANDLERS[test_app_handlers.COUNT_TASK].__module__ == TEST_APP_HANDLERS


def test_a_drainer_process_handles_an_item_whose_handler_module_nobody_imports(redis_client):
    """``run_delay_queue`` set up with the test app installed: the handler is known
    only through discovery (before, the item was dead-lettered on first delivery)."""
    env = celery_environment(DJANGO_SETTINGS_MODULE="tests.delayapp.settings")
    drainer = CeleryProcess("drainer", "discovery", env, ("--queue", "discovery")).start()
    queue = DelayQueue("discovery")
    try:
        queue.schedule(test_app_handlers.COUNT_TASK, {"n": "found"}, id="found")
        wait_until(
            lambda: redis_client.hget(test_app_handlers.COUNTS, "found") or queue.stats()["dead"],
            what="the item to be handled (or buried)",
        )
    finally:
        drainer.stop()
    assert queue.dead_letters() == []
    assert redis_client.hget(test_app_handlers.COUNTS, "found") == b"1"
