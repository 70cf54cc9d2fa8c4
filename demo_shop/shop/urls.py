from django.urls import path

from . import views

app_name = "shop"

urlpatterns = [
    path("", views.shop_page, name="index"),
    path("api/products/", views.products, name="products"),
    path("api/orders/", views.create_order, name="create_order"),
    path("api/orders/<int:order_id>/", views.order_detail, name="order"),
    path("api/orders/<int:order_id>/pay/", views.pay, name="pay"),
    path("api/orders/<int:order_id>/cancel/", views.cancel, name="cancel"),
    path("api/sale/order/", views.sale_order, name="sale_order"),
]
