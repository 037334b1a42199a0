"""What every page of this admin shares: rows are read-only, and the stylesheet."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

STYLESHEET = "django_tasks_plus/admin.css"


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows are written only by the backend and the worker: no add, change or delete.
    What an operator may do to a row is an action with its own permission."""

    class Media:
        css = {"all": (STYLESHEET,)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
