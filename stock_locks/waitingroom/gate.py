"""The visitor's side: a view decorator in front of the sale's views, and the JSON
status endpoint.

``@waiting_room("kettle-sale")`` on a view (the product page, the order POST):

- a request carrying a valid admission pass (the cookie ``<prefix><slug>``, or the
  header ``WAITING_ROOM_PASS_HEADER`` for API clients) goes straight through, with
  no Redis round trip while the pass is younger than the room's pass refresh and of
  the room state this process knows, and one (the pass renewed) otherwise;
- any other request joins the queue, or finds its place, in one round trip. An
  admitted one gets a pass and goes through; the others get the waiting page
  (server-rendered, refreshing itself with ``<meta http-equiv="refresh">``, no
  inline script or style) or, for a client asking for JSON, a 429 with
  ``Retry-After`` and its position (409 once the sale's SKUs are sold out);
- Redis unavailable: 503 with ``Retry-After`` and a message; the view does not run.

A visitor is its user (``user:<pk>``) when authenticated, else its session
(``guest:<id>``, a random id kept in the session, made on its first visit). The lane is
``lane(request)`` when given, else the first lane for authenticated users and
the last for guests.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import secrets
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

from ..conf import settings
from ..exceptions import BackendUnavailable, InvalidPass
from .events import room_for
from .passes import check_pass, issue_pass
from .queue import Status, WaitingRoom

LaneOf = Callable[[HttpRequest], "str | None"]
TEMPLATE = "stock_locks/waitingroom/waiting.html"
SESSION_FIELD = "stock_locks.waitingroom"  # the session's binding (visitor_of)


def visitor_of(request: HttpRequest) -> tuple[str, str]:
    """(visitor id, session binding) of ``request``.

    The binding is a random id kept in the visitor's session (made on its first
    visit): passes are bound to it. It survives a login (Django changes the session
    key then, and keeps the data), so a guest admitted who logs in to pay keeps its
    pass; a logout (the session flushed) ends it. Raises ImproperlyConfigured without
    Django's session middleware."""
    session = getattr(request, "session", None)
    if session is None:
        raise ImproperlyConfigured("the waiting room needs SessionMiddleware")
    binding = session.get(SESSION_FIELD)
    if not isinstance(binding, str) or not binding:
        binding = session[SESSION_FIELD] = secrets.token_urlsafe(16)
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}", binding
    return f"guest:{binding}", binding


def default_lane(room: WaitingRoom, request: HttpRequest) -> str:
    """Members (authenticated users) in the first lane, guests in the last."""
    user = getattr(request, "user", None)
    lanes = room.spec.lanes
    return lanes[0] if user is not None and user.is_authenticated else lanes[-1]


def cookie_name(event: str) -> str:
    return f"{settings.WAITING_ROOM_COOKIE_PREFIX}{event}"


def presented_pass(request: HttpRequest, event: str) -> str | None:
    """The pass ``request`` carries for ``event`` (the header first, then the cookie)."""
    return request.headers.get(settings.WAITING_ROOM_PASS_HEADER) or request.COOKIES.get(
        cookie_name(event)
    )


def admitted_pass(request: HttpRequest, room: WaitingRoom, binding: str) -> str | None:
    """The pass to answer with when ``request`` is admitted by the one it carries: the
    same (still fresh), a renewed one, or None (none, refused, or its slot is gone).
    Blocking only to renew: raises :class:`~stock_locks.exceptions.RedisUnavailable`."""
    slug = room.spec.slug
    token = presented_pass(request, slug)
    if not token:
        return None
    try:
        admission = check_pass(token, slug, binding, room.spec.session_ttl)
    except InvalidPass:
        return None
    if admission.age() < room.pass_refresh() and admission.born == room.known_born():
        return token
    if room.touch(admission.ticket, admission.born):
        return issue_pass(slug, binding, admission.ticket, admission.born)
    return None


def waiting_room(event: str, *, lane: LaneOf | None = None) -> Callable[[Any], Any]:
    """Put the view behind the waiting room of the event with slug ``event`` (see the
    module's docstring for what it answers). ``lane``: picks a visitor's lane by name.
    Sync and async views; the event is read when a request comes. For an async view
    the room's step runs in Django's thread for sync code (``sync_to_async``: it
    reads the session and may block on Redis)."""

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(view):

            @functools.wraps(view)
            async def aguarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                room, token, refusal = await sync_to_async(gate)(request, event, lane)
                if refusal is not None:
                    return refusal
                response = await view(request, *args, **kwargs)
                return response if token is None else with_pass(response, room, token)

            return aguarded

        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            room, token, refusal = gate(request, event, lane)
            if refusal is not None:
                return refusal
            response = view(request, *args, **kwargs)
            return response if token is None else with_pass(response, room, token)

        return guarded

    return decorate


def gate(
    request: HttpRequest, event: str, lane: LaneOf | None
) -> tuple[WaitingRoom, str | None, HttpResponse | None]:
    """(room, the pass to answer with, the answer instead of the view): the view runs
    when the third is None (with the pass, or a room that is off: no pass)."""
    room = room_for(event)
    if not room.spec.enabled:
        return room, None, None
    try:
        visitor, binding = visitor_of(request)
        token = admitted_pass(request, room, binding)
        if token is not None:
            return room, token, None
        chosen = lane(request) if lane else default_lane(room, request)
        status = room.visit(visitor, lane=chosen)
    except BackendUnavailable as exc:
        return room, None, unavailable_response(event, exc)
    if status.state == "admitted":
        return room, issue_pass(event, binding, status.ticket, status.born), None
    return room, None, waiting_response(request, room, status)


def with_pass(response: HttpResponse, room: WaitingRoom, token: str) -> HttpResponse:
    """``response`` carrying ``token`` (cookie and header), valid for the session's life."""
    response.set_cookie(
        cookie_name(room.spec.slug), token, max_age=int(room.spec.session_ttl),
        httponly=True, samesite="Lax", secure=settings_secure(),
    )  # fmt: skip
    response[settings.WAITING_ROOM_PASS_HEADER] = token
    return response


def settings_secure() -> bool:
    return bool(getattr(django_settings, "SESSION_COOKIE_SECURE", False))


def wants_json(request: HttpRequest) -> bool:
    accept = request.headers.get("Accept", "")
    return "application/json" in accept or not request.accepts("text/html")


def status_body(room: WaitingRoom, status: Status) -> dict[str, Any]:
    """The JSON a visitor is told about its place."""
    return {
        "event": room.spec.slug,
        "state": status.state,
        "ticket": status.ticket or None,
        "position": None if status.ahead is None else status.ahead + 1,
        "ahead": status.ahead,
        "eta_seconds": None if status.eta is None else math.ceil(status.eta),
        "poll_after": math.ceil(status.poll_after),
        "prequeue": status.prequeue,
        "starts_in": math.ceil(status.starts_in) if status.starts_in else 0,
    }


def waiting_response(request: HttpRequest, room: WaitingRoom, status: Status) -> HttpResponse:
    """The waiting page, or for an API client a 429 (409 when sold out) with the JSON."""
    retry = str(math.ceil(status.poll_after))
    headers = {"Retry-After": retry, "Cache-Control": "no-store"}
    body = status_body(room, status)
    if wants_json(request):
        code = 409 if status.state == "sold_out" else 429
        return JsonResponse(body, status=code, headers=headers)
    html = render_to_string(TEMPLATE, {**body, "refresh": retry}, request=request)
    return HttpResponse(html, headers=headers)


def unavailable_response(event: str, exc: BaseException) -> HttpResponse:
    """503 with ``Retry-After``: the waiting room cannot reach Redis; nothing ran."""
    return JsonResponse(
        {
            "error": "unavailable",
            "event": event,
            "message": "the waiting room is unavailable, try again shortly",
        },
        status=settings.REDIS_UNAVAILABLE_STATUS,
        headers={"Retry-After": "2", "Cache-Control": "no-store"},
    )


def status_view(request: HttpRequest, event: str) -> HttpResponse:
    """JSON: the visitor's place in the room of ``event``, or its admission (with a
    pass, as a cookie and in the body); state ``unknown`` when it has no place (a
    GET does not join: a visitor joins at a view behind :func:`waiting_room`). A
    poll keeps the place and runs an admission step. 404 for an unknown or
    disabled event, 503 when Redis is unavailable."""
    try:
        room = room_for(event)
    except LookupError:
        raise Http404(f"no waiting room {event!r}") from None
    if not room.spec.enabled:
        raise Http404(f"the waiting room {event!r} is off")
    try:
        visitor, binding = visitor_of(request)
        token = admitted_pass(request, room, binding)
        if token is not None:
            return with_pass(JsonResponse({"event": event, "state": "admitted", "pass": token}),
                             room, token)  # fmt: skip
        status = room.visit(visitor, lane=default_lane(room, request), join=False)
    except BackendUnavailable as exc:
        return unavailable_response(event, exc)
    body = status_body(room, status)
    if status.state == "admitted":
        token = issue_pass(event, binding, status.ticket, status.born)
        return with_pass(JsonResponse({**body, "pass": token}), room, token)
    return JsonResponse(body, headers={"Retry-After": str(body["poll_after"])})


def release_admission(request: HttpRequest, event: str, response: HttpResponse) -> bool:
    """The visitor of ``request`` is done (its order is paid): its slot is freed at once
    and the pass is deleted from ``response``. Whether it held a slot or a place.
    Blocking: one round trip; raises
    :class:`~stock_locks.exceptions.RedisUnavailable`."""
    room = room_for(event)
    visitor, binding = visitor_of(request)
    response.delete_cookie(cookie_name(event))
    token = presented_pass(request, event)
    ticket = None
    if token:
        with contextlib.suppress(InvalidPass):  # (then by the visitor id alone)
            ticket = check_pass(token, event, binding, room.spec.session_ttl).ticket
    return room.leave(visitor, ticket=ticket)
