"""The schedule table: syncing declared schedules into it, and firing due occurrences.

Firing is one transaction per batch of due schedules on the backend's database: lock
their rows, decide each with ``timing.plan``, enqueue each occurrence's task on the same
connection and insert its occurrence row (unique per schedule and time) with the task's
id, in one savepoint, and move ``next_at`` on. A second scheduler (a new leader while the
old one still fires) waits for the row locks, then finds ``next_at`` moved; should it
ever get past that, the unique constraint refuses the occurrence and its enqueue rolls
back with it. So each (schedule, occurrence) is enqueued exactly once; the task itself
runs at least once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, cast

from django.db import IntegrityError, transaction

from .. import events
from ..conf import BackendSettings
from ..models import ScheduleOccurrence, ScheduleRecord, TaskRecord
from .declared import CODE, SETTINGS, Definition, task_for
from .errors import InvalidSchedule
from .occurrence import occurrence_metadata
from .timing import Cron, Every, Spec, overlap_skips, plan, resume_at, zone

logger = logging.getLogger("django_tasks_plus.schedules")

SCHEDULE_FIRED = "schedule.fired"
SCHEDULE_SKIPPED = "schedule.skipped"
SCHEDULE_MISSED = "schedule.missed"
EVENT_NAMES = (SCHEDULE_FIRED, SCHEDULE_SKIPPED, SCHEDULE_MISSED)

# The row's fields a definition sets (the rest is state: paused, next_at, last fired).
DEFINITION_FIELDS = (
    "backend_name",
    "source",
    "task_path",
    "cron",
    "every_seconds",
    "timezone",
    "args",
    "kwargs",
    "queue_name",
    "priority",
    "catch_up",
    "catch_up_cap",
    "overlap",
    "enabled",
)
TIMING_FIELDS = ("cron", "every_seconds", "timezone")


def definition_values(definition: Definition) -> dict[str, Any]:
    """The row's definition fields for ``definition``."""
    return {
        "backend_name": definition.backend,
        "source": definition.source,
        "task_path": definition.task_path,
        "cron": definition.cron,
        "every_seconds": definition.every_seconds,
        "timezone": definition.timezone,
        "args": list(definition.args),
        "kwargs": dict(definition.kwargs),
        "queue_name": definition.queue or "",
        "priority": definition.priority,
        "catch_up": definition.catch_up,
        "catch_up_cap": definition.catch_up_cap,
        "overlap": definition.overlap,
        "enabled": definition.enabled,
    }


def spec_of(row: ScheduleRecord) -> Spec:
    if row.every_seconds:
        return Every(seconds=row.every_seconds)
    return Cron(row.cron)


def definition_of(row: ScheduleRecord) -> Definition:
    return Definition(
        name=row.name,
        backend=row.backend_name,
        task_path=row.task_path,
        spec=spec_of(row),
        timezone=row.timezone,
        args=tuple(row.args or ()),
        kwargs=dict(row.kwargs or {}),
        queue=row.queue_name or None,
        priority=row.priority,
        catch_up=row.catch_up,
        catch_up_cap=row.catch_up_cap,
        overlap=row.overlap,
        enabled=row.enabled,
        source=row.source,
    )


def first_occurrence(definition: Definition, now: datetime) -> datetime:
    return resume_at(
        definition.spec, now, zone(definition.timezone, definition.name), definition.name
    )


# -- sync -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncReport:
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()


def sync(settings: BackendSettings, declared: Iterable[Definition], now: datetime) -> SyncReport:
    """Make the table match the schedules declared in code and settings: a new one is
    created, a changed one updated (its next occurrence recomputed when its timing
    changed), one no longer declared disabled (never deleted: its history stays)."""
    created, updated, disabled = [], [], []
    wanted = {definition.name: definition for definition in declared}
    with transaction.atomic(using=settings.database):
        rows = {
            row.name: row
            for row in ScheduleRecord.objects.using(settings.database)
            .select_for_update()
            .filter(name__in=list(wanted))
        }
        for name, definition in wanted.items():
            values = definition_values(definition)
            row = rows.get(name)
            if row is None:
                ScheduleRecord.objects.using(settings.database).create(
                    name=name, next_at=first_occurrence(definition, now), **values
                )
                created.append(name)
                continue
            changed = [field for field in DEFINITION_FIELDS if getattr(row, field) != values[field]]
            if not changed:
                continue
            for field in changed:
                setattr(row, field, values[field])
            if set(changed) & set(TIMING_FIELDS) or row.next_at is None:
                row.next_at = first_occurrence(definition, now)
            row.save(using=settings.database)
            updated.append(name)
        gone = (
            ScheduleRecord.objects.using(settings.database)
            .filter(backend_name=settings.alias, source__in=(CODE, SETTINGS), enabled=True)
            .exclude(name__in=list(wanted))
        )
        disabled = list(gone.values_list("name", flat=True))
        gone.update(enabled=False)
    return SyncReport(tuple(created), tuple(updated), tuple(disabled))


# -- firing ---------------------------------------------------------------------------------

BATCH_SIZE = 100
"""Due schedules fired in one transaction. A commit per schedule made 1,000 schedules due
at once take 17-40 s (one disk flush each on PostgreSQL); a batch locks its rows in one
statement and pays one commit, yet stays short, so the rows it locks (an operator's
pause waits for them) are held for a few milliseconds. bench/schedule_tick.py measures."""

Notice = tuple[str, dict[str, Any], dict[str, Any]]


def due_ids(settings: BackendSettings, now: datetime) -> list[int]:
    """The backend's schedules whose next occurrence has come (enabled, not paused)."""
    return list(
        ScheduleRecord.objects.using(settings.database)
        .filter(backend_name=settings.alias, enabled=True, paused=False, next_at__lte=now)
        .order_by("next_at")
        .values_list("pk", flat=True)
    )


def fire_due(settings: BackendSettings, clock: Callable[[], datetime]) -> int:
    """Fire every due schedule of the backend, ``BATCH_SIZE`` per transaction; returns how
    many occurrences were enqueued. A batch that fails is fired again one schedule per
    transaction, so one broken schedule does not hold up the others."""
    fired = 0
    due = due_ids(settings, clock())
    for start in range(0, len(due), BATCH_SIZE):
        batch = due[start : start + BATCH_SIZE]
        try:
            fired += fire_batch(settings, batch, clock)
        except Exception:
            if len(batch) == 1:
                logger.exception("Schedule %s: firing failed; will retry on the next tick", batch)
                continue
            logger.warning("A batch of %s schedules failed; firing them one by one", len(batch))
            for pk in batch:
                try:
                    fired += fire_batch(settings, [pk], clock)
                except Exception:
                    logger.exception("Schedule %s: firing failed; will retry on the next tick", pk)
    return fired


def fire_one(settings: BackendSettings, pk: int, clock: Callable[[], datetime]) -> int:
    """Fire schedule ``pk`` if it is due, in a transaction of its own."""
    return fire_batch(settings, [pk], clock)


def fire_batch(settings: BackendSettings, pks: list[int], clock: Callable[[], datetime]) -> int:
    """Fire the schedules ``pks`` that are still due, in one transaction: lock their rows
    (in primary key order, as every batch does, so two schedulers cannot deadlock),
    fire each, move their ``next_at`` on in one statement."""
    database = settings.database
    notices: list[Notice] = []
    fired = 0
    with transaction.atomic(using=database):
        locked = list(
            ScheduleRecord.objects.using(database)
            .select_for_update()
            .filter(pk__in=pks, enabled=True, paused=False)
            .order_by("pk")
        )
        now = clock()
        # A row whose next_at is later was fired by another scheduler meanwhile.
        due = [row for row in locked if row.next_at is not None and row.next_at <= now]
        statuses = last_run_statuses(due, database)
        for row in due:
            fired += fire_locked(settings, row, now, statuses, notices)
        if due:
            ScheduleRecord.objects.using(database).bulk_update(
                due, ["next_at", "last_fired_at", "last_task_id"]
            )
        if notices:
            transaction.on_commit(partial(emit_all, notices), using=database)
    return fired


def fire_locked(
    settings: BackendSettings,
    row: ScheduleRecord,
    now: datetime,
    statuses: dict[str, str],
    notices: list[Notice],
) -> int:
    """Act on one locked, due schedule: record (and enqueue) each occurrence its plan
    fires, note what it missed, move ``row.next_at`` on (saved by the caller)."""
    database = settings.database
    definition = definition_of(row)
    decision = plan(
        definition.spec,
        cast(datetime, row.next_at),
        now,
        zone(definition.timezone, definition.name),
        definition.name,
        catch_up=definition.catch_up,
        cap=definition.catch_up_cap,
    )
    labels = {
        "backend": settings.alias,
        "schedule": row.name,
        "task_path": row.task_path,
        "queue": row.queue_name or None,
    }
    if decision.missed:
        notices.append((SCHEDULE_MISSED, {"count": decision.missed}, labels))
    fired = 0
    for at in decision.fire:
        reason = skip_reason(row, definition, statuses)
        if reason:
            if record(row, at, database, action="skipped", reason=reason):
                notices.append((SCHEDULE_SKIPPED, {}, {**labels, "at": at, "reason": reason}))
            continue
        task_id, problem = enqueue_occurrence(row, definition, at, database)
        if task_id is not None:
            fired += 1
            statuses[task_id] = "READY"
            notices.append((SCHEDULE_FIRED, {}, {**labels, "at": at, "task_id": task_id}))
        elif problem:
            notices.append((SCHEDULE_SKIPPED, {}, {**labels, "at": at, "reason": problem}))
    row.next_at = decision.next_at
    return fired


def last_run_statuses(rows: Iterable[ScheduleRecord], database: str) -> dict[str, str]:
    """The status of the last run of each schedule that skips overlapping runs, by task
    id, in one query (a pruned task is absent: not busy)."""
    ids = [row.last_task_id for row in rows if row.overlap != "allow" and row.last_task_id]
    if not ids:
        return {}
    found = TaskRecord.objects.using(database).filter(pk__in=ids).values_list("pk", "status")
    return {str(pk): status for pk, status in found}


def skip_reason(row: ScheduleRecord, definition: Definition, statuses: dict[str, str]) -> str:
    """Why this occurrence is not enqueued ("" when it is)."""
    if definition.overlap != "allow" and row.last_task_id is not None:
        status = statuses.get(str(row.last_task_id))
        if overlap_skips(definition.overlap, status):
            return f"the previous run {row.last_task_id} is {status}"
    return ""


def record(
    row: ScheduleRecord, at: datetime, database: str, *, action: str, reason: str = ""
) -> ScheduleOccurrence | None:
    """Insert the occurrence row; None when it exists already (acted on before)."""
    try:
        with transaction.atomic(using=database):
            return ScheduleOccurrence.objects.using(database).create(
                schedule=row, at=at, action=action, reason=reason
            )
    except IntegrityError:
        return None


def enqueue_occurrence(
    row: ScheduleRecord, definition: Definition, at: datetime, database: str, action: str = "fired"
) -> tuple[str | None, str]:
    """Enqueue the occurrence's task and record the occurrence with its id, together, in
    the caller's transaction: the task id; or None with "" when the occurrence was acted
    on before (the unique constraint refuses it, and its enqueue is rolled back); or None
    with why its task could not be enqueued (then it is recorded as skipped, with that
    reason). The task's metadata names the schedule and the occurrence
    (``occurrence.occurrence_of``)."""
    try:
        with transaction.atomic(using=database):
            task = task_for(definition)
            [result] = task.get_backend().enqueue_many(  # type: ignore[attr-defined]
                task,
                [(definition.args, dict(definition.kwargs))],
                metadata=occurrence_metadata(row.name, at),
            )
            ScheduleOccurrence.objects.using(database).create(
                schedule=row, at=at, action=action, task_id=result.id
            )
    except Exception as exc:
        if isinstance(exc, IntegrityError) and occurred(row, at, database):
            return None, ""
        # A bad task path or arguments, a full queue: the schedule's problem, not ours.
        reason = f"{type(exc).__name__}: {exc}"[:200]
        logger.error("Schedule %r: not enqueued at %s: %s", row.name, at.isoformat(), reason)
        if record(row, at, database, action="skipped", reason=reason) is None:
            return None, ""
        return None, reason
    row.last_fired_at, row.last_task_id = at, result.id
    return str(result.id), ""


def occurred(row: ScheduleRecord, at: datetime, database: str) -> bool:
    """Whether occurrence ``at`` of ``row`` is recorded already."""
    return ScheduleOccurrence.objects.using(database).filter(schedule=row, at=at).exists()


def emit_all(notices: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
    for name, measurements, metadata in notices:
        events.emit(name, measurements, metadata)


__all__ = [
    "EVENT_NAMES",
    "InvalidSchedule",
    "SyncReport",
    "definition_of",
    "fire_batch",
    "fire_due",
    "fire_one",
    "sync",
]
