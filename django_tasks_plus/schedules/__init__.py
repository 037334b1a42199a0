"""Schedules: tasks that run by themselves, on a cron expression or a fixed interval.

Declare them with ``@task(schedule=…)`` / ``schedules=[…]`` or ``OPTIONS["SCHEDULES"]``,
or create them at runtime (``schedules.api``); the leader's scheduler (``service.py``)
enqueues each occurrence exactly once. See docs/schedules.md.
"""

from .declared import Scheduled
from .errors import (
    InvalidSchedule,
    ScheduleError,
    ScheduleLocked,
    ScheduleNotEditable,
    ScheduleNotFound,
)
from .occurrence import Occurrence, occurrence_of
from .timing import Cron, Every

__all__ = [
    "Cron",
    "Every",
    "InvalidSchedule",
    "Occurrence",
    "ScheduleError",
    "ScheduleLocked",
    "ScheduleNotEditable",
    "ScheduleNotFound",
    "Scheduled",
    "occurrence_of",
]
