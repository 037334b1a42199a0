"""The schedules feature plugged into the app: its events, counters, service and check.

``install()`` is called once by ``AppConfig.ready``; the engine never imports this
package (tests/test_architecture.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from .. import events, extensions
from ..discovery import TaskModuleError, discover_task_modules
from ..metrics import register_counter
from .declared import problems
from .service import scheduler_factory
from .store import EVENT_NAMES, SCHEDULE_FIRED, SCHEDULE_MISSED, SCHEDULE_SKIPPED

SCHEDULE_CHECK_ID = "django_tasks_plus.E020"


def schedules_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every declared schedule's problem (bad cron, unknown time zone or task path),
    each naming its schedule."""
    from ..backend import DatabaseBackend
    from ..compat import task_backends

    found: list[checks.CheckMessage] = []
    for alias in getattr(settings, "TASKS", {}):
        try:
            backend = task_backends[alias]
        except Exception:  # a broken entry: the backends' own check reports it
            continue
        if not isinstance(backend, DatabaseBackend):
            continue
        try:
            discover_task_modules(backend.settings)
        except TaskModuleError:
            continue  # reported by the app's own check
        found += [
            checks.Error(str(problem), obj=f"TASKS[{alias!r}]", id=SCHEDULE_CHECK_ID)
            for problem in problems(backend.settings)
        ]
    return found


def install() -> None:
    events.register_names(*EVENT_NAMES, builtin=True)
    register_counter(
        "schedule_fires",
        SCHEDULE_FIRED,
        help="Schedule occurrences enqueued.",
        labels=("schedule",),
        builtin=True,
    )
    register_counter(
        "schedule_skips",
        SCHEDULE_SKIPPED,
        help="Schedule occurrences skipped (overlap, a task that cannot be enqueued).",
        labels=("schedule",),
        builtin=True,
    )
    register_counter(
        "schedule_misses",
        SCHEDULE_MISSED,
        help="Schedule occurrences missed while no scheduler ran (catch-up policy).",
        labels=("schedule",),
        builtin=True,
    )
    extensions.service_factories.register(scheduler_factory, builtin=True)
    checks.register(schedules_check)
