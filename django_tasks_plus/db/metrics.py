"""The metrics tables and the read-time gauges: one transaction per flush, the hourly
rollup, pruning, and the aggregate reads the metrics queries build on.

The upsert adds to existing rows (``INSERT … ON CONFLICT … DO UPDATE SET value = value +
excluded.value``), which PostgreSQL and SQLite spell the same way, so it is written once
here. Its rows are sorted, so two workers flushing at once lock shared rows in the same
order and cannot deadlock. A flush lands exactly once: ``land_flush`` records the flush's
key (``MetricFlush``) and adds its rows in one transaction, and a retry whose key is
already stored adds nothing.

Minutes older than the metrics retention are moved to hourly rows (``MetricHour``) by
``roll_up_minutes``: their sums added and the minutes deleted in one transaction, so a
count is in exactly one table at any commit and a re-run or a crash counts nothing twice.
A window read (``sums``) adds both tables in one statement (one snapshot), so it never
sees a batch half moved. The reads are vendor-neutral ORM.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Count, F, Q, QuerySet, Sum

from ..compat import TaskResultStatus
from ..models import MetricFlush, MetricHour, MetricRecord, TaskRecord, WorkerRecord
from . import dialect_for
from .retention import delete_batch

METRICS = "django_tasks_plus_metricrecord"
METRIC_COLUMNS = ("backend_name", "minute", "queue_name", "task_path", "name", "value")

ADD_METRICS = """
    INSERT INTO {table}
        (backend_name, {at}, queue_name, task_path, name, value)
    VALUES {rows}
    ON CONFLICT (backend_name, {at}, queue_name, task_path, name)
    DO UPDATE SET value = {table}.value + excluded.value
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


FLUSH_LOCK_WAIT = 2.0
"""Seconds a flush waits for a count's row. Flushes of other processes lock the same
minute's rows for a moment; a session that keeps one locked (a process stalled inside
its flush) must not stall this one, which may be a web request's enqueue: the flush
fails, not counted as written, and its counts wait for the next."""


def land_flush(database: str, backend: str, batches: Mapping[str, Iterable[Row]]) -> int:
    """Add the rows of every batch whose key (a uuid hex) is not stored yet, and store
    those keys, all in ONE transaction; returns how many rows were written.

    A batch whose key is stored already landed earlier (its COMMIT's answer was lost):
    it adds nothing. A concurrent transaction inserting the same key makes this one wait
    for its outcome on the key's unique index, so the key decides even then. Each lock
    is waited for at most ``FLUSH_LOCK_WAIT``. Raises ``FlushFailed``; refuses to run
    inside a transaction (the flush would share its fate).
    """
    connection = connections[database]
    if connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "A metrics flush must run in a transaction of its own, not inside atomic()."
        )
    dialect = dialect_for(connection)
    claim_key = CLAIM_FLUSH_KEY.format(now=dialect.now_sql)
    committing = False
    try:
        with transaction.atomic(using=database):
            with dialect.lock_wait_bounded(connection, FLUSH_LOCK_WAIT):
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
    return _upsert(database, rows, MetricRecord, "minute")


def _upsert(database: str, rows: Iterable[Row], model: type[Any], at: str) -> int:
    """``add_metrics`` into ``model``'s table, whose time column is ``at``."""
    ordered = sorted(rows, key=lambda row: row[:5])
    if not ordered:
        return 0
    connection = connections[database]
    time_field = model._meta.get_field(at)
    statement = ADD_METRICS.format(table=model._meta.db_table, at=at, rows="{rows}")
    with connection.cursor() as cursor:
        for start in range(0, len(ordered), _ROWS_PER_STATEMENT):
            chunk = ordered[start : start + _ROWS_PER_STATEMENT]
            params: list[Any] = []
            for backend, moment, queue, task_path, name, value in chunk:
                prepared = time_field.get_db_prep_value(moment, connection, prepared=False)
                params += [backend, prepared, queue, task_path, name, value]
            cursor.execute(
                statement.format(rows=", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(chunk))),
                params,
            )
    return len(ordered)


def hour_of(moment: datetime) -> datetime:
    """The start of the clock hour (in the datetime's own zone; UTC as stored)."""
    return moment.replace(minute=0, second=0, microsecond=0)


def roll_up_minutes(
    database: str, backend: str, before: datetime, keep: datetime, limit: int
) -> int:
    """Move up to ``limit`` of the backend's minutes older than ``before`` (never the
    ``keep`` minute: the all-time totals) into their hours' rows, in ONE transaction:
    the hours get the minutes' sums and the minutes are deleted; returns how many
    minutes were moved (the pruner repeats it while a full batch comes back).

    The minutes are locked first, in key order, passing over rows a flush holds (a late
    flush adding to an old minute): the next batch takes them, and a count is never
    read here and then changed before its row is deleted. A failure rolls back both
    halves, so a re-run finds the same minutes and nothing is counted twice. An hour's
    row another session keeps locked fails the batch after ``FLUSH_LOCK_WAIT``, not the
    leader's session lock timeout, which the lease renewal would wait out."""
    connection = connections[database]
    bounded = dialect_for(connection).lock_wait_bounded(connection, FLUSH_LOCK_WAIT)
    with transaction.atomic(using=database), bounded:
        rows = (
            MetricRecord.objects.using(database)
            .filter(backend_name=backend, minute__lt=before)
            .exclude(minute=keep)
            .order_by("minute", "queue_name", "task_path", "name")
            .select_for_update(skip_locked=True)
        )
        picked = list(
            rows.values_list("pk", "minute", "queue_name", "task_path", "name", "value")[:limit]
        )
        if not picked:
            return 0
        hours = summed(
            (backend, hour_of(minute), queue, task_path, name, value)
            for _pk, minute, queue, task_path, name, value in picked
        )
        _upsert(database, hours, MetricHour, "hour")
        MetricRecord.objects.using(database).filter(pk__in=[row[0] for row in picked]).delete()
    return len(picked)


def prune_hours(database: str, backend: str, before: datetime, limit: int | None = None) -> int:
    """Delete the backend's hourly rows older than ``before``; returns how many (at most
    ``limit``, in one short transaction: the pruner repeats it while a full batch comes
    back)."""
    return _delete(
        MetricHour.objects.using(database).filter(backend_name=backend, hour__lt=before), limit
    )


def prune_flush_keys(
    database: str, backend: str, before: datetime, limit: int | None = None
) -> int:
    """Forget the backend's flush keys older than ``before`` (the metrics retention: a
    flush is retried within seconds, never after days); returns how many (at most
    ``limit``, in one short transaction: the pruner repeats it while a full batch comes
    back)."""
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
    """Values summed over a window (``since`` inclusive, ``until`` exclusive) or one
    ``minute``, grouped by ``group_by``; each dict has those keys and ``total``.

    A window adds the per-minute rows and the hourly rows of older minutes in one
    statement; an hourly row counts when its hour starts in the window (so a window
    starting mid-hour leaves out that hour's rolled-up minutes), and grouped by
    ``"minute"`` it is one point at the start of its hour."""
    minutes = _filtered(
        MetricRecord.objects.using(database).filter(backend_name=backend),
        "minute",
        since=since,
        until=until,
        names=names,
        queue=queue,
        task_path=task_path,
    )
    if minute is not None:
        grouped = (
            minutes.filter(minute=minute)
            .values(*group_by)
            .annotate(total=Sum("value"))
            .order_by(*group_by)
        )
        return [dict(row) for row in grouped]
    hours = _filtered(
        MetricHour.objects.using(database).filter(backend_name=backend),
        "hour",
        since=since,
        until=until,
        names=names,
        queue=queue,
        task_path=task_path,
    )
    # The same columns on both sides (the time as "at"), grouped in SQL, added here.
    columns = ["at" if column == "minute" else column for column in group_by]
    both = (
        minutes.annotate(at=F("minute"))
        .values(*columns)
        .annotate(total=Sum("value"))
        .order_by()
        .union(
            hours.annotate(at=F("hour")).values(*columns).annotate(total=Sum("value")).order_by(),
            all=True,
        )
    )
    found: dict[tuple[Any, ...], int] = {}
    for row in both:
        key = tuple(row[column] for column in columns)
        found[key] = found.get(key, 0) + int(row["total"])
    return [
        {**dict(zip(group_by, key, strict=True)), "total": total}
        for key, total in sorted(found.items())
    ]


def _filtered(
    rows: QuerySet[Any],
    at: str,
    *,
    since: datetime | None,
    until: datetime | None,
    names: Sequence[str] | None,
    queue: str | None,
    task_path: str | None,
) -> QuerySet[Any]:
    if since is not None:
        rows = rows.filter(**{f"{at}__gte": since})
    if until is not None:
        rows = rows.filter(**{f"{at}__lt": until})
    if names is not None:
        rows = rows.filter(name__in=list(names))
    if queue is not None:
        rows = rows.filter(queue_name=queue)
    if task_path is not None:
        rows = rows.filter(task_path=task_path)
    return rows


def queue_counts(database: str, backend: str, now: datetime) -> list[dict[str, Any]]:
    """Per queue and status (READY, RUNNING, FAILED): how many tasks, and how many READY
    ones are not due yet. One statement per status, so that each reads its own partial
    index (``_per_queue``); FAILED is counted without reading its rows' times. (The
    oldest task that could run now is ``db/waiting.oldest_runnable``'s: a due task may
    be blocked.)"""
    ready = _per_queue(
        database,
        backend,
        TaskResultStatus.READY,
        scheduled=Count("id", filter=Q(run_after__gt=now)),
    )
    running = _per_queue(database, backend, TaskResultStatus.RUNNING)
    dead = _per_queue(database, backend, TaskResultStatus.FAILED)
    return [
        *ready,
        *({**row, "scheduled": 0} for row in running),
        *({**row, "scheduled": 0} for row in dead),
    ]


def running_and_dead(database: str, backend: str) -> dict[str, dict[str, int]]:
    """Per queue: RUNNING tasks (few: at most the fleet's concurrency) and FAILED ones,
    each through its own partial index, without reading READY rows."""
    found: dict[str, dict[str, int]] = {}
    for kind, status in (("running", TaskResultStatus.RUNNING), ("dead", TaskResultStatus.FAILED)):
        for row in _per_queue(database, backend, status):
            found.setdefault(row["queue_name"], {"running": 0, "dead": 0})[kind] = row["count"]
    return found


def _per_queue(database: str, backend: str, status: str, **counts: Count) -> list[dict[str, Any]]:
    """``{"queue_name", "status", "count", **counts}`` per queue of ``backend`` for the
    tasks in one ``status``. One status per statement: each of READY, RUNNING and FAILED
    has a partial index (``dtp_task_claim_idx``, ``dtp_task_lease_idx``,
    ``dtp_task_dead_idx``) that a condition on several statuses would not match, and
    ``COUNT(*)`` lets the READY and FAILED counts read the index alone."""
    rows = (
        TaskRecord.objects.using(database)
        .filter(backend_name=backend, status=status)
        .values("queue_name")
        .annotate(count=Count("*"), **counts)
        .order_by()
    )
    return [{**row, "status": str(status)} for row in rows]


def worker_rows(database: str, backend: str) -> list[WorkerRecord]:
    """The backend's registered workers, oldest first."""
    return list(
        WorkerRecord.objects.using(database).filter(backend_name=backend).order_by("started_at")
    )
