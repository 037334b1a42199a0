"""Our ``Task``: Django's task definition plus the options a durable queue needs.

Django's ``@task`` decorator forwards unknown keyword arguments to the backend's
``task_class``, so ``@django.tasks.task(retry=..., timeout=...)`` builds one of these when
the backend is ours: one definition object, not two.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.utils import timezone

from . import compat, extensions
from .binding import bind_payload, check_schema_signature
from .breaker import Breaker, check_key, scoped_key
from .exceptions import (
    InvalidRetryPolicy,
    InvalidTaskArguments,
    InvalidTaskOptions,
    TaskNotRegistered,
)
from .extensions import load_service_factories
from .limits import KEY_MAX_LENGTH
from .middleware import load_middleware
from .retry import RetryPolicy, validate_policy
from .timebounds import as_delay, not_beyond_horizon

if TYPE_CHECKING:  # schema.py (and msgspec) load only once a task declares a schema
    from .schema import PayloadSchema

ORDERING_FAILURES = ("continue", "block")
DEDUP_SCOPES = ("ttl", "finished")


@dataclass(frozen=True, slots=True, kw_only=True)
class Task(compat.Task):
    """A task definition with the options of a durable queue.

    Definition-time options (``@task(...)``):

    * ``retry``: a policy ``(attempt, elapsed, exc) -> timedelta | None``; ``None`` uses
      the backend's ``OPTIONS["RETRY"]``.
    * ``timeout``: seconds an attempt may run before ``TaskTimeout`` is raised inside it.
    * ``schema``: validates the payload at enqueue and again in the worker.
    * ``ordering_failure``: ``"continue"`` (a dead task releases its ordering key) or
      ``"block"`` (the key waits until the dead task is redriven or discarded).
    * ``middleware``: execution middleware factories (or dotted paths) run around each
      attempt, inside the backend's ``OPTIONS["MIDDLEWARE"]`` (``middleware.py``).
    * ``enqueue_middleware``: enqueue middleware factories (or dotted paths) run around
      each enqueue, inside the backend's ``OPTIONS["ENQUEUE_MIDDLEWARE"]`` (``envelope.py``).
    * ``breaker``: a ``Breaker`` (``breaker.py``): tasks whose remote host keeps failing
      are held, not run, until a probe finds it back (``circuits.py``).
    * ``services``: worker service factories (or dotted paths) this task needs; every
      worker of its backend runs them (``worker/plugins.py``).
    * ``schedule`` / ``schedules``: when the task runs by itself (a cron string,
      ``Every(seconds=…)`` or ``Scheduled(…)``, see ``schedules/``); kept as given here and
      read by the schedules feature through ``scheduled_tasks()``.

    Per-call options (``.using(...)``): ``dedup_key``, ``dedup_ttl``, ``dedup_until``,
    ``ordering_key``, plus Django's own ``priority``, ``queue_name``, ``run_after``.
    """

    retry: RetryPolicy | None = None
    timeout: float | None = None
    schema: Any = None
    ordering_failure: str = "continue"
    ordering_key: str | None = None
    dedup_key: str | None = None
    dedup_ttl: timedelta | None = None
    dedup_until: str = "ttl"
    middleware: tuple[Any, ...] = ()
    breaker: Breaker | None = None
    services: tuple[Any, ...] = ()
    enqueue_middleware: tuple[Any, ...] = ()
    schedule: Any = None
    schedules: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        for name in ("middleware", "services", "enqueue_middleware", "schedules"):
            if isinstance(getattr(self, name), list):  # keep the definition hashable
                object.__setattr__(self, name, tuple(getattr(self, name)))
        # Explicit base call: zero-argument super() does not work in slotted dataclasses.
        compat.Task.__post_init__(self)
        if self.schedule is not None or self.schedules:
            # The definition, not a copy made by using(): the first one seen wins.
            _scheduled.setdefault((self.backend, self.module_path), self)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        ordering_key: str | None = None,
        dedup_key: str | None = None,
        dedup_ttl: timedelta | float | None = None,
        dedup_until: str | None = None,
    ) -> Task:
        """A copy with per-call options; unspecified ones keep the definition's values."""
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("priority", priority),
                ("queue_name", queue_name),
                ("run_after", run_after),
                ("backend", backend),
                ("ordering_key", ordering_key),
                ("dedup_key", dedup_key),
                ("dedup_until", dedup_until),
            )
            if value is not None
        }
        if dedup_ttl is not None:
            if isinstance(dedup_ttl, int | float) and not isinstance(dedup_ttl, bool):
                dedup_ttl = timedelta(seconds=dedup_ttl)
            changes["dedup_ttl"] = dedup_ttl
        return replace(self, **changes)

    def enqueue_many(self, calls: Iterable[Any]) -> list[compat.TaskResult]:
        """Enqueue one task per ``(args, kwargs)`` pair, atomically, in one round trip."""
        return self.get_backend().enqueue_many(self, calls)  # type: ignore[attr-defined]

    async def aenqueue_many(self, calls: Iterable[Any]) -> list[compat.TaskResult]:
        return await self.get_backend().aenqueue_many(self, calls)  # type: ignore[attr-defined]


_scheduled: dict[tuple[str, str], Task] = {}


def scheduled_tasks(backend: str) -> list[Task]:
    """The task definitions of ``backend`` that declare a schedule, in definition order
    (the task modules must have been imported: ``discovery.discover_task_modules``)."""
    return [task for (alias, _), task in list(_scheduled.items()) if alias == backend]


def _check_key(task: Task, name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.strip() or len(value) > KEY_MAX_LENGTH:
        raise InvalidTaskOptions(
            f"{task.module_path}: {name} must be a non-empty string of at most "
            f"{KEY_MAX_LENGTH} characters, got {_short(value)}."
        )
    if "\x00" in value:
        raise InvalidTaskOptions(f"{task.module_path}: {name} must not contain NUL characters.")


def _check_run_after(task: Task) -> None:
    run_after = task.run_after
    if not isinstance(run_after, datetime) or run_after.tzinfo is None:
        return  # Django's own validation refuses naive datetimes first
    not_beyond_horizon(run_after, f"{task.module_path}: run_after", now=timezone.now())


def _short(value: Any) -> str:
    text = repr(value)
    if len(text) <= 60:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
    return f"{text[:40]}… ({size})"


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
    if timeout is not None:
        as_delay(timeout, f"{task.module_path}: timeout")
    if task.ordering_failure not in ORDERING_FAILURES:
        raise InvalidTaskOptions(
            f"{task.module_path}: ordering_failure must be 'continue' or 'block', "
            f"got {task.ordering_failure!r}."
        )
    if task.dedup_until not in DEDUP_SCOPES:
        raise InvalidTaskOptions(
            f"{task.module_path}: dedup_until must be 'ttl' or 'finished', "
            f"got {task.dedup_until!r}."
        )
    _check_run_after(task)
    _check_key(task, "ordering_key", task.ordering_key)
    _check_key(task, "dedup_key", task.dedup_key)
    ttl = task.dedup_ttl
    if ttl is not None and (not isinstance(ttl, timedelta) or ttl <= timedelta(0)):
        raise InvalidTaskOptions(
            f"{task.module_path}: dedup_ttl must be a positive timedelta or seconds, got {ttl!r}."
        )
    if ttl is not None:
        as_delay(ttl, f"{task.module_path}: dedup_ttl")
    if task.schema is not None:
        compiled_schema(task)  # raises InvalidTaskOptions for an unusable schema
    if task.middleware != ():
        try:
            load_middleware(task.middleware, f"{task.module_path}: middleware")
        except ValueError as exc:
            raise InvalidTaskOptions(str(exc)) from exc
    if task.services != ():
        try:
            load_service_factories(task.services, f"{task.module_path}: services")
        except ValueError as exc:
            raise InvalidTaskOptions(str(exc)) from exc
    if task.enqueue_middleware != ():
        task_enqueue_middleware(task)  # raises InvalidTaskOptions for a bad entry
    breaker = getattr(task, "breaker", None)
    if breaker is not None and not isinstance(breaker, Breaker):
        raise InvalidTaskOptions(
            f"{task.module_path}: breaker must be a django_tasks_plus.Breaker, got {breaker!r}."
        )


def task_middleware(task: compat.Task) -> tuple[Any, ...]:
    """The task's own middleware entries, innermost last: its ``middleware=[...]``, then
    what the features registered in ``extensions.task_middleware`` add for it (the
    breaker's, for a task with ``breaker=``, sits right around the call it judges: an
    outer middleware that holds the task, a rate limiter, never takes the probe's turn)."""
    own = tuple(getattr(task, "middleware", ()))
    for provider in extensions.task_middleware.entries:
        own += tuple(provider(task))
    return own


def task_enqueue_middleware(task: compat.Task) -> tuple[Any, ...]:
    """The task's own enqueue middleware factories (``@task(enqueue_middleware=[...])``),
    resolved; raises ``InvalidTaskOptions`` naming a bad entry."""
    entries = getattr(task, "enqueue_middleware", ())
    if not entries:
        return ()
    try:
        return load_middleware(
            entries, f"{task.module_path}: enqueue_middleware", handles="the envelope"
        )
    except ValueError as exc:
        raise InvalidTaskOptions(str(exc)) from exc


def breaker_key(task: compat.Task, args: Any, kwargs: Any) -> str | None:
    """The stored breaker key of one call (``name/key``), or None: no breaker guards it.

    Raises ``InvalidTaskArguments`` when the key function raises or returns something
    that is not a key, so such a call is refused at enqueue, with nothing written.
    """
    breaker = getattr(task, "breaker", None)
    if breaker is None:
        return None
    where = f"Cannot enqueue {task.module_path}: its breaker key function"
    try:
        key = check_key(breaker.key(*args, **kwargs), where)
    except ValueError as exc:
        raise InvalidTaskArguments(str(exc)) from exc
    except Exception as exc:
        raise InvalidTaskArguments(f"{where} raised {type(exc).__name__}: {exc}") from exc
    return None if key is None else scoped_key(breaker.name, key)


def compiled_schema(task: compat.Task) -> PayloadSchema | None:
    """The task's compiled payload schema (cached), or None."""
    schema = getattr(task, "schema", None)
    if schema is None:
        return None
    return _compile(task.func, schema, task.takes_context, task.module_path)


@lru_cache(maxsize=1024)
def _compile(
    func: Callable[..., Any], schema: Any, takes_context: bool, where: str
) -> PayloadSchema:
    from .schema import compile_schema

    check_schema_signature(func, takes_context=takes_context, where=where)
    return compile_schema(schema, where=where)


@lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(func)


@lru_cache(maxsize=1024)
def _positional_arity(func: Callable[..., Any]) -> tuple[int, int] | None:
    """(required, total) for functions of plain positional-or-keyword parameters only.

    Lets the common call (positional arguments, no keywords) be checked by counting,
    without ``Signature.bind``: bulk enqueues check thousands of calls.
    """
    parameters = _signature(func).parameters.values()
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters):
        return None
    required = sum(1 for p in parameters if p.default is inspect.Parameter.empty)
    return required, len(parameters)


def check_arguments(task: compat.Task, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Fail at enqueue, not in the worker, when the call cannot bind to the function."""
    leading = (None,) if task.takes_context else ()
    if not kwargs:
        arity = _positional_arity(task.func)
        if arity is not None and arity[0] <= len(leading) + len(args) <= arity[1]:
            return
    try:
        _signature(task.func).bind(*leading, *args, **kwargs)
    except TypeError as exc:
        raise InvalidTaskArguments(
            f"{task.module_path}() cannot be called with these arguments: {exc}"
        ) from exc


class CallRules:
    """What each call of one task is checked against at enqueue, looked up once per
    ``enqueue()``/``enqueue_many()`` (the build step, ``envelope.build``), not per call."""

    __slots__ = ("_arity", "_breaker", "_leading", "_schema", "_task")

    def __init__(self, task: compat.Task) -> None:
        self._task = task
        self._schema = compiled_schema(task)
        self._breaker = getattr(task, "breaker", None)
        self._leading = 1 if task.takes_context else 0
        self._arity = _positional_arity(task.func) if self._schema is None else None

    def payload(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments to store: validated by the schema (stored by name, so a later
        deploy can re-validate them), else checked against the signature."""
        task = self._task
        if self._schema is not None:
            payload = bind_payload(task.func, args, kwargs, takes_context=task.takes_context)
            return (), self._schema.validate(payload)
        args, kwargs = tuple(args), dict(kwargs)
        arity = self._arity
        if kwargs or arity is None or not arity[0] <= self._leading + len(args) <= arity[1]:
            check_arguments(task, args, kwargs)
        return args, kwargs

    def breaker_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """The call's stored breaker key (``breaker_key``), or None without a breaker."""
        return None if self._breaker is None else breaker_key(self._task, args, kwargs)


_resolved: dict[str, compat.Task] = {}
_MISSING = object()


def resolve_task(path: str) -> compat.Task:
    """The ``Task`` object a stored row names; refuse anything that is not a task.

    A row's path is attacker-controlled data, so resolving it must run no code the row
    chooses. The rule: the path's module must be imported already (in ``sys.modules``)
    or belong to an installed app (the app's package or a submodule of it); only then is
    it imported. Any other path (``this.x``, ``venv.__main__.x``) is refused without
    importing anything. The attribute is read from the module's namespace, never through
    a module ``__getattr__``, and only an object created by a task decorator is returned,
    so ``os.system`` is refused too.

    Whatever module code raises during an allowed import, ``SystemExit`` and other
    ``BaseException`` included, becomes ``TaskNotRegistered``: every caller (worker,
    reaper, ``get_result``, admin actions) gets a bad row, not a dead process or thread.
    """
    found = _resolved.get(path)
    if found is not None:
        return found
    module_name, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
    if not module_name or not all(part.isidentifier() for part in path.split(".")):
        raise TaskNotRegistered(
            f"{path!r} cannot be imported: a task path is a dotted name 'module.function'."
        )
    if module_name not in sys.modules and not _in_installed_app(module_name):
        raise TaskNotRegistered(
            f"{path!r} cannot be imported: module {module_name!r} is not imported and is "
            "not part of an installed app; a worker runs only tasks defined in an installed "
            "app or in a module imported at startup."
        )
    try:
        # Also for an imported module: import_module waits while another thread is
        # still executing it, where sys.modules would hand out a half-built module.
        module = importlib.import_module(module_name)
        obj = vars(module).get(name, _MISSING)
    except BaseException as exc:  # module code may raise anything, even SystemExit
        raise TaskNotRegistered(
            f"{path!r} cannot be imported: importing {module_name!r} raised {_describe(exc)}"
        ) from exc
    if obj is _MISSING:
        raise TaskNotRegistered(
            f"{path!r} cannot be imported: module {module_name!r} defines no {name!r}."
        )
    # type(), not isinstance(): a lazy object's __class__ property would run its code.
    if not issubclass(type(obj), compat.Task):
        raise TaskNotRegistered(
            f"{path!r} is a {type(obj).__name__}, not a task; only functions decorated "
            "with @task are run."
        )
    if obj.module_path != path:
        raise TaskNotRegistered(f"{path!r} resolves to the task {obj.module_path!r}.")
    _resolved[path] = obj
    return obj


def _in_installed_app(module_name: str) -> bool:
    """Whether ``module_name`` is an installed app's package or one of its submodules."""
    return any(
        module_name == config.name or module_name.startswith(config.name + ".")
        for config in apps.get_app_configs()
    )


def _describe(exc: BaseException) -> str:
    """``Type: message`` for an exception from foreign code, even if its ``__str__`` fails."""
    kind = type(exc).__name__
    try:
        text = str(exc)
    except BaseException:
        return f"{kind} (its message could not be formatted)"
    return f"{kind}: {text}" if text else kind


def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = compat.DEFAULT_TASK_PRIORITY,
    queue_name: str = compat.DEFAULT_TASK_QUEUE_NAME,
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    schema: Any = None,
    ordering_failure: str | None = None,
    middleware: list[Any] | tuple[Any, ...] | None = None,
    breaker: Breaker | None = None,
    services: list[Any] | tuple[Any, ...] | None = None,
    enqueue_middleware: list[Any] | tuple[Any, ...] | None = None,
    schedule: Any = None,
    schedules: list[Any] | tuple[Any, ...] | None = None,
) -> Any:
    """Django's ``@task`` with our options spelled out (for editors and type checkers).

    Options left at their defaults are not passed on, so the decorator still works with
    a backend that is not ours (for example Django's ``ImmediateBackend`` in tests).
    """
    options = {
        "retry": retry,
        "timeout": timeout,
        "schema": schema,
        "ordering_failure": ordering_failure,
        "middleware": middleware,
        "breaker": breaker,
        "services": services,
        "enqueue_middleware": enqueue_middleware,
        "schedule": schedule,
        "schedules": schedules,
    }
    extra = {name: value for name, value in options.items() if value is not None}
    # Django's task() hands keywords it does not know to the task class (ours).
    decorator = compat.django_task(  # type: ignore[call-overload]
        priority=priority,
        queue_name=queue_name,
        backend=backend,
        takes_context=takes_context,
        **extra,
    )
    return decorator(function) if function is not None else decorator
