"""Settings of the example: PostgreSQL for the orders, delayq for their close.

Every value that differs between a laptop, CI and production comes from the environment:
``ORDERS_DATABASE`` (and ``ORDERS_DB_HOST``, ``ORDERS_DB_PORT``, ``ORDERS_DB_USER``),
``DELAYQ_REDIS_URL``, ``ORDERS_CLOSE_AFTER`` (seconds to pay, 900) and
``DELAYQ_DASHBOARD_URL``.
"""

from __future__ import annotations

import os

BASE = os.path.dirname(os.path.abspath(__file__))
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "delayq.contrib.django",  # manage.py delayq_worker, the checks, the admin's link
    "orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "orders_site.urls"
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
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("ORDERS_DATABASE", "django_orders"),
        "HOST": os.environ.get("ORDERS_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("ORDERS_DB_PORT", "5432"),
        "USER": os.environ.get("ORDERS_DB_USER", "postgres"),
        # A worker keeps its connections for a minute, and checks one before reusing it, so
        # a connection the database dropped between tasks is replaced, not used.
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        # The tests' database: one per test run, so runs side by side do not share one.
        "TEST": {"NAME": os.environ.get("ORDERS_TEST_DATABASE", f"test_orders_{os.getpid()}")},
    }
}

DELAYQ = {
    "URL": os.environ.get("DELAYQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "QUEUES": {"orders": {}},
    "DASHBOARD_URL": os.environ.get("DELAYQ_DASHBOARD_URL"),
}

ORDERS_CLOSE_AFTER = float(os.environ.get("ORDERS_CLOSE_AFTER", 15 * 60))
