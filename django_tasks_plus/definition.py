"""Our ``Task``: Django's task definition plus the options a durable queue needs.

Django's ``@task`` decorator forwards unknown keyword arguments to the backend's
``task_class``, so ``@django.tasks.task(retry=..., timeout=...)`` builds one of these when
the backend is ours: one definition object, not two.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.utils.module_loading import import_string

from . import compat
from .exceptions import (
    InvalidRetryPolicy,
    InvalidTaskArguments,
    InvalidTaskOptions,
    TaskNotRegistered,
)
from .retry import RetryPolicy, validate_policy


@dataclass(frozen=True, slots=True, kw_only=True)
class Task(compat.Task):
    """A task definition with retry policy and timeout.

    ``retry``: a policy ``(attempt, elapsed, exc) -> timedelta | None``; ``None`` uses the
    backend's ``OPTIONS["RETRY"]``. ``timeout``: seconds an attempt may run before
    ``TaskTimeout`` is raised inside it; ``None`` means no limit.
    """

    retry: RetryPolicy | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        # Explicit base call: zero-argument super() does not work in slotted dataclasses.
        compat.Task.__post_init__(self)


def validate_task_options(task: Task) -> None:
    """Raise ``InvalidTaskOptions`` naming the first bad option of ``task``."""
    if task.retry is not None:
        try:
            validate_policy(task.retry, f"{task.module_path}: retry")
        except InvalidRetryPolicy as exc:
            raise InvalidTaskOptions(str(exc)) from exc
    timeout = task.timeout
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise InvalidTaskOptions(
            f"{task.module_path}: timeout must be a positive number of seconds or None, "
            f"got {timeout!r}."
        )


@lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(func)


def check_arguments(task: compat.Task, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Fail at enqueue, not in the worker, when the call cannot bind to the function."""
    leading = (None,) if task.takes_context else ()
    try:
        _signature(task.func).bind(*leading, *args, **kwargs)
    except TypeError as exc:
        raise InvalidTaskArguments(
            f"{task.module_path}() cannot be called with these arguments: {exc}"
        ) from exc


_resolved: dict[str, compat.Task] = {}


def resolve_task(path: str) -> compat.Task:
    """The ``Task`` object a stored row names; refuse anything that is not a task.

    Only objects created by a task decorator are ever run, so a row forged to name
    ``os.system`` or any other callable is refused, not executed.
    """
    found = _resolved.get(path)
    if found is not None:
        return found
    try:
        obj = import_string(path)
    except ImportError as exc:
        raise TaskNotRegistered(f"{path!r} cannot be imported: {exc}") from exc
    except Exception as exc:  # a broken module must not crash the worker
        raise TaskNotRegistered(f"importing {path!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, compat.Task):
        raise TaskNotRegistered(
            f"{path!r} is a {type(obj).__name__}, not a task; only functions decorated "
            "with @task are run."
        )
    if obj.module_path != path:
        raise TaskNotRegistered(f"{path!r} resolves to the task {obj.module_path!r}.")
    _resolved[path] = obj
    return obj


def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = compat.DEFAULT_TASK_PRIORITY,
    queue_name: str = compat.DEFAULT_TASK_QUEUE_NAME,
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
) -> Any:
    """Django's ``@task`` with our options spelled out (for editors and type checkers).

    Options left at their defaults are not passed on, so the decorator still works with
    a backend that is not ours (for example Django's ``ImmediateBackend`` in tests).
    """
    extra: dict[str, Any] = {}
    if retry is not None:
        extra["retry"] = retry
    if timeout is not None:
        extra["timeout"] = timeout
    decorator = compat.django_task(
        priority=priority,
        queue_name=queue_name,
        backend=backend,
        takes_context=takes_context,
        **extra,
    )
    return decorator(function) if function is not None else decorator
