"""The base of the commands that work on one django-tasks-plus backend (``--backend``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..backend import DatabaseBackend
from ..compat import InvalidTaskBackend
from ..discovery import TaskModuleError, discover_task_modules
from ..exceptions import TasksPlusError
from ..operations import BackendNotUsable, database_backend


class BackendCommand(BaseCommand):
    """Resolves ``--backend`` before Django's system checks run, so that a bad alias or a
    broken ``TASKS`` entry ends as a one-line ``CommandError`` naming what to fix, not as a
    traceback from the checks. Subclasses add a ``--backend`` option and say who they are
    in ``needed_by`` (it names them in the error for another kind of backend)."""

    needed_by = "this command"

    def execute(self, *args: Any, **options: Any) -> str | None:
        backend = self._backend(options["backend"])
        discover_tasks(backend)
        return super().execute(*args, **options)

    def check(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().check(*args, **kwargs)
        except (InvalidTaskBackend, TasksPlusError) as exc:  # another alias's entry
            raise CommandError(str(exc)) from exc

    def _backend(self, alias: str) -> DatabaseBackend:
        try:
            return database_backend(alias, needed_by=self.needed_by)
        except BackendNotUsable as exc:
            raise CommandError(str(exc)) from exc


def discover_tasks(backend: DatabaseBackend) -> None:
    """Import the installed apps' ``tasks`` modules (unless the backend turned it off),
    so every task, breaker and service is known; a module that fails is a CommandError."""
    try:
        discover_task_modules(backend.settings)
    except TaskModuleError as exc:
        raise CommandError(str(exc)) from exc
