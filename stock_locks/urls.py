"""``path("stock-locks/", include("stock_locks.urls"))``: the metrics scrape endpoint, and
each waiting room's JSON status (``waiting-room/<slug>/``)."""

from django.urls import path

from . import views

app_name = "stock_locks"
urlpatterns = [
    path("metrics", views.metrics_view, name="metrics"),
    path("waiting-room/<slug:event>/", views.waiting_room_status, name="waiting_room_status"),
]
