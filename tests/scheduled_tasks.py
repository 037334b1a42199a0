"""Tasks with schedules declared in code, imported by the test process only (never by a
worker: the workers of other tests must not fire them). tests/test_schedules.py."""

from __future__ import annotations

from django_tasks_plus import task
from django_tasks_plus.schedules import Every, Scheduled


@task(schedule="*/5 * * * *")
def every_five_minutes() -> None:
    pass


@task(
    schedules=[
        Every(seconds=30),
        Scheduled(
            "0 3 * * *", name="nightly-full", kwargs={"full": True}, timezone="Europe/Berlin"
        ),
    ]
)
def refresh(full: bool = False) -> bool:
    return full
