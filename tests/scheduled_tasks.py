"""Tasks with schedules declared in code, for tests/test_schedules.py.

Declaring them registers them as the app's code schedules, and this module is imported
when the suite is collected: every worker the test process runs in a thread (not only
test_schedules') would then sync and fire them, and a test counting its own claims or
tasks would see theirs (``refresh`` is due every 30 s). So they leave the registry at
once (``TEST_SCHEDULES``), and test_schedules puts them back only while its tests run."""

from __future__ import annotations

from django_tasks_plus import definition, task
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


TEST_SCHEDULES = {
    key: definition._scheduled.pop(key)
    for key in [(task.backend, task.module_path) for task in (every_five_minutes, refresh)]
}
