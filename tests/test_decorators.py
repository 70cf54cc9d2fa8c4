"""@locked and @lock_model on functions, views (function, class-based, async) and Celery tasks."""

from __future__ import annotations

import asyncio
import json

import pytest
from celery import Celery
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from demo_shop.shop.models import Product
from stock_locks import Lock, lock_model, locked
from stock_locks.exceptions import LockError, LockTimeout, RedisUnavailable


def held(name: str, redis_client) -> bool:
    return bool(redis_client.exists(f"sl:lock:{{{name}}}"))


def test_key_is_formatted_from_bound_arguments_with_attribute_access(redis_client):
    class Customer:
        pk = 17

    seen = []

    @locked("cart:{customer.pk}:{item}", ttl=5)
    def add(customer, item="apple", qty=1):
        seen.append(held(f"cart:17:{item}", redis_client))
        return qty

    assert add(Customer(), qty=3) == 3
    assert add(Customer(), "pear") == 1
    assert seen == [True, True]
    assert not held("cart:17:apple", redis_client)  # released after the call


def test_key_naming_an_unknown_argument_fails_at_decoration():
    with pytest.raises(LockError, match="order_id"):

        @locked("order:{order_id}")
        def pay(request, pk):
            pass

    with pytest.raises(LockError, match="name the argument"):
        locked("order:{}")


def test_key_with_kwargs_is_checked_at_call_time():
    @locked("job:{job_id}", ttl=5)
    def run(**options):
        return options["job_id"]

    assert run(job_id=3) == 3
    with pytest.raises(LockError, match="job_id"):
        run(other=1)


def test_function_raises_lock_timeout_when_the_lock_is_held():
    @locked("order:{order_id}", timeout=0)
    def pay(order_id):
        return "paid"

    with Lock("order:5", ttl=10), pytest.raises(LockTimeout) as info:
        pay(5)
    assert info.value.name == "order:5"
    assert pay(5) == "paid"


@pytest.mark.urls("tests.urls")
def test_view_answers_423_with_json_when_the_lock_is_held(client):
    assert client.post("/orders/9/pay/").json() == {"paid": 9}
    with Lock("order:9", ttl=10):
        response = client.post("/orders/9/pay/")
        assert response.status_code == 423
        body = response.json()
        assert body["error"] == "locked" and body["lock"] == "order:9"
        assert client.post("/orders/10/pay/").status_code == 200  # another order is free


@pytest.mark.urls("tests.urls")
def test_class_based_view_method(client):
    with Lock("order:4", ttl=10):
        assert client.post("/orders/4/").status_code == 423
    assert client.post("/orders/4/").json() == {"updated": 4}


@pytest.mark.urls("tests.urls")
def test_lock_model_uses_app_label_model_name_and_pk(client, redis_client):
    with Lock("shop.product:12", ttl=10):
        assert client.post("/products/12/restock/").status_code == 423
    assert client.post("/products/12/restock/").json() == {"restocked": 12}

    seen = []

    @lock_model(Product, kwarg="product")
    def reprice(product, price):
        seen.append(held("shop.product:31", redis_client))

    reprice(Product(pk=31), 5)  # a model instance stands for its pk
    assert seen == [True]
    with pytest.raises(LockError, match="product"):

        @lock_model(Product, kwarg="product")
        def wrong(pk):
            pass


def test_async_view_uses_the_lock_too(redis_client):
    from tests.urls import async_profile

    request = RequestFactory().get("/me/")
    request.user = type("U", (), {"pk": 8})()
    with Lock("user:8", ttl=10):
        assert asyncio.run(async_profile(request)).status_code == 423
    assert asyncio.run(async_profile(request)).status_code == 200
    assert not held("user:8", redis_client)


def test_view_answers_503_and_function_raises_when_redis_is_down(redis_factory, use_redis):
    from tests.urls import pay_order

    server = redis_factory()
    use_redis(server)
    server.kill()
    request = RequestFactory().post("/orders/1/pay/")
    request.user = AnonymousUser()
    response = pay_order(request, order_id=1)
    assert response.status_code == 503
    assert json.loads(response.content)["error"] == "unavailable"

    @locked("order:{order_id}")
    def pay(order_id):
        raise AssertionError("must not run without its lock")

    with pytest.raises(RedisUnavailable):
        pay(1)


def test_celery_task_runs_under_the_lock(redis_client):
    app = Celery("decorator-test", set_as_current=False)
    seen = []

    @app.task(name="tests.pay_order", bind=True)
    @locked("order:{order_id}", timeout=0)
    def pay_task(self, order_id):
        seen.append(held(f"order:{order_id}", redis_client))
        return order_id

    assert pay_task.apply(args=(6,)).get() == 6
    assert seen == [True]
    with Lock("order:6", ttl=10):
        result = pay_task.apply(args=(6,))
        assert isinstance(result.result, LockTimeout)
