"""A read-only admin for task rows and workers.

Rows are written only by the backend and the worker, so the admin never edits them; the
operating tools (redrive, dashboard, breakers) come with their own views.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import TaskRecord, WorkerRecord


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


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
