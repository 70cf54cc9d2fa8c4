"""The stock_locks dashboard inside the Django admin, and the audit log.

The dashboard has no table: ``Dashboard`` is an unmanaged model that carries
its permissions, and its changelist is the dashboard page. URL names:
``admin:stock_locks_dashboard`` (the page), ``admin:stock_locks_dashboard_json``
(its JSON snapshot, for the page's refresh and for monitoring) and
``admin:stock_locks_dashboard_action`` (confirm, then POST, an operator action). The views are
:mod:`stock_locks.dashboard.views`.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path

from .dashboard import views
from .dashboard.views import VIEW_PERMISSION
from .models import AuditEntry, Dashboard, Event
from .waitingroom.spec import spec_of


class ReadOnly:
    """Nothing is added, changed or deleted through this admin."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Dashboard)
class DashboardAdmin(ReadOnly, admin.ModelAdmin):
    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.dashboard_view), name="stock_locks_dashboard"),
            path("", wrap(self.dashboard_view), name="stock_locks_dashboard_changelist"),
            path("json/", wrap(self.json_view), name="stock_locks_dashboard_json"),
            path(
                "actions/<str:action>/",
                wrap(self.action_view),
                name="stock_locks_dashboard_action",
            ),
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        return views.dashboard_view(self, request)

    def json_view(self, request: HttpRequest) -> HttpResponse:
        return views.json_view(self, request)

    def action_view(self, request: HttpRequest, action: str) -> HttpResponse:
        return views.action_view(self, request, action)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ("created_at", "username", "action", "target", "outcome")
    list_filter = ("action",)
    search_fields = ("username", "target", "outcome")
    readonly_fields = ("created_at", "user", "username", "action", "target", "displaced", "outcome")


class EventForm(forms.ModelForm):
    """An event's fields, checked as the waiting room will read them."""

    class Meta:
        model = Event
        fields = [
            "name", "slug", "enabled", "prequeue_opens", "start", "max_active",
            "admit_per_minute", "stock_factor", "lanes", "skus", "queue_ttl", "session_ttl",
        ]  # fmt: skip

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors:
            values = {name: data.get(name) for name in self._meta.fields or ()}
            try:
                spec_of(Event(**values))
            except (TypeError, ValueError) as exc:
                raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """Sale events behind a waiting room; a change reaches the web processes within
    ``WAITING_ROOM_EVENT_CACHE`` seconds."""

    form = EventForm

    list_display = ("name", "slug", "enabled", "start", "max_active", "admit_per_minute")
    list_filter = ("enabled",)
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
