"""Schedules at runtime: create, update, pause, resume, run now, delete, get.

Every function takes the backend alias (``"default"`` unless given) and raises a typed
error (``InvalidSchedule``, ``ScheduleNotFound``, ``ScheduleNotEditable``) with nothing
written. Schedules from code and settings are edited there: only pause, resume and
run-now apply to them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from ..compat import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_PRIORITY
from ..db import dialect_for
from ..db.rowlock import OPERATOR_LOCK_WAIT, lock_refused_as
from ..exceptions import DedupKeyLocked
from ..models import ScheduleRecord
from ..operations import database_backend
from .declared import RUNTIME, Definition, default_timezone, validated
from .errors import InvalidSchedule, ScheduleLocked, ScheduleNotEditable, ScheduleNotFound
from .store import definition_of, definition_values, enqueue_occurrence, first_occurrence
from .timing import DEFAULT_CATCH_UP, DEFAULT_CATCH_UP_CAP, Cron, Every, as_spec


def _database(backend: str) -> str:
    return database_backend(backend, needed_by="schedules").settings.database


def get(name: str, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> ScheduleRecord:
    """The stored schedule called ``name``."""
    row = ScheduleRecord.objects.using(_database(backend)).filter(name=name).first()
    if row is None:
        raise ScheduleNotFound(f"No schedule is called {name!r}.")
    return row


def create(
    name: str,
    task: Any,
    when: str | Every | Cron,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int = DEFAULT_TASK_PRIORITY,
    timezone_name: str | None = None,
    catch_up: str = DEFAULT_CATCH_UP,
    catch_up_cap: int = DEFAULT_CATCH_UP_CAP,
    overlap: str = "allow",
    paused: bool = False,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
) -> ScheduleRecord:
    """Store a new runtime schedule of ``task`` (a task or its dotted path)."""
    definition = validated(
        Definition(
            name=name,
            backend=backend,
            task_path=task if isinstance(task, str) else task.module_path,
            spec=as_spec(when, name) if isinstance(name, str) else Every(seconds=1),
            timezone=timezone_name or default_timezone(),
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            queue=queue,
            priority=priority,
            catch_up=catch_up,
            catch_up_cap=catch_up_cap,
            overlap=overlap,
            source=RUNTIME,
        )
    )
    database = _database(backend)
    with transaction.atomic(using=database):
        if ScheduleRecord.objects.using(database).filter(name=name).exists():
            raise InvalidSchedule(f"A schedule called {name!r} exists already.")
        return ScheduleRecord.objects.using(database).create(
            name=name,
            paused=paused,
            next_at=first_occurrence(definition, timezone.now()),
            **definition_values(definition),
        )


UPDATABLE = frozenset(
    {"task", "when", "args", "kwargs", "queue", "priority", "timezone_name", "catch_up"}
    | {"catch_up_cap", "overlap"}
)


def update(
    name: str,
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    lock_wait: float = OPERATOR_LOCK_WAIT,
    **changes: Any,
) -> ScheduleRecord:
    """Change a runtime schedule (the keywords of ``create``); a new timing restarts it
    from its next occurrence."""
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise InvalidSchedule(f"Schedule {name!r}: cannot update {sorted(unknown)}.")
    database = _database(backend)
    with transaction.atomic(using=database):
        row = _locked(name, database, lock_wait)
        if row.source != RUNTIME:
            raise ScheduleNotEditable(
                f"Schedule {name!r} is defined in {row.source}: edit it there (pause, resume "
                "and run-now work here)."
            )
        current = definition_of(row)
        task = changes.get("task", current.task_path)
        new = validated(
            Definition(
                name=name,
                backend=row.backend_name,
                task_path=task if isinstance(task, str) else task.module_path,
                spec=as_spec(changes["when"], name) if "when" in changes else current.spec,
                timezone=changes.get("timezone_name", current.timezone),
                args=tuple(changes.get("args", current.args)),
                kwargs=dict(changes.get("kwargs", current.kwargs)),
                queue=changes.get("queue", current.queue),
                priority=changes.get("priority", current.priority),
                catch_up=changes.get("catch_up", current.catch_up),
                catch_up_cap=changes.get("catch_up_cap", current.catch_up_cap),
                overlap=changes.get("overlap", current.overlap),
                source=RUNTIME,
            )
        )
        for field, value in definition_values(new).items():
            setattr(row, field, value)
        if new.spec != current.spec or new.timezone != current.timezone:
            row.next_at = first_occurrence(new, timezone.now())
        row.save(using=database)
        return row


def pause(
    name: str, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS, lock_wait: float = OPERATOR_LOCK_WAIT
) -> ScheduleRecord:
    """Stop firing ``name`` until resumed."""
    database = _database(backend)
    with transaction.atomic(using=database):
        row = _locked(name, database, lock_wait)
        row.paused = True
        row.save(update_fields=["paused", "updated_at"], using=database)
        return row


def resume(
    name: str,
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    now: datetime | None = None,
    lock_wait: float = OPERATOR_LOCK_WAIT,
) -> ScheduleRecord:
    """Fire ``name`` again from its next occurrence after now: the paused time is not
    missed (nothing is caught up for it)."""
    database = _database(backend)
    with transaction.atomic(using=database):
        row = _locked(name, database, lock_wait)
        if row.paused:
            row.paused = False
            row.next_at = first_occurrence(definition_of(row), now or timezone.now())
            row.save(update_fields=["paused", "next_at", "updated_at"], using=database)
        return row


def run_now(
    name: str, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS, lock_wait: float = OPERATOR_LOCK_WAIT
) -> str:
    """Enqueue ``name``'s task once, now, besides its schedule; returns the task id."""
    database = _database(backend)
    with transaction.atomic(using=database):
        row = _locked(name, database, lock_wait)
        try:
            task_id, problem = enqueue_occurrence(
                row, definition_of(row), timezone.now(), database, action="run_now"
            )
        except DedupKeyLocked as exc:
            raise ScheduleLocked(
                f"Schedule {name!r} could not run: {exc}", waited=exc.waited
            ) from exc
        if task_id is None:
            raise InvalidSchedule(f"Schedule {name!r} could not run: {problem or 'try again'}.")
        row.save(update_fields=["last_fired_at", "last_task_id"], using=database)
        return task_id


def delete(
    name: str, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS, lock_wait: float = OPERATOR_LOCK_WAIT
) -> None:
    """Delete a runtime schedule and its history (code and settings ones: pause them)."""
    database = _database(backend)
    with transaction.atomic(using=database):
        row = _locked(name, database, lock_wait)
        if row.source != RUNTIME:
            raise ScheduleNotEditable(
                f"Schedule {name!r} is defined in {row.source}: remove it there, or pause it."
            )
        row.delete(using=database)


def _locked(name: str, database: str, lock_wait: float) -> ScheduleRecord:
    """``name``'s row, locked until the caller's transaction ends; waits for another
    session's lock at most ``lock_wait`` seconds (then ``ScheduleLocked``), as an
    operator's change to a task does (``db/rowlock.py``)."""
    connection = connections[database]
    rows = ScheduleRecord.objects.using(database).select_for_update().filter(name=name)
    refused = lock_refused_as(
        database,
        lambda _waited: ScheduleLocked(
            f"Schedule {name!r}: another database session holds its row locked (a "
            f"transaction still open); waited {lock_wait:g} s and changed nothing. "
            "Try again once that transaction ends.",
            waited=lock_wait,
        ),
    )
    with refused, dialect_for(connection).lock_wait_bounded(connection, lock_wait):
        row = rows.first()
    if row is None:
        raise ScheduleNotFound(f"No schedule is called {name!r}.")
    return row
