"""The suite's URLs: the admin (the dashboard), and views used by the decorator tests."""

import os

import redis
from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from django.views import View

from stock_locks import lock_model, locked
from stock_locks.waitingroom import release_admission, waiting_room
from tests.inventory.models import Item


@locked("order:{order_id}", timeout=0)
def pay_order(request, order_id):
    return JsonResponse({"paid": order_id})


class OrderView(View):
    @locked("order:{order_id}", timeout=0)
    def post(self, request, order_id):
        return JsonResponse({"updated": order_id})


@lock_model(Item, kwarg="pk", timeout=0)
def restock(request, pk):
    return JsonResponse({"restocked": pk})


@locked("whoami", timeout=5)
def _counted_acquire() -> None:
    pass


def whoami(request):
    """Which worker process answered, after one counted lock acquire (tests/test_metrics.py,
    under gunicorn). With ``?hold=<name>`` the worker then says it is busy (RPUSH
    ``<name>:busy``) and stays busy until the test pushes to ``<name>:go``, so that the next
    request must go to another worker."""
    _counted_acquire()
    hold = request.GET.get("hold")
    if hold:
        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        client.rpush(f"{hold}:busy", os.getpid())
        client.blpop([f"{hold}:go"], timeout=60)
    return JsonResponse({"pid": os.getpid()})


@locked("user:{request.user.pk}", timeout=0)
async def async_profile(request):
    return JsonResponse({"user": request.user.pk})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/<int:order_id>/pay/", pay_order),
    path("orders/<int:order_id>/", OrderView.as_view()),
    path("items/<int:pk>/restock/", restock),
    path("me/", async_profile),
    path("whoami/", whoami),
    path("asgi/", include("tests.asgi_views")),  # tests/test_aio_asgi.py (uvicorn)
    path("stock-locks/", include("stock_locks.urls")),
]


# tests/test_waitingroom.py: a sale's order view behind a waiting room, and the payment
# that frees the slot.
@waiting_room("kettles")
def sale_order(request):
    return JsonResponse({"ordered": True})


def sale_paid(request):
    response = JsonResponse({"released": True})
    release_admission(request, "kettles", response)
    return response


@waiting_room("kettles")
async def sale_order_async(request):
    return JsonResponse({"ordered": True, "async": True})


urlpatterns += [
    path("sale/order/", sale_order),
    path("sale/order-async/", sale_order_async),
    path("sale/paid/", sale_paid),
]
