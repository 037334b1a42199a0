"""The reads behind "what does each READY task wait for" (``waiting.py``): the task ahead
of one in its ordering key, the rows of one reason, and per-queue counts that stay cheap
on a million READY rows.

The counts never scan a queue: each reads at most ``cap + 1`` rows in the claim index's
order (``dtp_task_claim_idx``), so a page that shows them costs the same on a thousand
rows or a million; past the cap they are lower bounds ("10,000+"). The blocked test is
the claim's (``sql.ORDERING_HEAD``): an earlier task of the key that is READY, RUNNING
or dead and blocking it, or a RUNNING task of the key; each probe walks
``dtp_task_ordering_idx`` backwards from the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from ..compat import TaskResultStatus
from ..models import TaskRecord
from ..waiting import Capped, Reason

READY, RUNNING, FAILED = TaskResultStatus.READY, TaskResultStatus.RUNNING, TaskResultStatus.FAILED
# Rows a count reads at most, per queue and kind (due, not yet due).
COUNT_CAP = 10_000

# The queues holding READY tasks of a backend, one index probe each (a loose scan of
# dtp_task_claim_idx), instead of a DISTINCT over every READY row. PostgreSQL and SQLite
# spell it alike. Parameters: the backend name, twice.
READY_QUEUES = """
    WITH RECURSIVE queues(name) AS (
        SELECT min(queue_name) FROM django_tasks_plus_taskrecord
        WHERE status = 'READY' AND backend_name = %s
        UNION ALL
        SELECT (
            SELECT min(queue_name) FROM django_tasks_plus_taskrecord
            WHERE status = 'READY' AND backend_name = %s AND queue_name > queues.name
        ) FROM queues WHERE queues.name IS NOT NULL
    )
    SELECT name FROM queues WHERE name IS NOT NULL
"""


def _earlier_in_the_way() -> QuerySet[TaskRecord]:
    """Earlier tasks of the outer row's ordering key that keep it waiting."""
    return TaskRecord.objects.filter(
        backend_name=OuterRef("backend_name"),
        ordering_key=OuterRef("ordering_key"),
        sequence__lt=OuterRef("sequence"),
    ).filter(Q(status__in=(READY, RUNNING)) | Q(status=FAILED, ordering_blocked=True))


def _running_of_key() -> QuerySet[TaskRecord]:
    return TaskRecord.objects.filter(
        backend_name=OuterRef("backend_name"),
        ordering_key=OuterRef("ordering_key"),
        status=RUNNING,
    ).exclude(pk=OuterRef("pk"))


def blocker_id() -> Coalesce:
    """An annotation: the id of the task the row waits behind in its ordering key (the
    nearest earlier one in the way, else the key's running task); NULL when none, or
    without a key. Evaluated per row shown, so it belongs on a page, not a count."""
    nearest = _earlier_in_the_way().order_by("-sequence").values("pk")[:1]
    running = _running_of_key().values("pk")[:1]
    return Coalesce(Subquery(nearest), Subquery(running))


def is_blocked() -> Q:
    """The condition "an earlier or running task of its ordering key is in the way"."""
    return Q(ordering_key__isnull=False) & (
        Exists(_earlier_in_the_way()) | Exists(_running_of_key())
    )


def reason_condition(reason: Reason, now: datetime) -> Q:
    """The READY tasks that wait for ``reason`` at ``now`` (the list's ``?waiting=``)."""
    ready = Q(status=READY)
    later = ready & Q(run_after__gt=now)
    due = ready & Q(run_after__lte=now)
    if reason is Reason.HELD:
        return later & Q(held_since__isnull=False)
    if reason is Reason.RETRYING:
        return later & Q(held_since__isnull=True, attempt__gt=0)
    if reason is Reason.SCHEDULED:
        return later & Q(held_since__isnull=True, attempt=0)
    if reason is Reason.BLOCKED:
        return due & is_blocked()
    return due & ~is_blocked()


@dataclass(frozen=True, slots=True)
class WaitingCounts:
    """One queue's READY tasks by what they wait for, read with a cap per kind."""

    queue: str
    counts: dict[Reason, Capped]
    oldest_runnable: datetime | None  # the earliest due time of a task that could run now
    oldest_exact: bool  # False when the due tasks were more than the cap


def ready_queues(database: str, backend: str) -> list[str]:
    """The queues of ``backend`` that hold READY tasks."""
    with connections[database].cursor() as cursor:
        cursor.execute(READY_QUEUES, [backend, backend])
        return [str(row[0]) for row in cursor.fetchall()]


def queue_waiting(
    database: str, backend: str, queue: str, now: datetime, cap: int = COUNT_CAP
) -> WaitingCounts:
    """Two reads of at most ``cap + 1`` rows each, in claim order: the due tasks (each
    tested for a blocker) and the later ones (split by held, retrying, scheduled)."""
    ready = TaskRecord.objects.using(database).filter(
        backend_name=backend, queue_name=queue, status=READY
    )
    claim_order = ("-priority", "run_after", "id")
    due_rows: list[Any] = list(
        ready.filter(run_after__lte=now)
        .order_by(*claim_order)
        .annotate(blocked=Exists(_earlier_in_the_way()) | Exists(_running_of_key()))
        .values_list("run_after", "blocked", "ordering_key")[: cap + 1]
    )
    later_rows = list(
        ready.filter(run_after__gt=now)
        .order_by(*claim_order)
        .values_list("attempt", "held_since")[: cap + 1]
    )
    due_more, later_more = len(due_rows) > cap, len(later_rows) > cap
    due_rows, later_rows = due_rows[:cap], later_rows[:cap]
    runnable = [run_after for run_after, blocked, key in due_rows if not (key and blocked)]
    held = sum(1 for _attempt, since in later_rows if since is not None)
    retrying = sum(1 for attempt, since in later_rows if since is None and attempt > 0)
    counts = {
        Reason.DUE: Capped(len(runnable), due_more),
        Reason.BLOCKED: Capped(len(due_rows) - len(runnable), due_more),
        Reason.HELD: Capped(held, later_more),
        Reason.RETRYING: Capped(retrying, later_more),
        Reason.SCHEDULED: Capped(len(later_rows) - held - retrying, later_more),
    }
    return WaitingCounts(
        queue=queue,
        counts=counts,
        oldest_runnable=min(runnable, default=None),
        oldest_exact=not due_more,
    )


__all__ = [
    "COUNT_CAP",
    "WaitingCounts",
    "blocker_id",
    "is_blocked",
    "queue_waiting",
    "ready_queues",
    "reason_condition",
]
