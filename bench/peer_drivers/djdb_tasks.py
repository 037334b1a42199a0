"""Tasks for the django-tasks-db peer, declared with the Django Tasks ``@task`` decorator."""

from __future__ import annotations

import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    """The no-op task of the drain, as our ``example.tasks.add``."""
    return a + b


@task
def stamp(sent: float) -> float:
    """Return when the body started; the backend stores it as the task's return value."""
    return time.time()
