"""Building Django ``TaskResult`` objects from stored rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

from . import compat
from .codec import DecodeError, display_call, from_json
from .exceptions import CorruptTaskRecord
from .lifecycle import ClaimedTask
from .stored import error_list

if TYPE_CHECKING:
    from .models import TaskRecord


def task_errors(errors: Any) -> list[compat.TaskError]:
    """Django's ``TaskError`` per recorded failure (extra keys stay in the row).

    A corrupt ``errors`` column shows as one ``CorruptTaskRecord`` entry holding it.
    """
    return [
        compat.TaskError(
            exception_class_path=str(error.get("exception_class_path", "")),
            traceback=str(error.get("traceback", "")),
        )
        for error in error_list(errors)
    ]


# ``task_as_stored(run_after=...)`` left out: keep the definition's value.
_UNKNOWN: Any = object()


def task_as_stored(
    task: compat.Task, *, priority: int, queue_name: str, run_after: Any = _UNKNOWN
) -> compat.Task:
    """``task`` with the per-call values the row was enqueued with.

    ``run_after`` is the value the caller gave (``None``: "as soon as possible", as Django
    means it), not the row's ``run_after`` column, which retries and deferrals move.
    """
    changes: dict[str, Any] = {}
    if task.priority != priority:
        changes["priority"] = priority
    if task.queue_name != queue_name:
        changes["queue_name"] = queue_name
    if run_after is not _UNKNOWN and task.run_after != run_after:
        changes["run_after"] = run_after
    if not changes:
        return task
    try:
        return dataclasses.replace(task, **changes)
    except Exception:  # the settings changed since (queue removed…): show the definition
        return task


def make_result(
    task: compat.Task,
    *,
    id: str,
    status: str,
    backend: str,
    args: Any,
    kwargs: Any,
    enqueued_at: datetime | None,
    started_at: datetime | None,
    finished_at: datetime | None,
    last_attempted_at: datetime | None,
    errors: Iterable[Mapping[str, Any]] = (),
    worker_ids: Iterable[str] = (),
    return_value: Any = None,
) -> compat.TaskResult:
    """A ``TaskResult`` of stored (or display-ready) values.

    Each slot is set through its descriptor, as ``clone_results`` does: the dataclass
    ``__init__`` sets thirteen frozen fields one ``object.__setattr__`` at a time and its
    ``__post_init__`` copies the arguments through ``normalize_json``, a no-op for the
    plain JSON every caller passes; together most of a result's cost, paid once per
    single enqueue and once per attempt. A ``TaskResult`` with other fields than these
    (another Django) is built the documented way.
    """
    status = status if type(status) is compat.TaskResultStatus else compat.TaskResultStatus(status)
    args = list(args) if isinstance(args, list | tuple) else []
    kwargs = dict(kwargs) if isinstance(kwargs, Mapping) else {}
    shown_errors = [] if type(errors) in _EMPTY_SEQUENCES and not errors else task_errors(errors)
    build = _result_builder(compat.TaskResult)
    if build is not None:
        return build(
            task,
            id,
            status,
            enqueued_at,
            started_at,
            finished_at,
            last_attempted_at,
            args,
            kwargs,
            backend,
            shown_errors,
            list(worker_ids),
            return_value,
        )
    built: compat.TaskResult = compat.TaskResult(
        task=task,
        id=id,
        status=status,
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=shown_errors,
        worker_ids=list(worker_ids),
    )
    object.__setattr__(built, "_return_value", return_value)
    return built


_EMPTY_SEQUENCES = (tuple, list)  # no errors yet: most results (a null column is corrupt)

# ``TaskResult``'s fields in ``make_result``'s order; the last is not an init field.
_RESULT_FIELDS = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
)


@lru_cache(maxsize=4)
def _result_builder(cls: type) -> Callable[..., Any] | None:
    """A function of ``_RESULT_FIELDS``' values, in order, that builds a ``cls`` slot by
    slot, if ``cls`` is a slots dataclass with exactly those fields; None otherwise.

    The thirteen setters are the closure's own names, called one after the other: a
    loop over them (``zip`` of setters and values) took two thirds of a result's time.
    """
    setters = _slot_setters(cls)
    if setters is None or not dataclasses.is_dataclass(cls):
        return None
    if {field.name for field in dataclasses.fields(cls)} != set(_RESULT_FIELDS):
        return None
    (
        set_task,
        set_id,
        set_status,
        set_enqueued_at,
        set_started_at,
        set_finished_at,
        set_last_attempted_at,
        set_args,
        set_kwargs,
        set_backend,
        set_errors,
        set_worker_ids,
        set_return_value,
    ) = (setters[name] for name in _RESULT_FIELDS)
    new = object.__new__

    def build(
        task: Any,
        id: Any,
        status: Any,
        enqueued_at: Any,
        started_at: Any,
        finished_at: Any,
        last_attempted_at: Any,
        args: Any,
        kwargs: Any,
        backend: Any,
        errors: Any,
        worker_ids: Any,
        return_value: Any,
    ) -> Any:
        result = new(cls)
        set_task(result, task)
        set_id(result, id)
        set_status(result, status)
        set_enqueued_at(result, enqueued_at)
        set_started_at(result, started_at)
        set_finished_at(result, finished_at)
        set_last_attempted_at(result, last_attempted_at)
        set_args(result, args)
        set_kwargs(result, kwargs)
        set_backend(result, backend)
        set_errors(result, errors)
        set_worker_ids(result, worker_ids)
        set_return_value(result, return_value)
        return result

    return build


def clone_results(
    template: compat.TaskResult, calls: Iterable[tuple[str, list[Any], dict[str, Any]]]
) -> list[compat.TaskResult]:
    """Results like ``template`` (same task, status and times), one per ``(id, args,
    kwargs)`` call.

    Skips the dataclass ``__init__``/``__post_init__``, whose JSON normalisation of the
    arguments is a no-op here (they are display-ready JSON already): for ``enqueue_many``
    of thousands of tasks, building results was the largest cost after encoding. Each
    slot is set through its descriptor, the template's values read once per batch.
    """
    setters = _slot_setters(cast(type, type(template)))  # django-stubs: not Hashable
    if setters is None:  # not a slots dataclass: take the documented road
        return [dataclasses.replace(template, id=i, args=a, kwargs=k) for i, a, k in calls]
    shared = [
        (setter, getattr(template, name))
        for name, setter in setters.items()
        if name not in _PER_CALL and name not in _FRESH_LISTS
    ]
    set_id, set_args, set_kwargs = (setters[name] for name in _PER_CALL)
    set_errors, set_worker_ids = (setters[name] for name in _FRESH_LISTS)
    cls, new = type(template), object.__new__
    results = []
    for task_id, args, kwargs in calls:
        clone = new(cls)
        for setter, value in shared:
            setter(clone, value)
        set_id(clone, task_id)
        set_args(clone, args)
        set_kwargs(clone, kwargs)
        set_errors(clone, [])  # never share the mutable lists
        set_worker_ids(clone, [])
        results.append(clone)
    return results


# The fields a clone gets from its call, and the mutable lists it must not share.
_PER_CALL = ("id", "args", "kwargs")
_FRESH_LISTS = ("errors", "worker_ids")


@lru_cache(maxsize=4)
def _slot_setters(cls: type) -> dict[str, Callable[[Any, Any], None]] | None:
    """Each slot's descriptor ``__set__`` (which a frozen dataclass's ``__setattr__``
    does not guard), by name, the most derived class's first; None if ``cls`` has no
    slots or lacks one a clone sets (a Django that changed its ``TaskResult``)."""
    if "__dict__" in dir(cls) or not hasattr(cls, "__slots__"):
        return None
    setters: dict[str, Callable[[Any, Any], None]] = {}
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if not name.startswith("__"):
                setters.setdefault(name, vars(klass)[name].__set__)
    if any(name not in setters for name in _PER_CALL + _FRESH_LISTS):
        return None
    return setters


def _shown(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """Stored arguments as Django's ``TaskResult`` shows them (plain JSON types)."""
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return [], {}  # corrupt row: shown empty, dead-lettered by the worker
    try:
        return display_call(args, kwargs)
    except (DecodeError, RecursionError):  # deeper than any enqueue writes: corrupt
        return [], {}


# The JSON columns of a task row, in the order a corrupt one is looked for.
_JSON_COLUMNS = ("args", "kwargs", "return_value", "errors", "worker_ids", "metadata")


def unreadable_record(database: str, task_id: str) -> CorruptTaskRecord:
    """The error for a row the ORM cannot load, naming the JSON column to blame.

    Django's ``JSONField`` parses each column as the row is read, and Python's parser
    raises ``RecursionError`` for JSON nested more than about 1,500 levels (which
    PostgreSQL's ``jsonb`` and SQLite accept). Each column is read alone to find it.
    """
    from .models import TaskRecord

    rows = TaskRecord.objects.using(database).filter(pk=task_id)
    column = "args"
    for name in _JSON_COLUMNS:
        try:
            list(rows.values_list(name, flat=True))
        except RecursionError:
            column = name
            break
    return CorruptTaskRecord(
        f"Task {task_id}: the stored {column} is JSON nested too deeply to be read. The row "
        "is left as it is; fix or discard it.",
        task_id=task_id,
        column=column,
    )


def stored_return_value(value: Any, task_id: str) -> Any:
    """The task's return value with its tagged types restored.

    Raises ``CorruptTaskRecord`` rather than hand back half-decoded data as if it were
    what the task returned; the row itself is left untouched.
    """
    try:
        return from_json(value, "return value")
    except DecodeError as exc:
        raise CorruptTaskRecord(
            f"Task {task_id}: the stored {exc} The row is left as it is; fix or discard it.",
            task_id=task_id,
            column="return_value",
        ) from exc


def result_from_record(task: compat.Task, record: TaskRecord) -> compat.TaskResult:
    shown = _shown(record.args, record.kwargs)
    return make_result(
        task_as_stored(
            task,
            priority=record.priority,
            queue_name=record.queue_name,
            run_after=record.requested_run_after,
        ),
        id=str(record.id),
        status=record.status,
        backend=record.backend_name,
        args=shown[0],
        kwargs=shown[1],
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        errors=record.errors,
        worker_ids=record.worker_ids or (),
        return_value=stored_return_value(record.return_value, str(record.id)),
    )


def result_from_claim(task: compat.Task, claimed: ClaimedTask, now: datetime) -> compat.TaskResult:
    """The RUNNING result a worker hands to signals and ``TaskContext``."""
    shown = _shown(claimed.args, claimed.kwargs)
    return make_result(
        task_as_stored(
            task,
            priority=claimed.priority,
            queue_name=claimed.queue_name,
            run_after=claimed.requested_run_after,
        ),
        id=claimed.id,
        status=compat.TaskResultStatus.RUNNING,
        backend=claimed.backend_name,
        args=shown[0],
        kwargs=shown[1],
        enqueued_at=claimed.enqueued_at,
        started_at=now if claimed.first_run or claimed.started_at is None else claimed.started_at,
        finished_at=None,
        last_attempted_at=now,
        errors=claimed.errors,
        worker_ids=claimed.worker_ids,
    )
