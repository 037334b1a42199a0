"""A task whose schedule is invalid, imported only by the test that expects the system
check to name it (tests/test_schedules.py), which forgets it afterwards."""

from __future__ import annotations

from django_tasks_plus import task


@task(schedule="* * * *")  # four fields
def broken() -> None:
    pass
