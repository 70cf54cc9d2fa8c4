"""Fenced writes on PostgreSQL: a holder whose lease ran out cannot overwrite a newer holder."""

from __future__ import annotations

import pytest

from stock_locks import Lock
from stock_locks.exceptions import StaleFencingToken
from stock_locks.fencing import fenced_update
from tests.inventory.models import Item

pytestmark = pytest.mark.django_db


def test_paused_holder_write_is_rejected_and_row_keeps_the_newer_value(redis_client):
    item = Item.objects.create(code="TEA", title="Tea", on_hand=10)
    paused = Lock("inventory.item:TEA", ttl=30)
    paused.acquire()
    # The paused holder's lease runs out (staged: the key expires now)...
    redis_client.pexpire(paused.keys.lock, 1)
    newer = Lock("inventory.item:TEA", ttl=30, timeout=5)
    assert newer.acquire()
    assert newer.fence > paused.fence
    assert fenced_update(Item.objects.filter(pk=item.pk), newer.fence, on_hand=7) == 1
    # ...and when it wakes up, its write carries the older fence.
    with pytest.raises(StaleFencingToken) as info:
        fenced_update(Item.objects.filter(pk=item.pk), paused.fence, on_hand=9)
    assert info.value.fence == paused.fence and info.value.current == newer.fence
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (7, newer.fence)


def test_same_grant_may_write_twice_and_older_fences_never_win():
    item = Item.objects.create(code="CUP", title="Cup", on_hand=5)
    rows = Item.objects.filter(pk=item.pk)
    assert fenced_update(rows, 3, on_hand=4) == 1
    assert fenced_update(rows, 3, on_hand=3) == 1  # same grant, second write
    for stale in (1, 2):
        with pytest.raises(StaleFencingToken):
            fenced_update(rows, stale, on_hand=100)
    item.refresh_from_db()
    assert (item.on_hand, item.fence) == (3, 3)


def test_multi_row_update_is_all_or_nothing():
    a = Item.objects.create(code="A", title="A", on_hand=1, fence=5)
    b = Item.objects.create(code="B", title="B", on_hand=1, fence=9)
    with pytest.raises(StaleFencingToken):
        fenced_update(Item.objects.filter(code__in=["A", "B"]), 7, on_hand=0)
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.on_hand, a.fence, b.on_hand, b.fence) == (1, 5, 1, 9)


def test_fenced_save_writes_one_row_in_one_update(django_assert_num_queries):
    item = Item.objects.create(code="PEN", title="Pen", on_hand=2, fence=4)
    item.on_hand = 1
    with django_assert_num_queries(1):
        item.fenced_save(4, ["on_hand"])
    item.on_hand = 50
    with pytest.raises(StaleFencingToken):
        item.fenced_save(3, ["on_hand"])
    assert Item.objects.get(pk=item.pk).on_hand == 1
    with pytest.raises(Item.DoesNotExist):
        Item(pk=999_999, code="X").fenced_save(10, ["code"])


@pytest.mark.parametrize("bad", [0, -1, True, "7", 1.5])
def test_bad_fence_is_refused_and_changes_nothing(bad):
    item = Item.objects.create(code="BAD", title="Bad", on_hand=2)
    with pytest.raises(ValueError):
        fenced_update(Item.objects.filter(pk=item.pk), bad, on_hand=0)
    assert Item.objects.get(pk=item.pk).on_hand == 2
