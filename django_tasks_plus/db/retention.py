"""Deleting spent rows a bounded batch at a time: finished tasks, idle circuit breakers,
old schedule occurrences.

Each function deletes at most ``limit`` rows in one short transaction and returns how
many it deleted, so a caller repeats it until fewer come back. Small transactions keep
row locks short and the write-ahead log of each one bounded, so a pruner working through
a million rows never holds up the claims and outcomes running beside it. Every DELETE
repeats the conditions that made a row prunable, so a row that changed after it was
picked (a task redriven, a breaker that failed again) is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, OuterRef, QuerySet, Value
from django.db.models.functions import Concat

from ..compat import TaskResultStatus
from ..models import BreakerRecord, ScheduleOccurrence, TaskRecord
from . import dialect_for
from .sql import TASKS

FINISHED = (TaskResultStatus.SUCCESSFUL.value, TaskResultStatus.FAILED.value)

# A FAILED task with ``ordering_blocked`` holds its ordering key until an operator
# discards or redrives it: deleting it would release the key behind their back.
_PRUNABLE = "status = %s AND finished_at < %s AND NOT ordering_blocked"

DELETE_FINISHED = f"""
DELETE FROM {TASKS}
WHERE id IN (
    SELECT id FROM {TASKS}
    WHERE backend_name = %s AND {_PRUNABLE}
    LIMIT %s{{skip_locked}}
)"""

DELETE_FINISHED_BY_ID = f"""
DELETE FROM {TASKS}
WHERE id IN (
    SELECT id FROM {TASKS}
    WHERE id IN ({{ids}}) AND status IN ({{statuses}}) AND NOT ordering_blocked{{skip_locked}}
)"""


def delete_finished(
    database: str, backend_name: str, status: str, before: datetime, limit: int
) -> int:
    """Delete up to ``limit`` tasks of ``backend_name`` in ``status`` (a finished one)
    that finished before ``before``; return how many.

    One statement, walking the finished-tasks index (``dtp_task_finished_idx``); where
    the database has row locks, rows another session holds (a redrive) are passed over
    rather than waited for."""
    if status not in FINISHED:
        raise ValueError(f"Only finished tasks are pruned ({', '.join(FINISHED)}), not {status}.")
    connection = connections[database]
    field = TaskRecord._meta.get_field("finished_at")
    statement = DELETE_FINISHED.format(skip_locked=dialect_for(connection).skip_locked_rows_sql)
    moment = field.get_db_prep_value(before, connection)
    with connection.cursor() as cursor:
        cursor.execute(statement, [backend_name, status, moment, limit])
        return max(0, cursor.rowcount)


def delete_finished_by_id(database: str, task_ids: Sequence[str]) -> int:
    """Delete those of ``task_ids`` that are finished (and hold no ordering key); return
    how many. One statement: callers pass a bounded batch. Rows another session holds
    locked are passed over, as ``delete_finished`` does, and stay."""
    if not task_ids:
        return 0
    connection = connections[database]
    field = TaskRecord._meta.get_field("id")
    statement = DELETE_FINISHED_BY_ID.format(
        ids=", ".join(["%s"] * len(task_ids)),
        statuses=", ".join(["%s"] * len(FINISHED)),
        skip_locked=dialect_for(connection).skip_locked_rows_sql,
    )
    params: list[Any] = [field.get_db_prep_value(task_id, connection) for task_id in task_ids]
    with connection.cursor() as cursor:
        cursor.execute(statement, [*params, *FINISHED])
        return max(0, cursor.rowcount)


def delete_batch(rows: QuerySet[Any], limit: int) -> int:
    """Delete up to ``limit`` of ``rows`` in one transaction; the DELETE repeats the
    queryset's conditions, so a row that no longer meets them is kept. Rows another
    session holds locked are passed over where the database has row locks."""
    database = rows.db
    with transaction.atomic(using=database):
        free = rows.select_for_update(skip_locked=True, of=("self",)).order_by("pk")
        ids = list(free.values_list("pk", flat=True)[:limit])
        if not ids:
            return 0
        deleted, _ = rows.filter(pk__in=ids).delete()
    return deleted


def idle_breakers(database: str, backend_name: str, before: datetime) -> QuerySet[BreakerRecord]:
    """Circuits that are as good as no row: closed, remembering no failure, no probe,
    holding no waiting task, unchanged since ``before``. A breaker declared in code
    needs no row to work (a missing row reads as closed); the next failure writes it
    again."""
    held = TaskRecord.objects.using(database).filter(
        backend_name=OuterRef("backend_name"),
        status=TaskResultStatus.READY,
        breaker_key=Concat(OuterRef("name"), Value("/"), OuterRef("key")),
    )
    return (
        BreakerRecord.objects.using(database)
        .filter(
            backend_name=backend_name,
            state="closed",
            failures__in=("[]", ""),
            probe_task_id__isnull=True,
            updated_at__lt=before,
        )
        .exclude(Exists(held))
    )


def delete_idle_breakers(database: str, backend_name: str, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` idle circuits (``idle_breakers``); return how many."""
    return delete_batch(idle_breakers(database, backend_name, before), limit)


def old_occurrences(
    database: str, backend_name: str, before: datetime
) -> QuerySet[ScheduleOccurrence]:
    """Occurrences of the backend's schedules recorded before ``before``, except each
    schedule's latest (what the admin shows as its last run). By when they were recorded,
    not their time: a catch-up after an outage records last year's occurrences today."""
    latest = (
        ScheduleOccurrence.objects.using(database)
        .filter(schedule=OuterRef("schedule"))
        .order_by("-at")
        .values("pk")[:1]
    )
    return (
        ScheduleOccurrence.objects.using(database)
        .filter(schedule__backend_name=backend_name, created_at__lt=before)
        .exclude(pk=latest)
    )


def delete_old_occurrences(database: str, backend_name: str, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` old schedule occurrences (``old_occurrences``)."""
    return delete_batch(old_occurrences(database, backend_name, before), limit)
