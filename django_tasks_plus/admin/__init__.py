"""The admin: the queue, dead letters, one task's history, workers, circuit breakers and
schedules.

Rows are written only by the backend and the worker, so the admin never edits them. What
an operator may do (redrive, cancel, release an ordering key, force a circuit) is a POST
with Django's CSRF check, allowed only with its own permission
(``django_tasks_plus.redrive_taskrecord``, ``cancel_taskrecord``, ``discard_taskrecord``,
``change_breakerrecord``), and recorded in the admin log under the user who did it.
See docs/admin.md.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import BreakerRecord, ScheduleRecord, TaskRecord, WorkerRecord
from .base import ReadOnlyAdmin
from .breakers import BreakerRecordAdmin
from .schedules import ScheduleRecordAdmin
from .tasks import TaskRecordAdmin
from .workers import WorkerRecordAdmin

admin.site.register(TaskRecord, TaskRecordAdmin)
admin.site.register(WorkerRecord, WorkerRecordAdmin)
admin.site.register(BreakerRecord, BreakerRecordAdmin)
admin.site.register(ScheduleRecord, ScheduleRecordAdmin)

__all__ = [
    "BreakerRecordAdmin",
    "ReadOnlyAdmin",
    "ScheduleRecordAdmin",
    "TaskRecordAdmin",
    "WorkerRecordAdmin",
]
