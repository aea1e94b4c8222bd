"""site_settings with USE_TZ = False (Django's default before 5.0), and with $SITE_SQLITE
SQLite as ``default`` (that file), the backend that refuses aware datetimes then: the
outbox's datetimes, naive (test_outbox.py runs manage.py with it)."""

from __future__ import annotations

import os

from site_settings import *  # noqa: F403

USE_TZ = False
if os.environ.get("SITE_SQLITE"):
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SITE_SQLITE"]},
    }
