"""The test project's settings with one deliberate change, for subprocess tests.

A subprocess cannot be handed ``override_settings``, so a test that needs ``manage.py`` to
start with a broken or unusual configuration sets ``DJANGO_SETTINGS_MODULE`` to this module
and ``DTP_SETTINGS_VARIANT`` to one of the names below.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS, TASKS

VARIANT = os.environ.get("DTP_SETTINGS_VARIANT", "")

if VARIANT == "without-app":
    # The mistake of a new user: the backend is configured, the app is not installed.
    INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_tasks_plus"]
elif VARIANT == "without-app-tasks-at-startup":
    # The same, in a project whose own app imports its task module at startup.
    INSTALLED_APPS = [
        "tests.settings_variants.ExampleImportingTasks" if app == "example" else app
        for app in INSTALLED_APPS
        if app != "django_tasks_plus"
    ]
elif VARIANT == "options-typo":
    TASKS = {"default": {**TASKS["default"], "OPTIONS": {"CONCURENCY": 4}}}
    # As in a project whose task modules are imported on first use: the backend is then
    # created by the command (or its system checks), not by django.setup().
    EXTRA_TASK_MODULES: list[str] = []
elif VARIANT == "any-queue":
    # Django's meaning of an empty QUEUES: tasks may name any queue.
    TASKS = {"default": {**TASKS["default"], "QUEUES": []}}
elif VARIANT == "middleware":
    # Backend-wide execution middleware (tests/test_middleware.py), outermost first.
    TASKS = {
        "default": {
            **TASKS["default"],
            "OPTIONS": {
                **TASKS["default"]["OPTIONS"],
                "MIDDLEWARE": [
                    "tests.middlewares.backend_outer",
                    "tests.middlewares.backend_inner",
                ],
            },
        }
    }
elif VARIANT == "fast-metrics":
    # The metrics flusher's first round within a second of the start, not ten.
    TASKS = {
        "default": {
            **TASKS["default"],
            "OPTIONS": {
                **TASKS["default"]["OPTIONS"],
                "METRICS": {**TASKS["default"]["OPTIONS"]["METRICS"], "FLUSH_INTERVAL": 0.5},
            },
        }
    }
elif VARIANT == "pool-of-two":
    # Django's connection pool, at most two sessions, none kept idle beyond the first:
    # the task threads of a worker share what the pool holds (tests/test_connections.py).
    DATABASES["default"]["OPTIONS"] = {  # noqa: F405
        **DATABASES["default"].get("OPTIONS", {}),  # noqa: F405
        "pool": {"min_size": 1, "max_size": 2, "timeout": 20},
    }
elif VARIANT == "east-of-utc":
    # A project far east of UTC: 9999-12-31 23:59 UTC is already year 10000 locally.
    TIME_ZONE = "Pacific/Kiritimati"
elif VARIANT == "schedules":
    # A schedule declared in settings, synced by the leader (tests/test_schedule_workers.py).
    _options = {
        **TASKS["default"].get("OPTIONS", {}),
        "SCHEDULES": {
            "from-settings": {"task": "tests.tasks.add", "every": 1, "args": [5, 5]},
        },
    }
    TASKS = {"default": {**TASKS["default"], "OPTIONS": _options}}
elif VARIANT:
    raise ImproperlyConfigured(f"Unknown DTP_SETTINGS_VARIANT {VARIANT!r}.")


if VARIANT == "without-app-tasks-at-startup":
    from example.apps import ExampleConfig

    class ExampleImportingTasks(ExampleConfig):
        """The example app, importing its tasks in ``ready()`` as many projects do."""

        def ready(self) -> None:
            from example import tasks  # noqa: F401
