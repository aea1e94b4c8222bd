"""The Django app ``delayq.contrib.django`` (label ``delayq``): the ``delayq_worker``
command, the system checks, and the admin's link to the dashboard."""

from __future__ import annotations

from django.apps import AppConfig


class DelayqConfig(AppConfig):
    name = "delayq.contrib.django"
    label = "delayq"
    verbose_name = "delayq"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from delayq.contrib.django import checks  # noqa: F401  (registers them)
