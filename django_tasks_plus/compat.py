"""The one place that knows whether Django's Tasks framework is built in or backported.

Django 6.0+ ships ``django.tasks``; on Django 5.2 the ``django-tasks`` backport
(``django_tasks``) provides the same API. Everything else in this package imports the
framework's names from here, so supporting both costs one module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import django

# The type checker reads the names as Django 6's (django-stubs describe django.tasks); the
# backport mirrors that API.
if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks import task as django_task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started

    FRAMEWORK = "django.tasks"
else:  # pragma: no cover - exercised by the Django 5.2 CI run
    try:
        from django_tasks import (
            DEFAULT_TASK_BACKEND_ALIAS,
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
    except ImportError as exc:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "django-tasks-plus needs Django 6.0+ (django.tasks) or, on Django 5.2, the "
            "'django-tasks' backport: pip install 'django-tasks>=0.12'."
        ) from exc
    from django_tasks import checks as _register_checks  # noqa: F401
    from django_tasks import task as django_task
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

    FRAMEWORK = "django_tasks"

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "django_task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
