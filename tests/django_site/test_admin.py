"""The admin's link to the dashboard: shown to staff with delayq.view_dashboard, a redirect
that carries no token (the dashboard asks for its own)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

pytestmark = pytest.mark.django_db

LINK = "/admin/delayq/dashboard/"


def test_the_link_redirects_to_the_dashboard_without_its_token(
    admin_client: Client, settings: Any
) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "DASHBOARD_URL": "https://dq.internal/"}
    index = admin_client.get("/admin/").content.decode()
    assert LINK in index and "Dashboard" in index
    r = admin_client.get(LINK)
    assert r.status_code == 302 and r["Location"] == "https://dq.internal/"
    assert "token" not in r["Location"]
    assert admin_client.get("/admin/delayq/dashboard/add/").status_code == 403


def test_without_a_dashboard_url_the_admin_says_what_to_set(admin_client: Client) -> None:
    r = admin_client.get(LINK, follow=True)
    assert r.redirect_chain[-1][0] == "/admin/"
    assert "DASHBOARD_URL" in r.content.decode()


def test_staff_without_the_permission_get_no_link(client: Client, settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "DASHBOARD_URL": "https://dq.internal/"}
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert LINK not in client.get("/admin/").content.decode()
    assert client.get(LINK).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_dashboard"))
    staff = User.objects.get(pk=staff.pk)  # the permission cache
    client.force_login(staff)
    assert client.get(LINK)["Location"] == "https://dq.internal/"
