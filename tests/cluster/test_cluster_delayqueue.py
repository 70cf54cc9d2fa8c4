"""The delay queue and its runner on a real Redis Cluster.

Each queue's keys share its name as hash tag, so every queue script runs on the
node serving that tag; a drain's end-of-batch ack and give-back go to that node
as one batch (cluster pipelines refuse EVALSHA). The suite's own delay-queue
tests run here unchanged (imported), and ``manage.py run_delay_queue`` drains a
queue on the cluster as a project would run it.
"""

from __future__ import annotations

from stock_locks import DelayQueue
from tests.delayapp import delay_handlers
from tests.support.celery_processes import CeleryProcess, celery_environment
from tests.support.waiting import wait_until
from tests.test_delayqueue import (  # noqa: F401  (collected here: they run on the cluster)
    handled,
    in_the_past,
    queue,
    short_queue,
    test_a_batch_past_its_give_back_time_still_makes_progress,
    test_a_long_handler_holds_up_only_its_own_item,
    test_a_lost_drainer_on_the_last_attempt_also_ends_in_dead_letters,
    test_ack_leaves_an_item_rescheduled_while_it_was_handled,
    test_an_item_without_handler_waits_for_one_then_dies_after_its_deliveries,
    test_cancel_removes_it_wherever_it_is,
    test_delay_counts_from_the_redis_clock,
    test_drain_runs_handlers_acks_and_retries_unknown_tasks,
    test_item_goes_to_dead_letters_after_max_attempts_with_its_last_error,
    test_only_due_items_are_claimed_in_due_order,
    test_release_gives_unstarted_items_back_without_counting_the_delivery,
    test_scheduling_an_id_again_replaces_it_never_duplicates,
    test_unacked_item_is_delivered_again_after_its_visibility,
)


def test_queues_live_on_every_master_each_in_its_own_slot(redis_cluster):
    masters = {redis_cluster.master_for_key(DelayQueue(f"q{n}").keys.due).port for n in range(12)}
    assert len(masters) == 3
    for n in range(12):
        q = DelayQueue(f"q{n}")
        q.schedule("t", {"n": n}, eta=in_the_past(1), id=f"i{n}")
        [item] = q.claim(5)
        assert (item.id, item.payload) == (f"i{n}", {"n": n})
        q.ack(item.id)
        assert q.stats()["in_flight"] == 0


def test_run_delay_queue_drains_a_queue_on_the_cluster(redis_client):
    """The runner in its own process, configured by tests/cluster/settings.py: handles
    what is due at once, then sleeps until a later item is due or one is scheduled."""
    name = "runner"
    drainer = CeleryProcess(
        "drainer", "cluster-drainer", celery_environment(), ("--queue", name)
    ).start()
    runner_queue = DelayQueue(name)
    try:
        for n in range(5):
            runner_queue.schedule(delay_handlers.COUNT_TASK, {"n": f"due-{n}"}, id=f"due-{n}")
        wait_until(
            lambda: len(redis_client.hgetall(delay_handlers.COUNTS)) == 5,
            what="the due items to be handled",
        )
        # Scheduled while the runner sleeps: it is woken, and handles it when due.
        runner_queue.schedule(delay_handlers.COUNT_TASK, {"n": "later"}, delay=0.3, id="later")
        wait_until(
            lambda: redis_client.hget(delay_handlers.COUNTS, "later"),
            what="the later item to be handled",
        )
    finally:
        drainer.stop()
    counts = redis_client.hgetall(delay_handlers.COUNTS)
    assert counts == {f"due-{n}".encode(): b"1" for n in range(5)} | {b"later": b"1"}
    stats = runner_queue.stats()
    assert (stats["scheduled"], stats["in_flight"], stats["dead"]) == (0, 0, 0)
    assert "Traceback" not in drainer.output()
