"""The admin's reads beyond its change lists: what blocks a task, the other tasks of its
ordering key, tasks in flight per worker (and those of one worker), planner estimates.
Each is one indexed query.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Q, QuerySet

from ..compat import TaskResultStatus
from ..models import TaskRecord
from ..stored import worker_id_list

SAME_KEY_SHOWN = 20
IN_FLIGHT_SHOWN = 100  # a worker's page lists this many of its tasks, and links to all


def blocker_of(record: TaskRecord) -> TaskRecord | None:
    """The earlier task of the same ordering key that keeps ``record`` waiting: one
    READY or RUNNING before it, or a dead one that blocks the key (the claim's rule,
    ``db/sql.py`` ``ORDERING_HEAD``). None when the task is not held back by its key."""
    if record.ordering_key is None or record.sequence is None:
        return None
    if record.status != TaskResultStatus.READY:
        return None
    return (
        TaskRecord.objects.filter(
            backend_name=record.backend_name,
            ordering_key=record.ordering_key,
            sequence__lt=record.sequence,
        )
        .filter(
            Q(status__in=(TaskResultStatus.READY, TaskResultStatus.RUNNING))
            | Q(status=TaskResultStatus.FAILED, ordering_blocked=True)
        )
        .only("id", "status", "task_path", "ordering_blocked", "sequence")
        .order_by("sequence")
        .first()
    )


def same_ordering_key(record: TaskRecord) -> tuple[list[TaskRecord], int]:
    """Up to ``SAME_KEY_SHOWN`` tasks of the record's ordering key around it (in enqueue
    order), and how many the key holds in all (walks ``dtp_task_ordering_idx``)."""
    if record.ordering_key is None:
        return [], 0
    rows = TaskRecord.objects.filter(
        backend_name=record.backend_name, ordering_key=record.ordering_key
    )
    total = rows.count()
    near = list(
        rows.only("id", "status", "task_path", "sequence", "enqueued_at", "ordering_blocked")
        .order_by("sequence")
        .filter(sequence__gte=(record.sequence or 0) - SAME_KEY_SHOWN // 2)[:SAME_KEY_SHOWN]
    )
    return near, total


def in_flight(backend_names: set[str] | None = None) -> Counter[str]:
    """RUNNING tasks per worker id. The claim appends the worker's id to ``worker_ids``,
    and only the lease holder can write the row, so the last id is who runs it now.
    RUNNING rows are few (at most the fleet's concurrency) and the status index finds
    them, so they are counted here rather than with database-specific JSON SQL."""
    rows = TaskRecord.objects.filter(status=TaskResultStatus.RUNNING)
    if backend_names is not None:
        rows = rows.filter(backend_name__in=backend_names)
    counts: Counter[str] = Counter()
    for value in rows.values_list("worker_ids", flat=True).iterator():
        ids = worker_id_list(value)
        if ids:
            counts[ids[-1]] += 1
    return counts


def in_flight_of(
    worker_id: str, backend_name: str, limit: int = IN_FLIGHT_SHOWN
) -> tuple[list[TaskRecord], int]:
    """The RUNNING tasks whose current lease is ``worker_id``'s (the last id in
    ``worker_ids``, as ``in_flight`` counts them), oldest claim first, up to ``limit``;
    and how many there are in all. Reads the few RUNNING rows of the backend."""
    rows = (
        TaskRecord.objects.filter(status=TaskResultStatus.RUNNING, backend_name=backend_name)
        .only("id", "task_path", "queue_name", "attempt", "worker_ids", "last_attempted_at")
        .order_by("last_attempted_at", "id")
    )
    mine = [row for row in rows.iterator() if worker_id_list(row.worker_ids)[-1:] == (worker_id,)]
    return mine[:limit], len(mine)


def planner_estimate(queryset: QuerySet[Any]) -> int | None:
    """The query planner's estimate of how many rows ``queryset`` returns, where the
    database can explain a query as JSON (PostgreSQL); None elsewhere, or if the plan
    cannot be read. Costs one EXPLAIN (no rows are read), unlike ``COUNT(*)``."""
    connection = connections[queryset.db]
    if "JSON" not in getattr(connection.features, "supported_explain_formats", ()):
        return None
    try:
        text = queryset.order_by().explain(format="json")
        plan = json.loads(text)
        return int(plan[0]["Plan"]["Plan Rows"])
    except (DatabaseError, ValueError, KeyError, IndexError, TypeError):
        return None
