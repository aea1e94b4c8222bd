from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path

import delayq.contrib.django as dq


async def task_state(request: HttpRequest, task_id: str) -> HttpResponse:
    """An async view using aqueue() (test_settings: under WSGI, a new loop per request)."""
    info = await dq.aqueue().get(task_id)
    return HttpResponse(info.state if info is not None else "none")


urlpatterns = [path("admin/", admin.site.urls), path("task/<str:task_id>", task_state)]
