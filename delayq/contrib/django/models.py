"""``Dashboard``: no table (unmanaged), only the Django admin's link to the delayq dashboard
and the permission that shows it (``delayq.view_dashboard``). ``OutboxTask``: the table
``delayq_outbox``, tasks written in their transaction until relayed (``outbox.py``)."""

from __future__ import annotations

from datetime import datetime

from django.db import models


class Dashboard(models.Model):
    """The admin's entry "delayq > Dashboard"; never stored (``managed = False``)."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"


class OutboxTask(models.Model):
    """A task written with ``schedule_on_commit(..., outbox=True)``, not yet in Redis."""

    # (annotated for mypy, which runs without django-stubs' plugin)
    task_id: models.CharField[str, str] = models.CharField(max_length=256, primary_key=True)
    queue: models.CharField[str, str] = models.CharField(max_length=100)
    kind: models.CharField[str, str] = models.CharField(max_length=200)
    payload = models.JSONField(null=True)
    due_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(
        null=True
    )  # None: at once
    max_attempts: models.IntegerField[int, int] = models.IntegerField(default=0)
    headers = models.JSONField(null=True)
    created_at: models.DateTimeField[datetime, datetime] = models.DateTimeField(
        auto_now_add=True, db_index=True
    )

    class Meta:
        db_table = "delayq_outbox"
        default_permissions = ()
