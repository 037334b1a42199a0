"""The admin for task rows and workers: read-only rows, audited operating actions.

Rows are written only by the backend and the worker, so the admin never edits them. What
an operator may do to a task (redrive it, cancel it, release the ordering key it blocks)
is an admin action: a POST with Django's CSRF check, allowed only with its own permission
(``django_tasks_plus.redrive_taskrecord``, ``cancel_taskrecord``, ``discard_taskrecord``),
and recorded in the admin log under the user who did it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import operations
from .compat import InvalidTaskBackend, TaskResultDoesNotExist
from .exceptions import TasksPlusError
from .models import TaskRecord, WorkerRecord


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


_JSON_COLUMNS = ("args", "kwargs", "return_value", "errors", "worker_ids")


def _has_task_permission(request: HttpRequest, codename: str) -> bool:
    return request.user.has_perm(f"{TaskRecord._meta.app_label}.{codename}")


@admin.register(TaskRecord)
class TaskRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task_path",
        "queue_name",
        "status",
        "priority",
        "attempt",
        "enqueued_at",
        "run_after",
        "finished_at",
    )
    list_filter = ("status", "queue_name", "backend_name")
    search_fields = ("=id", "task_path")
    date_hierarchy = "enqueued_at"
    ordering = ("-enqueued_at",)
    show_full_result_count = False  # COUNT(*) over a large queue is slow

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskRecord]:
        """The task list shows no JSON column: it does not load (or parse) them. That keeps
        the page fast, and one hostile row (JSON nested deeper than Python's parser goes)
        cannot make the whole list fail."""
        queryset = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        if match is not None and (match.url_name or "").endswith("_changelist"):
            queryset = queryset.defer(*_JSON_COLUMNS)
        return queryset

    fieldsets = (
        (None, {"fields": ("id", "task_path", "backend_name", "queue_name", "priority", "status")}),
        ("Call", {"fields": ("args", "kwargs", "return_value")}),
        (
            "Timeline",
            {
                "fields": (
                    "enqueued_at",
                    "run_after",
                    "started_at",
                    "last_attempted_at",
                    "finished_at",
                )
            },
        ),
        (
            "Attempts",
            {
                "fields": (
                    "attempt",
                    "worker_ids",
                    "lease_token",
                    "lease_expires_at",
                    "errors",
                    "dead_letter_reason",
                )
            },
        ),
    )

    actions = ("redrive_tasks", "cancel_tasks", "discard_tasks")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return _has_task_permission(request, "redrive_taskrecord")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return _has_task_permission(request, "cancel_taskrecord")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return _has_task_permission(request, "discard_taskrecord")

    @admin.action(description=_("Redrive selected dead-lettered tasks"), permissions=["redrive"])
    def redrive_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._apply(request, queryset, operations.redrive, "Redriven", _redrive_summary)

    @admin.action(description=_("Cancel selected tasks"), permissions=["cancel"])
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        def cancel(record_id: str, *, backend: str) -> bool:
            outcome = operations.cancel(record_id, backend=backend)
            return outcome.outcome != "already_finished"

        self._apply(request, queryset, cancel, "Cancelled", _cancel_summary)

    @admin.action(
        description=_("Release the ordering keys held by selected dead tasks"),
        permissions=["discard"],
    )
    def discard_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._apply(request, queryset, operations.discard, "Discarded", _discard_summary)

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[TaskRecord],
        operation: Callable[..., bool],
        verb: str,
        summary: Callable[[int, int], str],
    ) -> None:
        """Run ``operation`` per selected row; log each change under the acting user."""
        done = skipped = 0
        for record in queryset.only("id", "backend_name", "task_path", "status"):
            try:
                changed = operation(str(record.pk), backend=record.backend_name)
            except (TasksPlusError, InvalidTaskBackend, TaskResultDoesNotExist) as exc:
                self.message_user(request, f"{record.pk}: {exc}", messages.ERROR)
                continue
            if changed:
                done += 1
                self.log_change(request, record, f"{verb} from the admin.")
            else:
                skipped += 1
        self.message_user(request, summary(done, skipped), messages.SUCCESS)


def _redrive_summary(done: int, skipped: int) -> str:
    text = ngettext("%d task redriven.", "%d tasks redriven.", done) % done
    if skipped:
        text += (
            " "
            + ngettext(
                "%d was not dead-lettered and was left alone.",
                "%d were not dead-lettered and were left alone.",
                skipped,
            )
            % skipped
        )
    return text


def _cancel_summary(done: int, skipped: int) -> str:
    text = (
        ngettext(
            "%d task cancelled (or asked to stop).", "%d tasks cancelled (or asked to stop).", done
        )
        % done
    )
    if skipped:
        text += (
            " "
            + ngettext("%d had already finished.", "%d had already finished.", skipped) % skipped
        )
    return text


def _discard_summary(done: int, skipped: int) -> str:
    text = ngettext("%d ordering key released.", "%d ordering keys released.", done) % done
    if skipped:
        text += (
            " " + ngettext("%d task blocked no key.", "%d tasks blocked no key.", skipped) % skipped
        )
    return text


@admin.register(WorkerRecord)
class WorkerRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "worker_id",
        "backend_name",
        "hostname",
        "pid",
        "concurrency",
        "started_at",
        "last_heartbeat_at",
    )
    list_filter = ("backend_name", "hostname")
    ordering = ("-last_heartbeat_at",)
