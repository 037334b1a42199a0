"""The schedules page: each stored schedule with its timing, state, next and last
occurrence, its last run's status (linked), and where it is defined; pause, resume and
run-now as admin actions.

The rows are read-only here: a schedule from code or settings is edited there, a runtime
one through ``schedules.api``. The actions need the model's change permission
(``django_tasks_plus.change_schedulerecord``) and are logged under the operator.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..models import ScheduleRecord, TaskRecord
from ..schedules import ScheduleError, api
from . import html
from .base import ReadOnlyAdmin, log_change


class ScheduleRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "when",
        "timezone",
        "state",
        "source",
        "next_occurrence",
        "last_fired",
        "last_run",
        "task_path",
    )
    list_filter = ("source", "paused", "enabled", "backend_name")
    search_fields = ("name", "task_path")
    ordering = ("name",)
    actions = ("pause", "resume", "run_now")

    @admin.display(description=_("when"))
    def when(self, row: ScheduleRecord) -> str:
        return row.cron or f"every {row.every_seconds} s"

    @admin.display(description=_("state"))
    def state(self, row: ScheduleRecord) -> Any:
        if not row.enabled:
            return html.badge("disabled")
        return html.badge("paused" if row.paused else "active")

    @admin.display(description=_("next occurrence"), ordering="next_at")
    def next_occurrence(self, row: ScheduleRecord) -> Any:
        return html.moment(row.next_at)

    @admin.display(description=_("last fired"), ordering="last_fired_at")
    def last_fired(self, row: ScheduleRecord) -> Any:
        return html.moment(row.last_fired_at)

    @admin.display(description=_("last run"))
    def last_run(self, row: ScheduleRecord) -> Any:
        if row.last_task_id is None:
            return html.EMPTY
        status = (
            TaskRecord.objects.filter(pk=row.last_task_id).values_list("status", flat=True).first()
        )
        return format_html("{} {}", html.task_link(row.last_task_id), status or "pruned")

    # -- actions --------------------------------------------------------------------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{ScheduleRecord._meta.app_label}.change_schedulerecord")

    @admin.action(description=_("Pause selected schedules"), permissions=["operate"])
    def pause(self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]) -> None:
        self._apply(request, queryset, "paused", api.pause)

    @admin.action(description=_("Resume selected schedules"), permissions=["operate"])
    def resume(self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]) -> None:
        self._apply(request, queryset, "resumed", api.resume)

    @admin.action(description=_("Run selected schedules now"), permissions=["operate"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[ScheduleRecord]) -> None:
        self._apply(request, queryset, "run now", api.run_now)

    def _apply(
        self, request: HttpRequest, queryset: QuerySet[ScheduleRecord], done: str, call: Any
    ) -> None:
        count = 0
        for row in list(queryset):
            try:
                call(row.name, backend=row.backend_name)
            except ScheduleError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
                continue
            count += 1
            log_change(request, [row], f"Schedule {done} from the admin.")
        self.message_user(request, f"{count} schedule(s) {done}.", messages.SUCCESS)
