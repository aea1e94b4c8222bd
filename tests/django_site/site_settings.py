"""A small Django site for delayq.contrib.django's tests: PostgreSQL as ``default``, a SQLite
``other`` for ``using=``, and two apps whose tasks modules the tests discover."""

from __future__ import annotations

import os

SECRET_KEY = "tests-only"
USE_TZ = True
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "site_urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "delayq.contrib.django",
    "shop",
    "jobs_app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("SITE_DATABASE", "delayq_site"),
        "HOST": os.environ.get("ORDERS_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("ORDERS_DB_PORT", "5432"),
        "USER": os.environ.get("ORDERS_DB_USER", "postgres"),
        "TEST": {"NAME": f"test_delayq_site_{os.getpid()}"},
    },
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
# Replaced by the tests' fixture with their private server's URL; nothing listens here.
DELAYQ = {
    "URL": os.environ.get("DELAYQ_REDIS_URL", "redis://127.0.0.1:9/0"),
    "QUEUES": {"default": {}, "emails": {}},
    "OUTBOX": True,
}
