"""Module-level helpers for app code: bulk enqueue, metadata, cancel, redrive, discard,
run now, delete, pruning.

Each accepts a ``TaskResult`` or a result id and finds the backend that owns it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from . import compat
from .db.rowlock import OPERATOR_LOCK_WAIT
from .exceptions import InvalidBackendOptions, TasksPlusError

if TYPE_CHECKING:
    from .backend import CancelOutcome, DatabaseBackend


def _backend(result: compat.TaskResult | str, backend: str | None) -> DatabaseBackend:
    from .backend import DatabaseBackend

    alias = backend or getattr(result, "backend", None) or compat.DEFAULT_TASK_BACKEND_ALIAS
    found = compat.task_backends[alias]
    if not isinstance(found, DatabaseBackend):
        raise InvalidBackendOptions(
            f"Task backend {alias!r} is {type(found).__qualname__}, not "
            "django_tasks_plus' DatabaseBackend."
        )
    return found


class BackendNotUsable(InvalidBackendOptions):
    """``TASKS[alias]`` is missing, broken, or not django-tasks-plus' ``DatabaseBackend``."""


def database_backend(alias: str, *, needed_by: str) -> DatabaseBackend:
    """The ``DatabaseBackend`` configured as ``TASKS[alias]``, for a command or tool.

    Raises ``BackendNotUsable`` saying what is wrong: an alias ``TASKS`` does not have
    (naming those it has), an entry that cannot be built, or another kind of backend
    (``needed_by`` says what needed ours, e.g. "runtasks").
    """
    from django.conf import settings

    from .backend import DatabaseBackend

    configured = getattr(settings, "TASKS", {}) or {}
    if alias not in configured:
        known = ", ".join(sorted(configured)) or "nothing"
        raise BackendNotUsable(f"Unknown task backend {alias!r}; TASKS configures: {known}.")
    try:
        backend = compat.task_backends[alias]
    except (compat.InvalidTaskBackend, TasksPlusError) as exc:
        raise BackendNotUsable(f"Task backend {alias!r}: {exc}") from exc
    if not isinstance(backend, DatabaseBackend):
        raise BackendNotUsable(
            f"Task backend {alias!r} is {type(backend).__module__}."
            f"{type(backend).__qualname__}; {needed_by} needs "
            "django_tasks_plus.backend.DatabaseBackend."
        )
    return backend


def _id(result: compat.TaskResult | str) -> str:
    return result if isinstance(result, str) else result.id


def enqueue_many(task: compat.Task, calls: Iterable[Any]) -> list[compat.TaskResult]:
    """Enqueue ``task`` once per ``(args, kwargs)`` pair: atomically, in one round trip."""
    return task.get_backend().enqueue_many(task, calls)  # type: ignore[attr-defined]


async def aenqueue_many(task: compat.Task, calls: Iterable[Any]) -> list[compat.TaskResult]:
    return await task.get_backend().aenqueue_many(task, calls)  # type: ignore[attr-defined]


def get_metadata(
    result: compat.TaskResult | str, *, backend: str | None = None
) -> Mapping[str, Any]:
    """The task's metadata (docs/tasks.md#metadata), read from the database now: from
    any process, decoded (tagged values come back as their types), read-only."""
    return _backend(result, backend).get_metadata(_id(result))


def cancel(
    result: compat.TaskResult | str,
    *,
    backend: str | None = None,
    lock_wait: float = OPERATOR_LOCK_WAIT,
) -> CancelOutcome:
    """Cancel a task: READY never runs, RUNNING is asked to stop, finished is left alone.

    This and each change below waits at most ``lock_wait`` seconds for a task row
    another database session holds locked, then raises ``TaskRowLocked`` having changed
    nothing."""
    return _backend(result, backend).cancel(_id(result), lock_wait=lock_wait)


def redrive(
    result: compat.TaskResult | str,
    *,
    backend: str | None = None,
    lock_wait: float = OPERATOR_LOCK_WAIT,
) -> bool:
    """Run a dead-lettered task again with a fresh retry budget; False if it is not FAILED."""
    return _backend(result, backend).redrive(_id(result), lock_wait=lock_wait)


def run_now(
    result: compat.TaskResult | str,
    *,
    backend: str | None = None,
    attempt: int | None = None,
    lock_wait: float = OPERATOR_LOCK_WAIT,
) -> bool:
    """Run a waiting task now (a retry, a scheduled or a held one): READY and due from
    now on; False if it was not waiting for its time. ``attempt``: only if it still is
    in the wait after that many attempts (a worker may have run it meanwhile)."""
    return _backend(result, backend).run_now(_id(result), attempt=attempt, lock_wait=lock_wait)


def delete(
    result: compat.TaskResult | str,
    *,
    backend: str | None = None,
    lock_wait: float = OPERATOR_LOCK_WAIT,
) -> bool:
    """Delete a task unless it is RUNNING (cancel it first); False if it was left."""
    return _backend(result, backend).delete(_id(result), lock_wait=lock_wait)


def discard(
    result: compat.TaskResult | str,
    *,
    backend: str | None = None,
    lock_wait: float = OPERATOR_LOCK_WAIT,
) -> bool:
    """Release the ordering key a dead task blocks; the task itself stays FAILED."""
    return _backend(result, backend).discard(_id(result), lock_wait=lock_wait)


def prune_dedup_keys(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS, *, now: datetime | None = None
) -> int:
    """Delete the backend's dedup keys that no longer hold; return how many.

    A ``"ttl"`` key goes once its window has passed, a ``"finished"`` key once none of its
    tasks is READY or RUNNING. Keys that still hold are never touched, and a key that an
    enqueue takes over while this runs is kept, so it is safe to run at any time, from a
    periodic task or a cron job. ``now`` (default: the current time) is for tests.
    """
    from .db.dedup import prune_keys  # imports the models: not at module import

    found = _backend(backend, backend)
    return prune_keys(found.settings.database, found.alias, now or timezone.now())
