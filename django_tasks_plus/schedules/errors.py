"""The schedules feature's typed errors (``manage.py check`` and the API raise these)."""

from __future__ import annotations

from ..exceptions import TasksPlusError


class ScheduleError(TasksPlusError):
    """Base class of the schedules feature's errors."""


class InvalidSchedule(ScheduleError, ValueError):
    """A schedule's definition cannot be used: a bad cron string or interval, an unknown
    time zone, task path or policy. The message names the schedule."""


class ScheduleNotFound(ScheduleError, LookupError):
    """No stored schedule has this name."""


class ScheduleNotEditable(ScheduleError):
    """The schedule is defined in code or settings: its definition is edited there (pause,
    resume and run-now still work)."""


class ScheduleLocked(ScheduleError):
    """A change to a schedule (update, pause, resume, run now, delete) met its row locked
    by another database session for longer than it may wait (``lock_wait``, 5 seconds by
    default): a transaction still open elsewhere. Also raised by run now when the task's
    dedup key is being taken by a transaction still open (``DedupKeyLocked``, the
    cause). Nothing was changed; try again once that transaction ends. Attribute:
    ``waited`` (seconds)."""

    retryable = True

    def __init__(self, message: str, *, waited: float = 0.0) -> None:
        super().__init__(message)
        self.waited = waited
