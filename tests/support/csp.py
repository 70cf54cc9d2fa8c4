"""A strict Content-Security-Policy for tests (Django 5.2 has no CSP middleware).

The policy is what a project gets from Django 6's CSP support with the usual
"self only" settings: scripts and styles from the site's own files, nothing
inline (no ``<script>`` body, ``<style>``, ``style=`` or ``on*=`` attribute).
Enable it for one live server or client with ``override_settings`` on
``MIDDLEWARE`` (``with_strict_csp(settings.MIDDLEWARE)``).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

POLICY = "default-src 'self'; script-src 'self'; style-src 'self'"
MIDDLEWARE = "tests.support.csp.StrictContentSecurityPolicy"


class StrictContentSecurityPolicy:
    """Adds ``Content-Security-Policy: POLICY`` to every response that has none."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", POLICY)
        return response


def with_strict_csp(middleware: list[str]) -> list[str]:
    """``middleware`` with the strict policy added (outermost, so every response has it)."""
    return [MIDDLEWARE, *middleware]
