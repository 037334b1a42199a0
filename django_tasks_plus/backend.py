"""``DatabaseBackend``: the ``django.tasks`` face of the queue (enqueue, results, checks)."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import InterfaceError, OperationalError, connections, transaction
from django.utils import timezone

from . import compat
from .codec import EncodeError, encode_call
from .conf import BackendSettings, parse_settings
from .db import UnsupportedDatabase, dialect_for
from .definition import Task, check_arguments, resolve_task, validate_task_options
from .exceptions import (
    DatabaseUnavailable,
    InvalidTaskArguments,
    TaskNotRegistered,
)
from .results import make_result, result_from_record
from .retry import RetryPolicy


class DatabaseBackend(compat.BaseTaskBackend):
    """Stores tasks in the project's database; ``manage.py runtasks`` runs them."""

    task_class = Task
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings: BackendSettings = parse_settings(alias, params)
        self.queues = set(self.settings.queues)

    # -- definition time ---------------------------------------------------------------

    def validate_task(self, task: compat.Task) -> None:
        super().validate_task(task)
        if isinstance(task, Task):
            validate_task_options(task)

    def retry_policy_for(self, task: compat.Task) -> RetryPolicy:
        """The task's own policy, else the backend default."""
        policy = getattr(task, "retry", None)
        return policy if policy is not None else self.settings.retry

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(self, task: compat.Task, args: Any, kwargs: Any) -> compat.TaskResult:
        """Insert the task on the caller's connection, inside the caller's transaction."""
        self.validate_task(task)
        args, kwargs = tuple(args), dict(kwargs)
        check_arguments(task, args, kwargs)
        try:
            encoded_args, encoded_kwargs = encode_call(args, kwargs)
        except EncodeError as exc:
            raise InvalidTaskArguments(f"Cannot enqueue {task.module_path}: {exc}") from exc

        now = timezone.now()
        task_id = uuid.uuid4()
        values = {
            "id": task_id,
            "task_path": task.module_path,
            "backend_name": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "args": encoded_args,
            "kwargs": encoded_kwargs,
            "status": compat.TaskResultStatus.READY.value,
            "run_after": task.run_after or now,
            "attempt": 0,
            "worker_ids": [],
            "errors": [],
            "enqueued_at": now,
            "dead_letter_reason": "",
        }
        database = self.settings.database
        connection = connections[database]
        try:
            dialect_for(connection).insert_task(
                connection, values, task.queue_name, notify=self.settings.notify
            )
        except (OperationalError, InterfaceError) as exc:
            raise DatabaseUnavailable(
                f"Cannot enqueue {task.module_path}: database {database!r} is unavailable ({exc})."
            ) from exc

        result = make_result(
            task,
            id=str(task_id),
            status=compat.TaskResultStatus.READY,
            backend=self.alias,
            args=encoded_args,
            kwargs=encoded_kwargs,
            enqueued_at=now,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
        )
        # Listeners hear of the task only once it exists for everyone else too.
        transaction.on_commit(
            partial(compat.task_enqueued.send, type(self), task_result=result), using=database
        )
        return result

    # -- results ------------------------------------------------------------------------

    def get_result(self, result_id: str) -> compat.TaskResult:
        try:
            pk = uuid.UUID(str(result_id))
        except ValueError as exc:
            raise compat.TaskResultDoesNotExist(result_id) from exc
        from .models import TaskRecord  # not at import: keeps check E001 reachable

        try:
            record = TaskRecord.objects.using(self.settings.database).get(
                pk=pk, backend_name=self.alias
            )
        except TaskRecord.DoesNotExist as exc:
            raise compat.TaskResultDoesNotExist(result_id) from exc
        try:
            task = resolve_task(record.task_path)
        except TaskNotRegistered as exc:
            raise TaskNotRegistered(
                f"Task result {result_id} names {record.task_path!r}, which is not a task "
                f"in this codebase: {exc}"
            ) from exc
        return result_from_record(task, record)

    # -- checks -------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = list(super().check(**kwargs))
        if not apps.is_installed("django_tasks_plus"):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses DatabaseBackend, but 'django_tasks_plus' is "
                    "not in INSTALLED_APPS.",
                    hint="Add 'django_tasks_plus' to INSTALLED_APPS and run migrate.",
                    id="django_tasks_plus.E001",
                )
            )
            return errors  # the checks below need the app's models
        database = self.settings.database
        if database not in connections:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] is {database!r}, which is not "
                    "in DATABASES.",
                    id="django_tasks_plus.E002",
                )
            )
            return errors
        try:
            dialect = dialect_for(connections[database])
        except UnsupportedDatabase as exc:
            errors.append(checks.Error(str(exc), id="django_tasks_plus.E003"))
            return errors
        for problem in dialect.check(connections[database]):
            errors.append(checks.Error(problem, id="django_tasks_plus.E004"))
        return errors
