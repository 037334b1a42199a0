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

from django.db import IntegrityError, InterfaceError, OperationalError, connections, transaction
from django.db.models import Field

from .. import events
from ..conf import BackendSettings
from ..db import dialect_for
from ..exceptions import DedupKeyLocked
from ..models import ScheduleOccurrence, ScheduleRecord, TaskRecord
from .declared import CODE, SETTINGS, Definition, task_for
from .errors import InvalidSchedule
from .occurrence import occurrence_metadata
from .timing import Cron, Every, Spec, overlap_skips, plan_for, resume_at, zone

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


# Seconds a sync waits for the schedule rows it changes. A row another session keeps
# locked fails the sync (tried again on the next tick) rather than holding up firing.
SYNC_LOCK_WAIT = 1.0


def sync(settings: BackendSettings, declared: Iterable[Definition], now: datetime) -> SyncReport:
    """Make the table match the schedules declared in code and settings: a new one is
    created, a changed one updated (its next occurrence recomputed when its timing
    changed), one no longer declared disabled (never deleted: its history stays)."""
    created, updated, disabled = [], [], []
    wanted = {definition.name: definition for definition in declared}
    connection = connections[settings.database]
    with (
        transaction.atomic(using=settings.database),
        dialect_for(connection).lock_wait_bounded(connection, SYNC_LOCK_WAIT),
    ):
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

FIRE_LOCK_WAIT = 1.0
"""Seconds any statement of a firing waits for a lock another session holds: above all
a task's dedup key that an uncommitted transaction is taking (``DedupKeyLocked``). The
scheduler shares its session with the heartbeat and leadership, so such a schedule is
left due and fired on a later tick rather than waited for."""

BATCH_SIZE = 100
"""Due schedules fired in one transaction. A commit per schedule made 1,000 schedules due
at once take 17-40 s; a batch locks its rows in one statement, enqueues one INSERT per
occurrence, records the occurrences in one and moves the rows on in one, then commits
once, yet stays short: the rows it locks (an operator's pause waits for them) are held
for a fraction of a second. bench/schedule_tick.py measures it."""

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
    many occurrences were enqueued.

    A batch is all or nothing: when anything in it fails (a task that cannot be enqueued,
    an occurrence recorded meanwhile), it rolls back whole and its schedules are fired
    again one per transaction, each occurrence in a savepoint of its own, so a broken
    schedule is recorded as skipped, with why, and holds up no other."""
    fired = 0
    due = due_ids(settings, clock())
    for start in range(0, len(due), BATCH_SIZE):
        batch = due[start : start + BATCH_SIZE]
        try:
            fired += fire_batch(settings, batch, clock)
            continue
        except (OperationalError, InterfaceError) as exc:
            if not locked_out(settings.database, exc):
                raise  # the database is unreachable or busy: the tick retries later
            logger.info(
                "A batch of %s schedules met a lock (%s); firing them one by one", len(batch), exc
            )
        except Exception as exc:
            logger.info(
                "A batch of %s schedules rolled back (%s); firing them one by one", len(batch), exc
            )
        for pk in batch:
            try:
                fired += fire_one(settings, pk, clock)
            except Exception as exc:
                if locked_out(settings.database, exc):
                    logger.warning(
                        "Schedule %s: not fired (%s); will retry on the next tick", pk, exc
                    )
                else:
                    logger.exception("Schedule %s: firing failed; will retry on the next tick", pk)
    return fired


def locked_out(database: str, exc: BaseException) -> bool:
    """Whether ``exc`` is a lock another session holds (a dedup key being taken, a row):
    the schedule stays due and fires once the lock is gone."""
    if isinstance(exc, DedupKeyLocked):
        return True
    return isinstance(exc, OperationalError) and dialect_for(
        connections[database]
    ).lock_not_available(exc)


def fire_one(settings: BackendSettings, pk: int, clock: Callable[[], datetime]) -> int:
    """Fire schedule ``pk`` if it is due, in a transaction of its own, each occurrence in
    a savepoint: one that cannot be enqueued is recorded as skipped."""
    return fire_batch(settings, [pk], clock, careful=True)


class Firing:
    """One transaction's firing: what it learnt once for all its schedules (the last
    runs' statuses, the occurrences recorded already, the tasks resolved) and what it
    writes at the end (occurrence rows, events)."""

    def __init__(self, settings: BackendSettings, rows: list[ScheduleRecord], careful: bool):
        self.settings = settings
        self.database = settings.database
        self.careful = careful
        self.statuses = last_run_statuses(rows, self.database)
        self.acted = acted_on(rows, self.database)
        self.occurrences: list[ScheduleOccurrence] = []
        self.notices: list[Notice] = []
        self._tasks: dict[tuple[Any, ...], Any] = {}

    def task(self, definition: Definition) -> Any:
        key = (definition.task_path, definition.priority, definition.queue, definition.backend)
        if key not in self._tasks:
            self._tasks[key] = task_for(definition)
        return self._tasks[key]


def fire_batch(
    settings: BackendSettings,
    pks: list[int],
    clock: Callable[[], datetime],
    *,
    careful: bool = False,
) -> int:
    """Fire the schedules ``pks`` that are still due, in one transaction: lock their rows,
    fire each, record the occurrences and move the rows on. ``careful``: each occurrence
    in a savepoint, a failed enqueue recorded as skipped; else any failure raises.

    A row another session holds locked (another scheduler firing it, an operator's or
    the application's open transaction editing it) is skipped, not waited for: it stays
    due, so it is fired on a later tick, and one locked row never holds up the others
    (nor can two schedulers deadlock)."""
    database = settings.database
    connection = connections[database]
    bounded = dialect_for(connection).lock_wait_bounded(connection, FIRE_LOCK_WAIT)
    with transaction.atomic(using=database), bounded:
        locked = list(
            ScheduleRecord.objects.using(database)
            .select_for_update(skip_locked=True)
            .filter(pk__in=pks, enabled=True, paused=False)
            .order_by("pk")
        )
        now = clock()
        # A row whose next_at is later was fired by another scheduler meanwhile.
        due = [row for row in locked if row.next_at is not None and row.next_at <= now]
        if not due:
            return 0
        firing = Firing(settings, due, careful)
        fired = sum(fire_locked(firing, row, now) for row in due)
        ScheduleOccurrence.objects.using(database).bulk_create(firing.occurrences)
        save_progress(due, database)
        if firing.notices:
            transaction.on_commit(partial(emit_all, firing.notices), using=database)
    return fired


def fire_locked(firing: Firing, row: ScheduleRecord, now: datetime) -> int:
    """Act on one locked, due schedule: enqueue (or skip) each occurrence its plan fires,
    note what it missed, move ``row.next_at`` on (the caller saves the row)."""
    definition = definition_of(row)
    decision = plan_for(
        definition.spec,
        cast(datetime, row.next_at),
        now,
        zone(definition.timezone, definition.name),
        definition.name,
        catch_up=definition.catch_up,
        cap=definition.catch_up_cap,
    )
    labels = {
        "backend": firing.settings.alias,
        "schedule": row.name,
        "task_path": row.task_path,
        "queue": row.queue_name or None,
    }
    notices = firing.notices
    if decision.missed:
        notices.append((SCHEDULE_MISSED, {"count": decision.missed}, labels))
    fired = 0
    for at in decision.fire:
        if (row.pk, at) in firing.acted:
            continue  # recorded by another scheduler already
        reason = skip_reason(row, definition, firing.statuses)
        if reason:
            firing.occurrences.append(
                ScheduleOccurrence(schedule=row, at=at, action="skipped", reason=reason)
            )
            notices.append((SCHEDULE_SKIPPED, {}, {**labels, "at": at, "reason": reason}))
            continue
        if firing.careful:
            task_id, problem = enqueue_occurrence(row, definition, at, firing.database)
        else:
            task_id, problem = enqueue_in_batch(firing, row, definition, at), ""
        if task_id is not None:
            fired += 1
            firing.statuses[task_id] = "READY"
            notices.append((SCHEDULE_FIRED, {}, {**labels, "at": at, "task_id": task_id}))
        elif problem:
            notices.append((SCHEDULE_SKIPPED, {}, {**labels, "at": at, "reason": problem}))
    row.next_at = decision.next_at
    return fired


def enqueue_in_batch(
    firing: Firing, row: ScheduleRecord, definition: Definition, at: datetime
) -> str:
    """Enqueue an occurrence's task in the batch's transaction (no savepoint: a failure
    rolls the batch back); its occurrence row is inserted with the batch's."""
    task = firing.task(definition)
    [result] = task.get_backend().enqueue_many(
        task,
        [(definition.args, dict(definition.kwargs))],
        metadata=occurrence_metadata(row.name, at),
    )
    firing.occurrences.append(
        ScheduleOccurrence(schedule=row, at=at, action="fired", task_id=result.id)
    )
    row.last_fired_at, row.last_task_id = at, result.id
    return str(result.id)


def save_progress(rows: list[ScheduleRecord], database: str) -> None:
    """Store each row's ``next_at`` and last run: one statement sent for all of them (a
    bulk_update's CASE expressions cost more to build than the rows to write)."""
    connection = connections[database]
    meta = ScheduleRecord._meta
    fields = [
        cast(Field, meta.get_field(name)) for name in ("next_at", "last_fired_at", "last_task_id")
    ]
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(str(field.column))} = %s" for field in fields)
    where = f"{quote(str(meta.pk.column))} = %s"
    sql = f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {where}"
    params = [
        [field.get_db_prep_save(getattr(row, field.attname), connection) for field in fields]
        + [row.pk]
        for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def last_run_statuses(rows: Iterable[ScheduleRecord], database: str) -> dict[str, str]:
    """The status of the last run of each schedule that skips overlapping runs, by task
    id, in one query (a pruned task is absent: not busy)."""
    ids = [row.last_task_id for row in rows if row.overlap != "allow" and row.last_task_id]
    if not ids:
        return {}
    found = TaskRecord.objects.using(database).filter(pk__in=ids).values_list("pk", "status")
    return {str(pk): status for pk, status in found}


def acted_on(rows: list[ScheduleRecord], database: str) -> set[tuple[int, datetime]]:
    """The (schedule, occurrence) pairs at or after the rows' ``next_at`` recorded already
    (a scheduler that read a row before another one moved it on), in one query: only
    the row's lock holder inserts occurrences, so none appears meanwhile."""
    since = min(cast(datetime, row.next_at) for row in rows)
    found = ScheduleOccurrence.objects.using(database).filter(
        schedule_id__in=[row.pk for row in rows], at__gte=since
    )
    return set(found.values_list("schedule_id", "at"))


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
    a savepoint of the caller's transaction: the task id; or None with "" when the
    occurrence was acted on before (the unique constraint refuses it, and its enqueue is
    rolled back); or None with why its task could not be enqueued (then it is recorded as
    skipped, with that reason). The task's metadata names the schedule and the
    occurrence (``occurrence.occurrence_of``)."""
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
        if locked_out(database, exc):
            raise  # not the schedule's problem, and passing: fired once the lock is gone
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
