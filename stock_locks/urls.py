"""``path("stock-locks/", include("stock_locks.urls"))``: the metrics scrape endpoint."""

from django.urls import path

from . import views

app_name = "stock_locks"
urlpatterns = [path("metrics", views.metrics_view, name="metrics")]
