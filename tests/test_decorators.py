"""@locked and @lock_model on functions, views (function, class-based, async) and Celery tasks."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from celery import Celery
from django.contrib.auth.models import AnonymousUser
from django.http import JsonResponse
from django.test import RequestFactory
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from stock_locks import Lock, limit_concurrency, lock_model, locked
from stock_locks.exceptions import LockError, LockTimeout, RedisUnavailable, StaleFencingToken
from stock_locks.fencing import fenced_update
from tests.inventory.models import Item
from tests.support.lock_state import held as held_keys


def held(name: str, redis_client) -> bool:
    return bool(held_keys(redis_client, f"sl:lock:{{{name}}}"))


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
    with Lock("inventory.item:12", ttl=10):
        assert client.post("/items/12/restock/").status_code == 423
    assert client.post("/items/12/restock/").json() == {"restocked": 12}

    seen = []

    @lock_model(Item, kwarg="item")
    def reprice(item, price):
        seen.append(held("inventory.item:31", redis_client))

    reprice(Item(pk=31), 5)  # a model instance stands for its pk
    assert seen == [True]
    with pytest.raises(LockError, match="item"):

        @lock_model(Item, kwarg="item")
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


# -- class-based views: every usual Django way (issue 9) ------------------------------------


def _held_response(redis_client, name: str, **body) -> JsonResponse:
    return JsonResponse({**body, "held": held(name, redis_client)})


class DispatchByMethodDecorator(View):
    """``method_decorator`` on the class, naming ``dispatch``: the documented Django way."""

    redis = None

    def post(self, request, order_id):
        return _held_response(self.redis, f"order:{order_id}", order=order_id)


DispatchByMethodDecorator = method_decorator(
    locked("order:{order_id}", timeout=0), name="dispatch"
)(DispatchByMethodDecorator)


class PostByMethodDecorator(View):
    redis = None

    @method_decorator(locked("order:{order_id}", timeout=0))
    def post(self, request, order_id):
        return _held_response(self.redis, f"order:{order_id}", order=order_id)


class LockedDispatch(View):
    redis = None

    @locked("order:{order_id}", timeout=0)
    def dispatch(self, request, *args, **kwargs):
        return super().dispatch(request, *args, **kwargs)

    def get(self, request, order_id):
        return _held_response(self.redis, f"order:{order_id}", order=order_id)


class LockedGet(View):
    redis = None

    @locked("user:{request.user.pk}:{order_id}", timeout=0)
    def get(self, request, order_id):
        return _held_response(self.redis, f"user:None:{order_id}", order=order_id)


urlpatterns = [
    path("cbv/dispatch-method-decorator/<int:order_id>/", DispatchByMethodDecorator.as_view()),
    path("cbv/post-method-decorator/<int:order_id>/", PostByMethodDecorator.as_view()),
    path("cbv/locked-dispatch/<int:order_id>/", LockedDispatch.as_view()),
    path("cbv/locked-get/<int:order_id>/", LockedGet.as_view()),
]


@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    ("view", "method", "url", "lock"),
    [
        (DispatchByMethodDecorator, "post", "/cbv/dispatch-method-decorator/4/", "order:4"),
        (PostByMethodDecorator, "post", "/cbv/post-method-decorator/4/", "order:4"),
        (LockedDispatch, "get", "/cbv/locked-dispatch/4/", "order:4"),
        (LockedGet, "get", "/cbv/locked-get/4/", "user:None:4"),
    ],
    ids=["method_decorator-dispatch", "method_decorator-post", "locked-dispatch", "locked-get"],
)
def test_class_based_views_every_usual_way(client, redis_client, view, method, url, lock):
    view.redis = redis_client
    response = getattr(client, method)(url)
    assert response.status_code == 200, response.content
    assert response.json() == {"order": 4, "held": True}  # the body ran under the lock
    assert not held(lock, redis_client)  # and it was released
    with Lock(lock, ttl=10):
        busy = getattr(client, method)(url)
    assert busy.status_code == 423
    assert busy.json()["lock"] == lock


# -- a failed release never turns a finished body into an error -----------------------------


def steal(name: str, redis_client) -> None:
    """Ownership lost mid-body, staged as it happens: the lease runs out (the lock key
    goes) and another holder takes the lock."""
    redis_client.delete(f"sl:lock:{{{name}}}")
    assert Lock(name, ttl=30).acquire(timeout=0)


@pytest.fixture
def release_warnings(caplog):
    caplog.set_level(logging.WARNING, logger="stock_locks")

    def messages() -> list[str]:
        return [
            record.getMessage()
            for record in caplog.records
            if record.levelno == logging.WARNING and record.name.endswith(".release")
        ]

    return messages


def test_function_returns_its_result_when_the_lease_was_lost(redis_client, release_warnings):
    @locked("job:{job_id}", ttl=5)
    def run(job_id):
        steal(f"job:{job_id}", redis_client)
        return "done"

    assert run(1) == "done"
    [warning] = release_warnings()
    assert "'job:1'" in warning and "LockNotOwned" in warning and "returned" in warning


@pytest.mark.urls(__name__)
def test_view_answers_its_body_when_the_lease_was_lost(rf, redis_client, release_warnings):
    @locked("order:{order_id}", timeout=0)
    def pay(request, order_id):
        steal(f"order:{order_id}", redis_client)
        return JsonResponse({"paid": order_id})

    response = pay(rf.post("/"), order_id=3)
    assert response.status_code == 200 and json.loads(response.content) == {"paid": 3}
    assert ["'order:3'" in w for w in release_warnings()] == [True]


def test_celery_task_succeeds_when_the_release_fails(redis_client, release_warnings):
    app = Celery("decorator-test", set_as_current=False)
    runs = []

    @app.task(name="tests.charge", bind=True)
    @locked("charge:{charge_id}", timeout=0)
    def charge(self, charge_id):
        runs.append(charge_id)
        steal(f"charge:{charge_id}", redis_client)
        return "charged"

    result = charge.apply(args=(8,))
    assert result.successful() and result.get() == "charged"  # no retry of done work
    assert runs == [8]
    assert any("'charge:8'" in w for w in release_warnings())


def test_redis_down_at_release_keeps_the_result_and_the_body_error_wins(
    redis_factory, use_redis, release_warnings
):
    server = redis_factory()
    use_redis(server)

    @locked("job:{job_id}", ttl=5)
    def run(job_id, fail=False):
        server.kill()  # the release that follows cannot reach Redis
        if fail:
            raise ValueError("the body's own error")
        return "done"

    assert run(1) == "done"
    assert any("'job:1'" in w and "returned" in w for w in release_warnings())

    server.restart()
    with pytest.raises(ValueError, match="the body's own error"):
        run(2, fail=True)
    assert any("'job:2'" in w and "raised" in w for w in release_warnings())


def test_body_error_wins_over_a_lost_lease(redis_client):
    @locked("job:{job_id}", ttl=5)
    def run(job_id):
        steal(f"job:{job_id}", redis_client)
        raise KeyError("body")

    with pytest.raises(KeyError, match="body"):
        run(1)


def test_limit_concurrency_keeps_the_result_when_the_permit_release_fails(
    redis_factory, use_redis, release_warnings
):
    server = redis_factory()
    use_redis(server)

    @limit_concurrency("exports", 2, timeout=0)
    def export():
        server.kill()
        return "exported"

    assert export() == "exported"
    assert any("'exports'" in w for w in release_warnings())


# -- a stale fence escaping a view is a 409, not a 500 --------------------------------------


@pytest.mark.django_db
def test_stale_fencing_token_in_a_locked_view_is_409_and_the_lock_is_released(rf, redis_client):
    item = Item.objects.create(code="TEA", title="Tea", on_hand=5, fence=10**15)

    @locked("item:{pk}", timeout=0)
    def restock(request, pk):
        fenced_update(Item.objects.filter(pk=pk), 1, on_hand=100)  # older than the row's
        return JsonResponse({"restocked": pk})

    response = restock(rf.post("/"), pk=item.pk)
    assert response.status_code == 409
    body = json.loads(response.content)
    assert body["error"] == "stale_fence" and body["lock"] == f"item:{item.pk}"
    assert (body["fence"], body["current"]) == (1, 10**15)
    assert "nothing was written" in body["message"]
    assert Item.objects.get().on_hand == 5
    assert not held(f"item:{item.pk}", redis_client)

    @locked("item:{pk}", timeout=0)
    def restock_task(pk):
        fenced_update(Item.objects.filter(pk=pk), 1, on_hand=100)

    with pytest.raises(StaleFencingToken):  # not a view: the caller decides
        restock_task(item.pk)
    assert not held(f"item:{item.pk}", redis_client)
