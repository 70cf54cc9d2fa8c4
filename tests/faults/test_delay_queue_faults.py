"""The delay queue on a bad day: a hanging handler, a paused drainer, lost replies.

Drainers are real ``manage.py run_delay_queue`` processes, set up with the test
app ``tests.delayapp`` installed (its ``delay_handlers`` module is found by
discovery) and a 2 s visibility timeout. Their handler counts every handling
it finishes in a Redis hash, written straight to the server (not through a
fault proxy), so each test counts what was handled how many times.

Delivery is at least once; what must not happen is an item handled twice
because of someone else's fault: a neighbour in its batch that hangs, a
drainer resuming a claim whose visibility ended while it was paused, an ack
whose reply was lost. And nothing may be lost: items claimed by a request whose
reply never came back are delivered once their visibility runs out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stock_locks import DelayQueue, scripts
from stock_locks.exceptions import RedisUnavailable
from tests.delayapp.delay_handlers import COUNT_TASK, COUNTS, HANGING, RELEASE
from tests.support.celery_processes import CeleryProcess, celery_environment
from tests.support.redis_stats import redis_ms
from tests.support.waiting import wait_until

QUEUE = "faults"
VISIBILITY = 2  # seconds: the drainers' DELAY_QUEUE_VISIBILITY
ITEMS = 20
HANG_AT = 9  # the item whose first delivery hangs: 9 before it, 10 after it in one batch


@pytest.fixture
def queue(redis_client) -> DelayQueue:
    # Scripts loaded beforehand, so that the first EVALSHA through a proxy runs
    # (a NOSCRIPT reply would be the one lost, and nothing would have happened).
    for script in (scripts.DELAY_SCHEDULE, scripts.DELAY_CLAIM, scripts.DELAY_ACK,
                   scripts.DELAY_REMOVE):  # fmt: skip
        redis_client.script_load(script.script)
    return DelayQueue(QUEUE, visibility_timeout=VISIBILITY)


@pytest.fixture
def drainers(redis_server, redis_client) -> Iterator[Callable[..., CeleryProcess]]:
    """``drainers(name, redis_url=None, kind="drainer")``: a started ``run_delay_queue
    --queue faults``, or with ``kind`` "worker" or "beat" a Celery worker or beat
    (beat sends the drain task of the "default" queue every 0.2 s)."""
    started: list[CeleryProcess] = []

    def start(name: str, redis_url: str | None = None, kind: str = "drainer") -> CeleryProcess:
        env = celery_environment(
            DJANGO_SETTINGS_MODULE="tests.delayapp.settings",
            DELAY_QUEUE_VISIBILITY=str(VISIBILITY),
            DELAY_QUEUE_INTERVAL="0.2",
            DQ_COUNTER_URL=redis_server.url,
        )
        if redis_url:
            env["REDIS_URL"] = redis_url
        args = ("--queue", QUEUE) if kind == "drainer" else ()
        started.append(CeleryProcess(kind, name, env, args).start())
        return started[-1]

    yield start
    redis_client.rpush(RELEASE, *["go"] * len(started))  # no handler left hanging
    for process in started:
        process.stop()


def schedule_batch(
    queue: DelayQueue,
    redis_client,
    n: int,
    *,
    hang: int | None = None,
    start: int = 0,
    stop: bool = False,
) -> None:
    """Items ``start``..``start+n-1``, all due now: a claim takes them in that order
    (equal scores sort by id). ``hang`` (with ``stop``: and SIGSTOP its drainer) is
    the item whose first delivery blocks."""
    eta = dt.datetime.fromtimestamp(redis_ms(redis_client) / 1000, dt.UTC)
    for i in range(start, start + n):
        payload = {"n": i, "hang": i == hang, "stop": stop and i == hang}
        queue.schedule(COUNT_TASK, payload, eta=eta, id=f"item-{i:03d}")


def claim_together(
    drainer: CeleryProcess, queue: DelayQueue, redis_client, *, stop: bool = False
) -> None:
    """Schedule the 20 items while ``drainer`` is paused, so that it claims them in one batch."""
    drainer.pause()
    schedule_batch(queue, redis_client, ITEMS, hang=HANG_AT, stop=stop)
    drainer.resume()


def counts(redis_client) -> dict[int, int]:
    return {int(k): int(v) for k, v in redis_client.hgetall(COUNTS).items()}


def quiet(queue: DelayQueue) -> bool:
    stats = queue.stats()
    return not stats["scheduled"] and not stats["in_flight"]


def drains_reported(process: CeleryProcess) -> int:
    return process.output().count("handled ")


def test_a_hanging_handler_makes_only_its_own_item_be_delivered_again(
    queue, drainers, redis_client
):
    a = drainers("a")
    claim_together(a, queue, redis_client)
    wait_until(lambda: redis_client.get(HANGING) == str(HANG_AT).encode(), what="the hang")
    b = drainers("b")  # takes what A gives back, then the hanging item once its visibility ends
    others = [i for i in range(ITEMS) if i != HANG_AT]
    wait_until(
        lambda: all(counts(redis_client).get(i) for i in [*others, HANG_AT]),
        what="B to handle the rest of the batch and the redelivered hanging item",
    )
    reported = drains_reported(a)
    redis_client.rpush(RELEASE, "go")  # A's handler returns: A finishes its drain
    wait_until(lambda: drains_reported(a) > reported, what="A to finish its drain")
    wait_until(lambda: quiet(queue), what="the queue to go quiet")
    handled = counts(redis_client)
    assert {i: handled[i] for i in others} == dict.fromkeys(others, 1)  # was 2 for all 20
    assert handled[HANG_AT] == 2  # at least once: A finished it, B had it again after 2 s
    assert queue.stats()["dead"] == 0
    assert a.alive() and b.alive()


def test_a_hanging_handler_in_a_celery_worker_makes_only_its_own_item_be_delivered_again(
    drainers, redis_client
):
    """The same with the shipped Celery task: beat sends ``drain_delay_queue`` every
    0.2 s; worker A takes the first one and hangs in it, worker B takes later ones."""
    queue = DelayQueue("default")  # what the drain task drains
    a = drainers("a", kind="worker")
    a.pause()  # so that its first drain task finds the 20 items due together
    schedule_batch(queue, redis_client, ITEMS, hang=HANG_AT)
    drainers("beat", kind="beat")
    a.resume()
    wait_until(lambda: redis_client.get(HANGING) == str(HANG_AT).encode(), what="the hang")
    b = drainers("b", kind="worker")
    wait_until(
        lambda: len(counts(redis_client)) == ITEMS,
        what="B to handle the rest of the batch and the redelivered hanging item",
    )
    finished = a.output().count("succeeded in")
    redis_client.rpush(RELEASE, "go")
    wait_until(lambda: a.output().count("succeeded in") > finished, what="A's drain task to end")
    wait_until(lambda: quiet(queue), what="the queue to go quiet")
    handled = counts(redis_client)
    others = [i for i in range(ITEMS) if i != HANG_AT]
    assert {i: handled[i] for i in others} == dict.fromkeys(others, 1)
    assert handled[HANG_AT] == 2
    assert queue.stats()["dead"] == 0
    assert a.alive() and b.alive()


def test_a_drainer_paused_mid_batch_starts_none_of_its_expired_claim_on_resume(
    queue, drainers, redis_client
):
    a = drainers("a")
    # A's hanging handler SIGSTOPs A, helper thread included, before it could settle
    # the batch (a pause sent from here could come after its give-back time).
    claim_together(a, queue, redis_client, stop=True)
    wait_until(lambda: a.stopped() and redis_client.get(HANGING) == str(HANG_AT).encode(),
               what="A to stop itself at the hang")  # fmt: skip
    drainers("b")
    wait_until(
        lambda: len(counts(redis_client)) == ITEMS and quiet(queue),
        what="B to handle and acknowledge the whole expired claim",
    )
    reported = drains_reported(a)
    a.resume()
    redis_client.rpush(RELEASE, "go")
    wait_until(lambda: drains_reported(a) > reported, what="A to finish its drain")
    wait_until(lambda: quiet(queue), what="the queue to go quiet")
    handled = counts(redis_client)
    unstarted = range(HANG_AT + 1, ITEMS)
    assert {i: handled[i] for i in unstarted} == dict.fromkeys(unstarted, 1)
    # Finished by A but not yet acknowledged when it was paused: delivered again.
    assert all(handled[i] == 2 for i in range(HANG_AT + 1)), (handled, a.output())
    assert queue.stats()["dead"] == 0


def test_a_lost_claim_reply_loses_nothing_and_the_drainer_keeps_going(
    queue, drainers, redis_server, redis_client, fault_proxy
):
    proxy = fault_proxy(redis_server.port)
    schedule_batch(queue, redis_client, ITEMS)
    proxy.lose_reply(scripts.DELAY_CLAIM.sha.encode())  # A's first claim takes all 20, unseen
    a = drainers("a", redis_url=proxy.url)
    wait_until(lambda: proxy.lost, what="the claim's reply to be lost")
    wait_until(
        lambda: len(counts(redis_client)) == ITEMS and quiet(queue),
        what="the claimed-but-unseen items to be delivered after their visibility",
    )
    schedule_batch(queue, redis_client, 5, start=ITEMS)  # and it goes on draining
    wait_until(lambda: len(counts(redis_client)) == ITEMS + 5 and quiet(queue),
               what="later items")  # fmt: skip
    assert counts(redis_client) == dict.fromkeys(range(ITEMS + 5), 1)
    assert queue.stats()["dead"] == 0
    assert "runner: RedisUnavailable" in a.output()  # (the lost reply's ConnectionError)
    assert proxy.lost == 1 and a.alive()


def test_a_lost_ack_reply_handles_nothing_twice_and_the_drainer_keeps_going(
    queue, drainers, redis_server, redis_client, fault_proxy
):
    proxy = fault_proxy(redis_server.port)
    schedule_batch(queue, redis_client, ITEMS)
    proxy.lose_reply(scripts.DELAY_ACK.sha.encode())  # the batch is acked, A sees an error
    a = drainers("a", redis_url=proxy.url)
    wait_until(lambda: proxy.lost, what="the ack's reply to be lost")
    schedule_batch(queue, redis_client, 5, start=ITEMS)
    wait_until(lambda: len(counts(redis_client)) == ITEMS + 5 and quiet(queue),
               what="every item, and later ones")  # fmt: skip
    assert counts(redis_client) == dict.fromkeys(range(ITEMS + 5), 1)
    assert queue.stats()["dead"] == 0
    assert "acknowledging a batch failed" in a.output()
    assert proxy.lost == 1 and a.alive()


def test_schedule_and_cancel_whose_replies_were_lost_are_safe_to_repeat(
    queue, redis_server, redis_client, fault_proxy
):
    proxy = fault_proxy(redis_server.port)
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))  # as django-redis's
    producer = DelayQueue(QUEUE, redis=client)
    k = queue.keys

    proxy.lose_reply(scripts.DELAY_SCHEDULE.sha.encode())
    with pytest.raises(RedisUnavailable) as lost:
        producer.schedule(COUNT_TASK, {"n": 1}, delay=60, id="order-1")
    assert isinstance(lost.value.__cause__, redis.ConnectionError)
    assert (proxy.lost, redis_client.zcard(k.due)) == (1, 1)  # it ran
    assert producer.schedule(COUNT_TASK, {"n": 1}, delay=60, id="order-1") == "order-1"
    assert (redis_client.zcard(k.due), redis_client.hlen(k.items)) == (1, 1)  # one copy

    proxy.lose_reply(scripts.DELAY_REMOVE.sha.encode())
    with pytest.raises(RedisUnavailable):
        producer.cancel("order-1")
    assert proxy.lost == 2
    assert producer.cancel("order-1") is False  # the lost call removed it
    assert not any(redis_client.exists(key) for key in (k.due, k.items, k.inflight))
    client.close()
