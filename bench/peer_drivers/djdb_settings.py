"""Minimal Django settings for the django-tasks-db peer (its venv, its own database).

Only what django-tasks-db's README asks for: the app installed and its ``DatabaseBackend``
as the default task backend, with the backend's default options. DEBUG stays off, as in
our own bench, so Django does not keep every query in memory.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from urllib.parse import urlsplit

_dsn = urlsplit(os.environ["PEER_DSN"])

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django 5.2 on Python 3.11 has no django.tasks: the django-tasks backport provides it.
INSTALLED_APPS = [*([] if find_spec("django.tasks") else ["django_tasks"]), "django_tasks_db"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.path.lstrip("/"),
        "USER": _dsn.username or "",
        "HOST": _dsn.hostname or "",
        "PORT": str(_dsn.port or 5432),
    }
}

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
