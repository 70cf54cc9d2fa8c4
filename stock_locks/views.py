"""Views a project includes with ``path("stock-locks/", include("stock_locks.urls"))``."""

from __future__ import annotations

import hmac

from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from . import metrics
from .conf import settings
from .dashboard.snapshot import deployment_figures
from .dashboard.summary import prometheus_gauges
from .exceptions import BackendUnavailable
from .waitingroom.gate import status_view
from .waitingroom.operator import prometheus_gauges as room_gauges
from .waitingroom.operator import room_rows


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
    return HttpResponse(body + _deployment_gauges(), content_type=content_type)


def _deployment_gauges() -> bytes:
    """The dashboard's summary as gauges (held locks, semaphores, delay queues, drift,
    heartbeats); a comment instead when Redis or the database cannot answer, so the
    process's own counters are still scraped."""
    try:
        figures, processes = deployment_figures()
    except (BackendUnavailable, DatabaseError) as exc:
        return f"# stock_locks deployment gauges unavailable: {type(exc).__name__}\n".encode()
    return prometheus_gauges(figures, processes).encode() + _waiting_room_gauges()


def _waiting_room_gauges() -> bytes:
    """The waiting rooms' figures per event (none without events; a comment when Redis
    or the database cannot answer)."""
    try:
        rows = room_rows()
    except (BackendUnavailable, DatabaseError) as exc:
        return f"# stock_locks waiting-room gauges unavailable: {type(exc).__name__}\n".encode()
    return room_gauges(rows).encode() if rows else b""


# GET: a visitor's place in a waiting room, as JSON (stock_locks.waitingroom.gate).
waiting_room_status = require_GET(status_view)
