"""The waiting room on a real Redis Cluster: every key of a room carries the event's
hash tag, so each script touches one slot. The single-server tests run here
unchanged, the FIFO order across OS processes among them; two rooms land on their
own slots."""

from __future__ import annotations

from redis.crc import key_slot

from tests.test_waitingroom import (  # noqa: F401  (collected here: they run on the cluster)
    _fresh_caches,
    room,
    test_a_silent_waiting_visitor_loses_its_place,
    test_abandoned_visitors_do_not_stall_the_queue,
    test_admission_keeps_max_active_and_the_rate,
    test_fifo_per_lane_across_processes,
    test_one_ticket_per_visitor_under_concurrent_duplicate_joins,
    test_position_counts_own_lane_and_the_lanes_above,
    test_prequeue_is_shuffled_once_at_the_start_then_fifo,
    test_sold_out_closes_the_room_and_reopening_keeps_the_order,
    test_touch_refuses_a_pass_of_a_lost_state_or_a_freed_slot,
)


def test_a_rooms_keys_share_one_slot_and_rooms_spread():
    slots = {}
    for slug in ("kettles", "toasters"):
        keys = room(slug).keys
        found = {key_slot(key.encode()) for key in keys.script_keys()}
        assert len(found) == 1
        slots[slug] = found.pop()
        assert room(slug).stats().tickets == 0  # (its pipeline runs on that slot's node)
    assert slots["kettles"] != slots["toasters"]
