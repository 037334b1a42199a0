"""The schedules page: each stored schedule with its timing (in words and as written),
state, next and last occurrence, its last run's status (linked), and where it is
defined; pause, resume and run-now as admin actions. A schedule's own page adds the
history of its runs: each occurrence acted on, with its task (linked) and that task's
status.

A runtime schedule is created here (``add_schedulerecord``) and edited on its page
(``change_schedulerecord``), through ``schedules.api`` (``schedule_form.py`` checks the
entry first); a schedule from code or settings is edited there, so its page is
read-only. The actions need the change permission and are logged under the operator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..db.rowlock import LockPatience
from ..models import ScheduleOccurrence, ScheduleRecord, TaskRecord
from ..schedules import ScheduleError, api
from ..schedules.declared import RUNTIME
from ..schedules.errors import ScheduleLocked
from ..schedules.store import spec_of
from ..schedules.words import describe
from . import html
from .base import ReadOnlyAdmin, log_change
from .display import ago
from .schedule_form import FIXED_ON_CHANGE, ScheduleForm

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
    form = ScheduleForm
    # A runtime schedule's form: what the operator sets, then what the scheduler keeps.
    editable_fieldsets = (
        (None, {"fields": ("name", "backend_name", "task_path", "paused")}),
        (_("When"), {"fields": ("cron", "every_seconds", "timezone")}),
        (_("Call"), {"fields": ("args", "kwargs", "queue_name", "priority")}),
        (_("Policies"), {"fields": ("catch_up", "catch_up_cap", "overlap")}),
    )
    state_fieldsets = (
        (_("State"), {"fields": ("state", "in_words", "next_occurrence")}),
        (_("Runs"), {"fields": ("last_run", "history")}),
    )

    # -- creating and editing runtime schedules -------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{ScheduleRecord._meta.app_label}.add_schedulerecord")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.source != RUNTIME:
            return False  # edited in its code or settings
        return self.has_operate_permission(request)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return self.editable_fieldsets
        if self.has_change_permission(request, obj):
            return self.editable_fieldsets + self.state_fieldsets
        return self.fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields + (FIXED_ON_CHANGE if obj is not None else ())

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Through ``schedules.api``, like every writer of the table: a new timing
        restarts the schedule from its next occurrence, pausing keeps its place."""
        options = form.api_options()
        if change:
            was_paused = ScheduleRecord.objects.filter(pk=obj.pk).values_list("paused", flat=True)
            row = api.update(obj.name, backend=obj.backend_name, **options)
            if obj.paused and not was_paused.first():
                row = api.pause(obj.name, backend=obj.backend_name)
            elif not obj.paused and was_paused.first():
                row = api.resume(obj.name, backend=obj.backend_name)
        else:
            row = api.create(
                obj.name,
                options.pop("task"),
                options.pop("when"),
                paused=obj.paused,
                backend=obj.backend_name,
                **options,
            )
        obj.pk, obj.next_at = row.pk, row.next_at
        obj._state.adding = False

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
        if row.paused or not row.enabled:
            return html.EMPTY  # a resumed schedule continues from the moment it resumes
        return html.moment(row.next_at)

    @admin.display(description=_("last fired"), ordering="last_fired_at")
    def last_fired(self, row: ScheduleRecord) -> Any:
        return html.moment(row.last_fired_at)

    @admin.display(description=_("last run"), ordering="last_fired_at")
    def last_run(self, row: ScheduleRecord) -> Any:
        """When it last fired, its task (linked) and the task's status."""
        if row.last_task_id is None:
            return html.moment(row.last_fired_at)
        # Which task and how it went, then how long ago (the time itself on hover): a
        # list row stays a few lines tall.
        fired = row.last_fired_at
        return format_html(
            '{}<br><span class="dtp-note" title="{}">{}</span>',
            run_cell(row.last_task_id, getattr(row, "last_status", None)),
            fired.isoformat() if fired else "",
            ago(fired, timezone.now()) if fired else "",
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
        patience = LockPatience()  # rows other sessions keep locked cost seconds in all
        for row in list(queryset):
            try:
                call(row.name, backend=row.backend_name, lock_wait=patience.wait())
            except ScheduleError as exc:
                if isinstance(exc, ScheduleLocked):
                    patience.gave_up(exc.waited)
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
    """A run: its task's status and short id (linked); "pruned" once the task is gone."""
    return format_html(
        "{} {}", html.badge(status.lower()) if status else _("pruned"), html.task_link(task_id)
    )
