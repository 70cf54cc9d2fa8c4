"""Fenced writes on PostgreSQL: a holder whose lease ran out cannot overwrite a newer holder."""

from __future__ import annotations

import pytest

from demo_shop.shop.models import Product
from stock_locks import Lock
from stock_locks.exceptions import StaleFencingToken
from stock_locks.fencing import fenced_update

pytestmark = pytest.mark.django_db


def test_paused_holder_write_is_rejected_and_row_keeps_the_newer_value(redis_client):
    product = Product.objects.create(sku="TEA", name="Tea", stock=10)
    paused = Lock("shop.product:TEA", ttl=30)
    paused.acquire()
    # The paused holder's lease runs out (staged: the key expires now)...
    redis_client.pexpire(paused.keys.lock, 1)
    newer = Lock("shop.product:TEA", ttl=30, timeout=5)
    assert newer.acquire()
    assert newer.fence > paused.fence
    assert fenced_update(Product.objects.filter(pk=product.pk), newer.fence, stock=7) == 1
    # ...and when it wakes up, its write carries the older fence.
    with pytest.raises(StaleFencingToken) as info:
        fenced_update(Product.objects.filter(pk=product.pk), paused.fence, stock=9)
    assert info.value.fence == paused.fence and info.value.current == newer.fence
    product.refresh_from_db()
    assert (product.stock, product.fence) == (7, newer.fence)


def test_same_grant_may_write_twice_and_older_fences_never_win():
    product = Product.objects.create(sku="CUP", name="Cup", stock=5)
    rows = Product.objects.filter(pk=product.pk)
    assert fenced_update(rows, 3, stock=4) == 1
    assert fenced_update(rows, 3, stock=3) == 1  # same grant, second write
    for stale in (1, 2):
        with pytest.raises(StaleFencingToken):
            fenced_update(rows, stale, stock=100)
    product.refresh_from_db()
    assert (product.stock, product.fence) == (3, 3)


def test_multi_row_update_is_all_or_nothing():
    a = Product.objects.create(sku="A", name="A", stock=1, fence=5)
    b = Product.objects.create(sku="B", name="B", stock=1, fence=9)
    with pytest.raises(StaleFencingToken):
        fenced_update(Product.objects.filter(sku__in=["A", "B"]), 7, stock=0)
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.stock, a.fence, b.stock, b.fence) == (1, 5, 1, 9)


def test_fenced_save_writes_one_row_in_one_update(django_assert_num_queries):
    product = Product.objects.create(sku="PEN", name="Pen", stock=2, fence=4)
    product.stock = 1
    with django_assert_num_queries(1):
        product.fenced_save(4, ["stock"])
    product.stock = 50
    with pytest.raises(StaleFencingToken):
        product.fenced_save(3, ["stock"])
    assert Product.objects.get(pk=product.pk).stock == 1
    with pytest.raises(Product.DoesNotExist):
        Product(pk=999_999, sku="X").fenced_save(10, ["sku"])


@pytest.mark.parametrize("bad", [0, -1, True, "7", 1.5])
def test_bad_fence_is_refused_and_changes_nothing(bad):
    product = Product.objects.create(sku="BAD", name="Bad", stock=2)
    with pytest.raises(ValueError):
        fenced_update(Product.objects.filter(pk=product.pk), bad, stock=0)
    assert Product.objects.get(pk=product.pk).stock == 2
