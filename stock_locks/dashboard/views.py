"""The dashboard's admin views: the page, its JSON snapshot, and the confirm-then-POST
operator actions. ``stock_locks.admin`` routes to them (``DashboardAdmin.get_urls``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..backends.redis.errors import translated
from ..conf import settings
from ..exceptions import BackendUnavailable
from ..waitingroom.operator import room_row
from .actions import ACTIONS, dead_letter, perform, semaphore_holder, shown
from .snapshot import STOCK_ORDERS, lock_holder, snapshot, stock

VIEW_PERMISSION = "stock_locks.view_dashboard"
FORCE_PERMISSION = "stock_locks.force_release"
REFRESH_SECONDS = 3


def dashboard_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """The whole page rendered on the server (complete without JavaScript);
    its script (static/stock_locks/dashboard.js) then refreshes the tables
    from the JSON view. Nothing inline, so a strict Content-Security-Policy
    (``script-src 'self'; style-src 'self'``) lets it all run."""
    _require(request, VIEW_PERMISSION)
    query = _query(request)
    try:
        page_data = snapshot(query.search, query.page, query.window, query.order)
    except BackendUnavailable as exc:
        return _unavailable(f"{exc}. The dashboard reads Redis: reload it once Redis answers.")
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Locks, semaphores, delay queues and stock",
        "opts": model_admin.model._meta,
        "snapshot": page_data,
        "semaphore_holders": [
            {"semaphore": sem, "holder": holder}
            for sem in page_data["semaphores"]
            for holder in sem["holders"]
        ],
        "dead_letters": [
            {"queue": queue, "letter": letter}
            for queue in page_data["delay_queues"]
            for letter in queue["dead_letters"]
        ],
        "pager": _pager(query, page_data["locks"]),
        "search": query.search,
        "windows": [
            {"label": label, "query": query.link(window=label), "current": seconds == query.window}
            for label, seconds in WINDOWS.items()
        ],
        "stock_orders": {name: query.link(order=name) for name in STOCK_ORDERS},
        "order": page_data["stock"]["order"],
        "can_force": request.user.has_perm(FORCE_PERMISSION),
        "json_url": reverse("admin:stock_locks_dashboard_json"),
        "refresh_seconds": REFRESH_SECONDS,
        "refresh_ms": REFRESH_SECONDS * 1000,
        "window_minutes": query.window // 60,
    }
    return TemplateResponse(request, "admin/stock_locks/dashboard.html", context)


def json_view(model_admin: Any, request: HttpRequest) -> JsonResponse:
    _require(request, VIEW_PERMISSION)
    query = _query(request)
    try:
        return JsonResponse(snapshot(query.search, query.page, query.window, query.order))
    except BackendUnavailable as exc:
        return JsonResponse({"error": str(exc)}, status=settings.REDIS_UNAVAILABLE_STATUS)


def action_view(model_admin: Any, request: HttpRequest, action: str) -> HttpResponse:
    """GET: what the action would displace, and a confirm form. POST with
    confirm=yes (CSRF-checked by the admin): do it, audit it, go back. The backend
    unavailable: 503 (``REDIS_UNAVAILABLE_STATUS``) and a message."""
    _require(request, FORCE_PERMISSION)
    if action not in ACTIONS:
        raise Http404(f"no dashboard action {action!r}")
    source = request.POST if request.method == "POST" else request.GET
    params = {name: source.get(name, "") for name in ACTIONS[action][1]}
    confirmed = request.method == "POST" and request.POST.get("confirm") == "yes"
    try:
        if confirmed:
            if not all(params.values()):
                return HttpResponse("missing parameters", status=400)
            outcome = perform(action, params, request.user)
            level = messages.SUCCESS if outcome.done else messages.WARNING
            model_admin.message_user(request, outcome.message, level)
            return redirect("admin:stock_locks_dashboard")
        with translated():
            title, details, params = _describe(action, params)
    except BackendUnavailable as exc:
        done = "whether it ran is not known (audited)" if confirmed else "nothing done"
        return _unavailable(f"{exc}; {done}. The dashboard shows the state once it answers.")
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "action": action,
        "details": details,
        "params": params,
        "ready": details is not None,
    }
    return TemplateResponse(request, "admin/stock_locks/confirm.html", context)


def _unavailable(message: str) -> HttpResponse:
    return HttpResponse(
        message,
        status=settings.REDIS_UNAVAILABLE_STATUS,
        content_type="text/plain; charset=utf-8",
    )


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(permission):
        raise PermissionDenied


# The history the page offers: ?window=<label>.
WINDOWS = {"5m": 300, "15m": 900, "1h": 3600}
DEFAULT_WINDOW = "5m"


@dataclass(frozen=True)
class _Query:
    """What the page's query string asks for: the held locks' search and page, the
    history window (seconds) and the stock table's order. Anything malformed falls
    back to its default."""

    search: str = ""
    page: int = 1
    window_label: str = DEFAULT_WINDOW
    order: str = "drift"

    @property
    def window(self) -> int:
        return WINDOWS[self.window_label]

    def link(self, **changes: Any) -> str:
        """This query string with ``changes`` (``page``, ``window``, ``order``); other
        values left out where they are the default. The page's script builds the same."""
        values = {"q": self.search, "page": self.page, "window": self.window_label,
                  "order": self.order, **changes}  # fmt: skip
        defaults = {"q": "", "page": 1, "window": DEFAULT_WINDOW, "order": "drift"}
        return urlencode({k: v for k, v in values.items() if k in changes or v != defaults[k]})


def _query(request: HttpRequest) -> _Query:
    try:
        page = max(1, int(request.GET.get("page", 1)))
    except ValueError:
        page = 1
    window = request.GET.get("window", DEFAULT_WINDOW)
    order = request.GET.get("order", "drift")
    return _Query(
        search=request.GET.get("q", "").strip()[:200],
        page=page,
        window_label=window if window in WINDOWS else DEFAULT_WINDOW,
        order=order if order in STOCK_ORDERS else "drift",
    )


def _pager(query: _Query, locks: dict[str, Any]) -> dict[str, Any] | None:
    """Page N of M of the held locks, with the previous and next pages' query
    strings (None for one page). The page's script builds the same."""
    pages = max(1, math.ceil(locks["total"] / locks["page_size"]))
    page = locks["page"]
    if pages == 1 and page == 1:
        return None
    return {
        "page": page,
        "pages": pages,
        "previous": query.link(page=min(page - 1, pages)) if page > 1 else None,
        "next": query.link(page=page + 1) if page < pages else None,
    }


def _describe(action: str, params: dict[str, str]) -> tuple[str, dict | None, dict]:
    """The confirm page's title, what will be displaced (None: nothing to act on)."""
    if action == "release_lock":
        holder = lock_holder(params["name"]) if params["name"] else None
        if holder is not None:
            params = {**params, "token": holder["token"]}
        return f"Force-release lock {params['name']!r}?", shown(holder), params
    if action == "evict_holder":
        holder = semaphore_holder(params["name"], params["holder"])
        return f"Evict a holder of semaphore {params['name']!r}?", holder, params
    if action in ("requeue", "discard"):
        letter = dead_letter(params["queue"], params["id"])
        verb = "Requeue" if action == "requeue" else "Discard"
        return f"{verb} dead letter {params['id']!r} of queue {params['queue']!r}?", letter, params
    if action == "clear_room":
        room = room_row(params["event"]) if params["event"] else None
        return (
            f"Clear the waiting room of event {params['event']!r}: forget every place and "
            "admission slot? Web processes that saw it hold admission for one pass refresh.",
            room,
            params,
        )
    drifting = {row["sku"]: row["drift"] for row in stock()["rows"] if row["drift"]}
    return "Reconcile stock: set Redis from the database?", {"drifting SKUs": drifting}, params
