"""No tables: one unmanaged model, ``Dashboard``, whose only use is the Django admin's link to
the delayq dashboard and the permission that shows it (``delayq.view_dashboard``)."""

from __future__ import annotations

from django.db import models


class Dashboard(models.Model):
    """The admin's entry "delayq > Dashboard"; never stored (``managed = False``)."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
