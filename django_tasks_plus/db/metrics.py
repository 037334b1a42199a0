"""The metrics table and the read-time gauges: one transaction per flush, pruning, and
the aggregate reads the metrics queries build on.

The upsert adds to existing rows (``INSERT … ON CONFLICT … DO UPDATE SET value = value +
excluded.value``), which PostgreSQL and SQLite spell the same way, so it is written once
here. Its rows are sorted, so two workers flushing at once lock shared rows in the same
order and cannot deadlock. A flush lands exactly once: ``land_flush`` records the flush's
key (``MetricFlush``) and adds its rows in one transaction, and a retry whose key is
already stored adds nothing. The reads are vendor-neutral ORM.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Count, Min, Q, QuerySet, Sum

from ..compat import TaskResultStatus
from ..models import MetricFlush, MetricRecord, TaskRecord, WorkerRecord
from . import dialect_for
from .retention import delete_batch

METRICS = "django_tasks_plus_metricrecord"
METRIC_COLUMNS = ("backend_name", "minute", "queue_name", "task_path", "name", "value")

ADD_METRICS = """
    INSERT INTO django_tasks_plus_metricrecord
        (backend_name, minute, queue_name, task_path, name, value)
    VALUES {rows}
    ON CONFLICT (backend_name, minute, queue_name, task_path, name)
    DO UPDATE SET value = django_tasks_plus_metricrecord.value + excluded.value
"""

# Stamped by the database's clock, which the pruner's retention follows too.
CLAIM_FLUSH_KEY = """
    INSERT INTO django_tasks_plus_metricflush (id, backend_name, flushed_at)
    VALUES (%s, %s, {now})
    ON CONFLICT (id) DO NOTHING
"""

# Rows per statement: far above a flush's usual size, and within every SQLite's limit of
# bound parameters (999 before 3.32) at six parameters a row.
_ROWS_PER_STATEMENT = 160

Row = tuple[str, datetime, str, str, str, int]  # METRIC_COLUMNS, in order


class FlushFailed(DatabaseError):
    """A flush's transaction failed. ``may_have_landed``: the error came from its COMMIT
    (or after it), so the server may have committed it: retry it under the same keys.
    Otherwise it was rolled back and its counts can be sent again under any key."""

    def __init__(self, cause: DatabaseError, *, may_have_landed: bool) -> None:
        super().__init__(str(cause))
        self.may_have_landed = may_have_landed


def land_flush(database: str, backend: str, batches: Mapping[str, Iterable[Row]]) -> int:
    """Add the rows of every batch whose key (a uuid hex) is not stored yet, and store
    those keys, all in ONE transaction; returns how many rows were written.

    A batch whose key is stored already landed earlier (its COMMIT's answer was lost):
    it adds nothing. A concurrent transaction inserting the same key makes this one wait
    for its outcome on the key's unique index, so the key decides even then. Raises
    ``FlushFailed``; refuses to run inside a transaction (the flush would share its fate).
    """
    connection = connections[database]
    if connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "A metrics flush must run in a transaction of its own, not inside atomic()."
        )
    claim_key = CLAIM_FLUSH_KEY.format(now=dialect_for(connection).now_sql)
    committing = False
    try:
        with transaction.atomic(using=database):
            fresh: list[Row] = []
            with connection.cursor() as cursor:
                for key in sorted(batches):
                    cursor.execute(claim_key, [_key_param(connection, key), backend])
                    if cursor.rowcount == 1:
                        fresh.extend(batches[key])
            written = add_metrics(database, summed(fresh))
            committing = True
    except DatabaseError as exc:
        raise FlushFailed(exc, may_have_landed=committing) from exc
    return written


def _key_param(connection: Any, key: str) -> Any:
    field = MetricFlush._meta.get_field("id")
    return field.get_db_prep_value(field.to_python(key), connection, prepared=False)


def summed(rows: Iterable[Row]) -> list[Row]:
    """One row per key (the upsert touches a row once per statement), values added."""
    totals: dict[tuple[str, datetime, str, str, str], int] = {}
    for backend, minute, queue, task_path, name, value in rows:
        key = (backend, minute, queue, task_path, name)
        totals[key] = totals.get(key, 0) + value
    return [(*key, value) for key, value in totals.items()]


def add_metrics(database: str, rows: Iterable[Row]) -> int:
    """Add ``rows`` to the table in one statement (per 160 rows); returns how many rows.

    Each key must appear once. Runs in the caller's transaction; ``land_flush`` is the
    flush's one transaction around it.
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


def prune_metrics(
    database: str, backend: str, before: datetime, keep: datetime, limit: int | None = None
) -> int:
    """Delete the backend's minutes older than ``before``, except the ``keep`` minute (the
    all-time totals); returns how many rows. With ``limit``, at most that many, in one
    short transaction (the pruner repeats it while a full batch comes back)."""
    rows = (
        MetricRecord.objects.using(database)
        .filter(backend_name=backend, minute__lt=before)
        .exclude(minute=keep)
    )
    return _delete(rows, limit)


def prune_flush_keys(
    database: str, backend: str, before: datetime, limit: int | None = None
) -> int:
    """Forget the backend's flush keys older than ``before`` (the metrics retention: a
    flush is retried within seconds, never after days); returns how many (at most
    ``limit``, as ``prune_metrics``)."""
    rows = MetricFlush.objects.using(database).filter(backend_name=backend, flushed_at__lt=before)
    return _delete(rows, limit)


def _delete(rows: QuerySet[Any], limit: int | None) -> int:
    if limit is None:
        deleted, _ = rows.delete()
        return deleted
    return delete_batch(rows, limit)


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


def running_and_dead(database: str, backend: str) -> dict[str, dict[str, int]]:
    """Per queue: RUNNING tasks (few: at most the fleet's concurrency) and FAILED ones,
    grouped on the (status, queue) index, without reading READY rows."""
    rows = (
        TaskRecord.objects.using(database)
        .filter(
            backend_name=backend, status__in=[TaskResultStatus.RUNNING, TaskResultStatus.FAILED]
        )
        .values("queue_name", "status")
        .annotate(count=Count("id"))
        .order_by()
    )
    found: dict[str, dict[str, int]] = {}
    for row in rows:
        kind = "running" if row["status"] == TaskResultStatus.RUNNING else "dead"
        found.setdefault(row["queue_name"], {"running": 0, "dead": 0})[kind] = row["count"]
    return found


def worker_rows(database: str, backend: str) -> list[WorkerRecord]:
    """The backend's registered workers, oldest first."""
    return list(
        WorkerRecord.objects.using(database).filter(backend_name=backend).order_by("started_at")
    )
