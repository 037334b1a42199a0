"""Finding the task modules without wiring: each installed app's ``tasks`` module.

A worker, ``manage.py check`` and the operator commands import them at start (unless the
backend sets ``OPTIONS["AUTODISCOVER"] = False``), so every task definition has run
before anything asks about it: the services its definition asks for reach the worker,
and a breaker's or a schedule's name is known to the command that looks it up. Modules
outside installed apps are still imported by the project (``AppConfig.ready()``, or the
test project's ``EXTRA_TASK_MODULES``), see docs/tasks.md#where-tasks-live.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from .conf import BackendSettings
from .exceptions import TasksPlusError

TASK_MODULE = "tasks"


class TaskModuleError(TasksPlusError, ImproperlyConfigured):
    """An installed app's ``tasks`` module raised when it was imported."""


def discover_task_modules(settings: BackendSettings) -> bool:
    """Import every installed app's ``tasks`` module when ``settings`` ask for it (the
    default); return whether it did. A module that raises is named in a
    ``TaskModuleError`` (an app without such a module is fine)."""
    if not settings.autodiscover:
        return False
    try:
        autodiscover_modules(TASK_MODULE)
    except Exception as exc:
        raise TaskModuleError(
            f"Importing the installed apps' {TASK_MODULE!r} modules for backend "
            f"{settings.alias!r} failed: {type(exc).__name__}: {exc} (set "
            f"TASKS[{settings.alias!r}]['OPTIONS']['AUTODISCOVER'] = False to import them "
            "yourself)."
        ) from exc
    return True
