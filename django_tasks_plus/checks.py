"""System checks of the app itself (the backends check their own entries: backend.py).

``manage.py check`` (and every command that runs the checks) imports each installed
app's ``tasks`` module for the django-tasks-plus backends that autodiscover, so a task
module that fails to import is reported there, naming it, instead of in the first worker
that needs it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from .discovery import TaskModuleError, discover_task_modules

TASK_MODULES_ID = "django_tasks_plus.E005"


def task_modules_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Import the task modules (once, for the first backend that autodiscovers)."""
    from .backend import DatabaseBackend
    from .compat import task_backends

    for alias in getattr(settings, "TASKS", {}):
        try:
            backend = task_backends[alias]
        except Exception:  # a broken entry: the backends' own check reports it
            continue
        if not isinstance(backend, DatabaseBackend):
            continue
        try:
            if discover_task_modules(backend.settings):
                return []
        except TaskModuleError as exc:
            return [checks.Error(str(exc), id=TASK_MODULES_ID)]
    return []


def register_checks() -> None:
    checks.register(task_modules_check)
