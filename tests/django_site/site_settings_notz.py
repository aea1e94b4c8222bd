"""site_settings with USE_TZ = False (Django's default before 5.0) and SQLite as ``default``
(a file named by $SITE_SQLITE): the outbox's datetimes, naive, on the backend that refuses
aware ones then (test_outbox.py runs manage.py with it)."""

from __future__ import annotations

import os

from site_settings import *  # noqa: F403

USE_TZ = False
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SITE_SQLITE"]},
}
