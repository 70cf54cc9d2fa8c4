from django.contrib import admin
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("demo_shop.shop.urls")),
    # The waiting room's JSON status (waiting-room/<slug>/) and the metrics scrape.
    path("stock-locks/", include("stock_locks.urls")),
]
# The admin's CSS and the dashboard's script under gunicorn (the demo runs with
# DEBUG; a real deployment serves collectstatic's output from its web server).
urlpatterns += staticfiles_urlpatterns()
