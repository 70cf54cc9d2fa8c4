"""Views used by the decorator tests (``pytest.mark.urls("tests.urls")``)."""

from django.http import JsonResponse
from django.urls import path
from django.views import View

from demo_shop.shop.models import Product
from stock_locks import lock_model, locked


@locked("order:{order_id}", timeout=0)
def pay_order(request, order_id):
    return JsonResponse({"paid": order_id})


class OrderView(View):
    @locked("order:{order_id}", timeout=0)
    def post(self, request, order_id):
        return JsonResponse({"updated": order_id})


@lock_model(Product, kwarg="pk", timeout=0)
def restock(request, pk):
    return JsonResponse({"restocked": pk})


@locked("user:{request.user.pk}", timeout=0)
async def async_profile(request):
    return JsonResponse({"user": request.user.pk})


urlpatterns = [
    path("orders/<int:order_id>/pay/", pay_order),
    path("orders/<int:order_id>/", OrderView.as_view()),
    path("products/<int:pk>/restock/", restock),
    path("me/", async_profile),
]
