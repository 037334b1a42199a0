"""Test-only worker services and their factories (``tests/test_plugins.py``), in a module
of their own so that a dotted path in ``OPTIONS["SERVICES"]`` reaches this very list."""

from __future__ import annotations

from typing import Any

from django_tasks_plus.worker.plugins import ServiceContext
from django_tasks_plus.worker.services import ThreadService

STARTED: list[tuple[str, str]] = []  # (service name, worker id), as the services ran


class Recorder(ThreadService):
    """A test service: records that it ran on the worker, then waits to be stopped."""

    def __init__(self, context: ServiceContext, name: str) -> None:
        super().__init__(context.database)
        self.name = name
        self.context = context

    def serve(self) -> None:
        STARTED.append((self.name, self.context.worker_id))
        self.stopping.wait()


def settings_service(context: ServiceContext) -> Recorder:
    return Recorder(context, "tasks-test-from-settings")


def task_service(context: ServiceContext) -> list[Recorder]:
    return [Recorder(context, "tasks-test-from-task")]


def not_a_service(context: ServiceContext) -> Any:
    return "a string"
