"""Views a project includes with ``path("stock-locks/", include("stock_locks.urls"))``."""

from __future__ import annotations

import hmac

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from . import metrics
from .conf import settings


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus scrape endpoint, for monitoring systems (no admin session).

    404 while ``METRICS_TOKEN`` is unset; 401 unless the request carries
    ``Authorization: Bearer <METRICS_TOKEN>`` (compared in constant time).
    """
    token = settings.METRICS_TOKEN
    if not token:
        raise Http404("the metrics endpoint is disabled (STOCK_LOCKS['METRICS_TOKEN'] is unset)")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("a valid bearer token is required\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="stock_locks metrics"'
        return response
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)
