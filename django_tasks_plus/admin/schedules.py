"""The schedules page: each stored schedule with its timing (in words and as written),
state, next and last occurrence, its last run's status (linked), and where it is
defined; pause, resume and run-now as admin actions. A schedule's own page adds the
history of its runs: each occurrence acted on, with its task (linked) and that task's
status.

The rows are read-only here: a schedule from code or settings is edited there, a runtime
one through ``schedules.api``. The actions need the model's change permission
(``django_tasks_plus.change_schedulerecord``) and are logged under the operator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import ScheduleOccurrence, ScheduleRecord, TaskRecord
from ..schedules import ScheduleError, api
from ..schedules.store import spec_of
from ..schedules.words import describe
from . import html
from .base import ReadOnlyAdmin, log_change

HISTORY_LENGTH = 50
"""Occurrences shown on a schedule's page, the latest first (the table keeps them all)."""


class ScheduleRecordAdmin(ReadOnlyAdmin):
    # Name, next and last run first: what an operator looks for, and what a phone shows
    # (the stylesheet wraps their times and hides the columns after them on a narrow
    # screen; a schedule's own page shows everything).
    list_display = (
        "name",
        "next_occurrence",
        "last_run",
        "state",
        "in_words",
        "expression",
        "timezone",
        "source",
        "task_path",
    )
    list_filter = ("source", "paused", "enabled", "backend_name")
    search_fields = ("name", "task_path")
    ordering = ("name",)
    actions = ("pause", "resume", "run_now")
    fieldsets = (
        (None, {"fields": ("name", "state", "source", "backend_name", "task_path")}),
        (
            _("When"),
            {"fields": ("in_words", "expression", "timezone", "next_occurrence", "last_fired")},
        ),
        (_("Call"), {"fields": ("args", "kwargs", "queue_name", "priority")}),
        (_("Policies"), {"fields": ("catch_up", "catch_up_cap", "overlap")}),
        (_("Runs"), {"fields": ("last_run", "history")}),
    )
    readonly_fields = (
        "state",
        "in_words",
        "expression",
        "next_occurrence",
        "last_fired",
        "last_run",
        "history",
    )

    @admin.display(description=_("when"))
    def in_words(self, row: ScheduleRecord) -> str:
        return describe(spec_of(row))

    @admin.display(description=_("expression"))
    def expression(self, row: ScheduleRecord) -> Any:
        written = row.cron or f"Every(seconds={row.every_seconds})"
        return format_html("<code>{}</code>", written)

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

    @admin.display(description=_("last run"), ordering="last_fired_at")
    def last_run(self, row: ScheduleRecord) -> Any:
        """When it last fired, its task (linked) and the task's status."""
        if row.last_task_id is None:
            return html.moment(row.last_fired_at)
        return format_html(
            "{}<br>{}",
            html.moment(row.last_fired_at),
            run_cell(row.last_task_id, getattr(row, "last_status", None)),
        )

    @admin.display(description=_("history of runs"))
    def history(self, row: ScheduleRecord) -> Any:
        occurrences = list(
            ScheduleOccurrence.objects.filter(schedule=row).order_by("-at")[:HISTORY_LENGTH]
        )
        if not occurrences:
            return _("No occurrence yet.")
        statuses = task_statuses(o.task_id for o in occurrences if o.task_id is not None)
        head = format_html(
            "<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
            _("occurrence"),
            _("action"),
            _("task and its status"),
            _("why skipped"),
        )
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    html.moment(o.at, relative=False),
                    html.badge(
                        o.get_action_display(), "skipped" if o.action == "skipped" else "ready"
                    ),
                    html.EMPTY
                    if o.task_id is None
                    else run_cell(o.task_id, statuses.get(o.task_id)),
                    o.reason or "",
                )
                for o in occurrences
            ),
        )
        return format_html(
            '<div class="dtp-scroll"><table class="dtp-history"><thead>{}</thead><tbody>{}</tbody>'
            "</table></div>",
            head,
            body,
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduleRecord]:
        """Each row with its last run's status, read in the same query."""
        last = TaskRecord.objects.filter(pk=OuterRef("last_task_id")).values("status")[:1]
        return super().get_queryset(request).annotate(last_status=Subquery(last))

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


def task_statuses(task_ids: Iterable[Any]) -> dict[Any, str]:
    """The status of each task still in the table, by id, in one query."""
    ids = list(task_ids)
    if not ids:
        return {}
    return dict(TaskRecord.objects.filter(pk__in=ids).values_list("pk", "status"))


def run_cell(task_id: Any, status: str | None) -> SafeString:
    """A run: its task's short id (linked) and status; "pruned" once the task is gone."""
    return format_html(
        "{} {}", html.task_link(task_id), html.badge(status.lower()) if status else _("pruned")
    )
