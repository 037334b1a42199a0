"""The metrics table and the read-time gauges: one upsert per flush, pruning, and the
aggregate reads the metrics queries build on.

The upsert adds to existing rows (``INSERT … ON CONFLICT … DO UPDATE SET value = value +
excluded.value``), which PostgreSQL and SQLite spell the same way, so it is written once
here. Its rows are sorted, so two workers flushing at once lock shared rows in the same
order and cannot deadlock. The reads are vendor-neutral ORM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Count, Min, Q, Sum

from ..compat import TaskResultStatus
from ..models import MetricRecord, TaskRecord, WorkerRecord

METRICS = "django_tasks_plus_metricrecord"
METRIC_COLUMNS = ("backend_name", "minute", "queue_name", "task_path", "name", "value")

ADD_METRICS = """
    INSERT INTO django_tasks_plus_metricrecord
        (backend_name, minute, queue_name, task_path, name, value)
    VALUES {rows}
    ON CONFLICT (backend_name, minute, queue_name, task_path, name)
    DO UPDATE SET value = django_tasks_plus_metricrecord.value + excluded.value
"""

# Rows per statement: far above a flush's usual size, and within every SQLite's limit of
# bound parameters (999 before 3.32) at six parameters a row.
_ROWS_PER_STATEMENT = 160

Row = tuple[str, datetime, str, str, str, int]  # METRIC_COLUMNS, in order


def add_metrics(database: str, rows: Iterable[Row]) -> int:
    """Add ``rows`` to the table in one statement (per 160 rows); returns how many rows.

    Each key must appear once. Runs in autocommit: a statement lands whole or not at all.
    """
    ordered = sorted(rows, key=lambda row: row[:5])
    if not ordered:
        return 0
    connection = connections[database]
    minute_field = MetricRecord._meta.get_field("minute")
    with connection.cursor() as cursor:
        for start in range(0, len(ordered), _ROWS_PER_STATEMENT):
            chunk = ordered[start : start + _ROWS_PER_STATEMENT]
            params: list[Any] = []
            for backend, minute, queue, task_path, name, value in chunk:
                prepared = minute_field.get_db_prep_value(minute, connection, prepared=False)
                params += [backend, prepared, queue, task_path, name, value]
            cursor.execute(
                ADD_METRICS.format(rows=", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(chunk))),
                params,
            )
    return len(ordered)


def prune_metrics(database: str, backend: str, before: datetime, keep: datetime) -> int:
    """Delete the backend's minutes older than ``before``, except the ``keep`` minute (the
    all-time totals); returns how many rows."""
    deleted, _ = (
        MetricRecord.objects.using(database)
        .filter(backend_name=backend, minute__lt=before)
        .exclude(minute=keep)
        .delete()
    )
    return deleted


def sums(
    database: str,
    backend: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    minute: datetime | None = None,
    names: Sequence[str] | None = None,
    group_by: Sequence[str] = ("queue_name", "task_path", "name"),
    queue: str | None = None,
    task_path: str | None = None,
) -> list[dict[str, Any]]:
    """Values summed over a window of minutes (``since`` inclusive, ``until`` exclusive)
    or one ``minute``, grouped by ``group_by``; each dict has those keys and ``total``."""
    rows = MetricRecord.objects.using(database).filter(backend_name=backend)
    if minute is not None:
        rows = rows.filter(minute=minute)
    if since is not None:
        rows = rows.filter(minute__gte=since)
    if until is not None:
        rows = rows.filter(minute__lt=until)
    if names is not None:
        rows = rows.filter(name__in=list(names))
    if queue is not None:
        rows = rows.filter(queue_name=queue)
    if task_path is not None:
        rows = rows.filter(task_path=task_path)
    grouped = rows.values(*group_by).annotate(total=Sum("value")).order_by(*group_by)
    return [dict(row) for row in grouped]


def queue_counts(database: str, backend: str, now: datetime) -> list[dict[str, Any]]:
    """Per queue and status (READY, RUNNING, FAILED): how many tasks, how many READY ones
    are not due yet, and the oldest due ``run_after``. Grouped on the (status, queue)
    index; READY and RUNNING are few, FAILED is counted without reading its rows' times."""
    live = (
        TaskRecord.objects.using(database)
        .filter(
            backend_name=backend,
            status__in=[TaskResultStatus.READY, TaskResultStatus.RUNNING],
        )
        .values("queue_name", "status")
        .annotate(
            count=Count("id"),
            scheduled=Count("id", filter=Q(run_after__gt=now)),
            oldest_due=Min("run_after", filter=Q(run_after__lte=now)),
        )
        .order_by()
    )
    dead = (
        TaskRecord.objects.using(database)
        .filter(backend_name=backend, status=TaskResultStatus.FAILED)
        .values("queue_name", "status")
        .annotate(count=Count("id"))
        .order_by()
    )
    return [dict(row) for row in live] + [
        {**row, "scheduled": 0, "oldest_due": None} for row in dead
    ]


def worker_rows(database: str, backend: str) -> list[WorkerRecord]:
    """The backend's registered workers, oldest first."""
    return list(
        WorkerRecord.objects.using(database).filter(backend_name=backend).order_by("started_at")
    )
