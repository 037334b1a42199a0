"""The schedule table: syncing declared schedules into it, and firing due occurrences.

Firing one schedule is one transaction on the backend's database: lock the schedule's
row, decide with ``timing.plan``, insert each occurrence (unique per schedule and time)
and enqueue its task on the same connection, store the task id on the occurrence, move
``next_at`` on. A second scheduler (a new leader while the old one still fires) waits
for the row lock, then finds ``next_at`` moved; should it ever get past that, the unique
constraint refuses the occurrence and its enqueue rolls back with it. So each
(schedule, occurrence) is enqueued exactly once; the task itself runs at least once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from .. import events
from ..conf import BackendSettings
from ..models import ScheduleOccurrence, ScheduleRecord, TaskRecord
from .declared import CODE, SETTINGS, Definition, task_for
from .errors import InvalidSchedule
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


def due_ids(settings: BackendSettings, now: datetime) -> list[int]:
    """The backend's schedules whose next occurrence has come (enabled, not paused)."""
    return list(
        ScheduleRecord.objects.using(settings.database)
        .filter(backend_name=settings.alias, enabled=True, paused=False, next_at__lte=now)
        .order_by("next_at")
        .values_list("pk", flat=True)
    )


def fire_due(settings: BackendSettings, clock: Callable[[], datetime]) -> int:
    """Fire every due schedule of the backend, one transaction each; returns how many
    occurrences were enqueued. One schedule's failure does not stop the others."""
    fired = 0
    for pk in due_ids(settings, clock()):
        try:
            fired += fire_one(settings, pk, clock)
        except Exception:
            logger.exception("Schedule %s: firing failed; will retry on the next tick", pk)
    return fired


def fire_one(settings: BackendSettings, pk: int, clock: Callable[[], datetime]) -> int:
    database = settings.database
    notices: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    fired = 0
    with transaction.atomic(using=database):
        row = (
            ScheduleRecord.objects.using(database)
            .select_for_update()
            .filter(pk=pk, enabled=True, paused=False)
            .first()
        )
        now = clock()
        if row is None or row.next_at is None or row.next_at > now:
            return 0  # fired by another scheduler meanwhile, paused or disabled
        definition = definition_of(row)
        tz = zone(definition.timezone, definition.name)
        decision = plan(
            definition.spec,
            row.next_at,
            now,
            tz,
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
        for at in decision.fire:
            reason = skip_reason(row, definition, database)
            if reason:
                if record(row, at, database, action="skipped", reason=reason):
                    notices.append((SCHEDULE_SKIPPED, {}, {**labels, "at": at, "reason": reason}))
                continue
            task_id, problem = enqueue_occurrence(row, definition, at, database)
            if task_id is not None:
                fired += 1
                notices.append((SCHEDULE_FIRED, {}, {**labels, "at": at, "task_id": task_id}))
            elif problem:
                notices.append((SCHEDULE_SKIPPED, {}, {**labels, "at": at, "reason": problem}))
        row.next_at = decision.next_at
        row.save(update_fields=["next_at", "last_fired_at", "last_task_id"], using=database)
        transaction.on_commit(lambda: emit_all(notices), using=database)
    return fired


def skip_reason(row: ScheduleRecord, definition: Definition, database: str) -> str:
    """Why this occurrence is not enqueued ("" when it is)."""
    if definition.overlap != "allow" and row.last_task_id is not None:
        status = (
            TaskRecord.objects.using(database)
            .filter(pk=row.last_task_id)
            .values_list("status", flat=True)
            .first()
        )
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
    """Record the occurrence and enqueue its task, in the caller's transaction: the task
    id, or None with "" when the occurrence was acted on before, or None with why its
    task could not be enqueued (then it is recorded as skipped, with that reason)."""
    occurrence = record(row, at, database, action=action)
    if occurrence is None:
        return None, ""
    try:
        with transaction.atomic(using=database):
            result = task_for(definition).enqueue(*definition.args, **dict(definition.kwargs))
    except Exception as exc:  # a bad task path or arguments: the schedule's problem, not ours
        reason = f"{type(exc).__name__}: {exc}"[:200]
        logger.error("Schedule %r: not enqueued at %s: %s", row.name, at.isoformat(), reason)
        occurrence.action, occurrence.reason = "skipped", reason
        occurrence.save(update_fields=["action", "reason"], using=database)
        return None, reason
    occurrence.task_id = result.id
    occurrence.save(update_fields=["task_id"], using=database)
    row.last_fired_at, row.last_task_id = at, result.id
    return str(result.id), ""


def emit_all(notices: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
    for name, measurements, metadata in notices:
        events.emit(name, measurements, metadata)


__all__ = [
    "EVENT_NAMES",
    "InvalidSchedule",
    "SyncReport",
    "definition_of",
    "fire_due",
    "fire_one",
    "sync",
]
