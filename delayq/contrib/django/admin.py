"""The Django admin's link to the delayq dashboard: "delayq > Dashboard" on the admin's index,
for staff with the ``delayq.view_dashboard`` permission, redirects to
``settings.DELAYQ["DASHBOARD_URL"]`` (where ``delayq dashboard`` serves).

The link carries no token: the dashboard asks for its own, by its own rules (the link
``delayq dashboard`` printed, ``?token=``, sets its session cookie; or
``Authorization: Bearer``). Django's permission decides who sees the link, the dashboard's
token who gets in, and neither widens the other. docs/django.md says why this is a link and
not a page of the admin's own.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from delayq.contrib.django import conf
from delayq.contrib.django.models import Dashboard


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            return super().changelist_view(request, extra_context)  # Django's refusal
        url = conf.read().dashboard_url
        if url is None:
            messages.warning(
                request,
                "settings.DELAYQ['DASHBOARD_URL'] is not set: run `delayq dashboard` and set "
                "it to the address it serves on",
            )
            return HttpResponseRedirect(reverse("admin:index"))
        return HttpResponseRedirect(url)
