"""What every page of this admin shares: rows are read-only, the stylesheet, and the
audit entry an operator's action leaves in Django's admin history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db.models import Model
from django.http import HttpRequest

from .filters import configured_backends

STYLESHEET = "django_tasks_plus/admin.css"


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows are written only by the backend and the worker: no add, change or delete.
    What an operator may do to a row is an action with its own permission."""

    class Media:
        css = {"all": (STYLESHEET,)}

    def get_list_display(self, request: HttpRequest) -> Any:
        """The backend column only when there are backends to tell apart: with one, it
        repeats the same word on every row and takes the room of a column that matters."""
        shown = super().get_list_display(request)
        if len(configured_backends()) > 1:
            return shown
        return tuple(name for name in shown if name != "backend_name")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def log_change(
    request: HttpRequest, rows: Sequence[Model], message: str, *, deleted: bool = False
) -> None:
    """One "changed" entry per row in the admin's history, for an action the operator took
    (redrive, force close, pause, ...), or a "deleted" one (``deleted``: the rows are
    gone); nothing when no row changed."""
    if rows:
        LogEntry.objects.log_actions(
            user_id=cast(Any, request.user.pk),
            queryset=rows,
            action_flag=DELETION if deleted else CHANGE,
            change_message=message,
        )
