"""The reads behind "what does each READY task wait for" (``waiting.py``): the task ahead
of one in its ordering key, the rows of one reason, and per-queue counts that stay cheap
on a million READY rows.

The counts never scan a queue: each reads at most ``cap + 1`` entries of an index that
holds only the rows it counts (the claim index one priority level at a time, and the
partial indexes of held and retrying READY tasks), so a page that shows them costs about
the same on a thousand rows or a million; past the cap a count is a bound ("10,000+").
Telling blocked from runnable due tasks takes a probe or two per task, so only the
oldest ``BLOCKED_SCAN`` due tasks are tested; past them both are lower bounds. The blocked test is
the claim's (``sql.ORDERING_HEAD``): an earlier task of the key that is READY, RUNNING
or dead and blocking it, or a RUNNING task of the key; each probe walks
``dtp_task_ordering_idx`` backwards from the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import (
    BooleanField,
    Case,
    Exists,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from ..compat import TaskResultStatus
from ..models import TaskRecord
from ..waiting import Capped, Reason

READY, RUNNING, FAILED = TaskResultStatus.READY, TaskResultStatus.RUNNING, TaskResultStatus.FAILED
# Index entries a count reads at most, per queue and kind.
COUNT_CAP = 10_000
# Due tasks tested against their ordering key at most, per queue (each test is an index
# probe or two): past it, "blocked" and "due now" are lower bounds.
BLOCKED_SCAN = 1_000
# Due tasks read at first per priority level when looking for the oldest that can run.
FIRST_READ = 16

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


def _capped_count(rows: QuerySet[TaskRecord], cap: int) -> Capped:
    """``SELECT COUNT(*) FROM (… LIMIT cap + 1)``: reads at most ``cap + 1`` rows."""
    found = rows.values("pk")[: cap + 1].count()
    return Capped(cap, at_least=True) if found > cap else Capped(found)


def _levels(ready: QuerySet[TaskRecord]) -> list[int]:
    """The priorities present among the READY rows, highest first: one probe of the
    claim index each (the claim's own walk, ``sql.CLAIM_LEVELS``)."""
    levels: list[int] = []
    top = ready.aggregate(top=Max("priority"))["top"]
    while top is not None:
        levels.append(top)
        top = ready.filter(priority__lt=top).aggregate(top=Max("priority"))["top"]
    return levels


def _by_level(ready: QuerySet[TaskRecord], levels: list[int], cap: int, **where: Any) -> Capped:
    """Rows matching ``where`` at every level, each level one range of the claim index
    (priority fixed, then ``run_after``), together at most ``cap + 1`` rows read."""
    total = 0
    for level in levels:
        left = cap - total
        counted = _capped_count(ready.filter(priority=level, **where), left)
        total += counted.count
        if counted.at_least:
            return Capped(cap, at_least=True)
    return Capped(total)


def _blocked_flag() -> Case:
    """True when the row waits behind its ordering key; no probe for a row without one."""
    return Case(
        When(ordering_key__isnull=True, then=Value(False)),
        default=Exists(_earlier_in_the_way()) | Exists(_running_of_key()),
        output_field=BooleanField(),
    )


def _due_scan(
    ready: QuerySet[TaskRecord], levels: list[int], now: datetime, scan: int
) -> tuple[int, int, datetime | None, bool]:
    """The first ``scan`` due tasks in claim order, each tested against its key: how
    many were read, how many of them are blocked, the earliest due time of one that is
    not, and whether the scan read every due task (then the figures are exact)."""
    read = blocked = 0
    oldest: datetime | None = None
    for level in levels:
        rows = (
            ready.filter(priority=level, run_after__lte=now)
            .order_by("run_after", "id")
            .annotate(blocked=_blocked_flag())
            .values_list("run_after", "blocked")[: scan - read + 1]
        )
        for run_after, is_blocked in rows:
            read += 1
            if read > scan:
                return scan, blocked, oldest, False
            if is_blocked:
                blocked += 1
            elif oldest is None or run_after < oldest:
                oldest = run_after
    return read, blocked, oldest, True


def oldest_runnable(
    database: str, backend: str, queue: str, now: datetime, scan: int = BLOCKED_SCAN
) -> tuple[datetime | None, bool]:
    """The earliest due time of a task of ``queue`` that could run now (due, and not
    blocked by its ordering key; a held, retrying or scheduled task is not due), and
    whether that answer is exact. Each priority level is read oldest first up to its
    first task that is not blocked, at most ``scan`` rows per level; a level whose first
    ``scan`` due tasks are all blocked makes the answer a bound (False)."""
    ready = TaskRecord.objects.using(database).filter(
        backend_name=backend, queue_name=queue, status=READY
    )
    oldest: datetime | None = None
    exact = True
    for level in _levels(ready):
        due = (
            ready.filter(priority=level, run_after__lte=now)
            .order_by("run_after", "id")
            .annotate(blocked=_blocked_flag())
            .values_list("run_after", "blocked")
        )
        # Mostly the first due task can run: a short read first, the long one only
        # when the head of the level is blocked.
        for limit in dict.fromkeys((min(FIRST_READ, scan), scan)):
            rows = list(due[:limit])
            first = next((run_after for run_after, blocked in rows if not blocked), None)
            if first is not None or len(rows) < limit:
                break
        if first is not None:
            oldest = first if oldest is None else min(oldest, first)
        elif len(rows) >= scan:
            exact = False
    return oldest, exact


def queue_waiting(
    database: str,
    backend: str,
    queue: str,
    now: datetime,
    cap: int = COUNT_CAP,
    scan: int = BLOCKED_SCAN,
) -> WaitingCounts:
    """One queue's READY tasks by reason, each count reading at most ``cap + 1`` index
    entries: the later ones per priority level (the claim index), the held ones and the
    retries (their own partial indexes); the due ones are read oldest first, at most
    ``scan`` of them, each tested against its ordering key (blocked or could run)."""
    ready = TaskRecord.objects.using(database).filter(
        backend_name=backend, queue_name=queue, status=READY
    )
    levels = _levels(ready)
    held = _capped_count(ready.filter(held_since__isnull=False, run_after__gt=now), cap)
    retrying = _capped_count(
        ready.filter(attempt__gt=0, held_since__isnull=True, run_after__gt=now), cap
    )
    # Later rows, read far enough to leave ``cap`` scheduled ones past the other two.
    room = cap + held.count + retrying.count
    later = _by_level(ready, levels, room, run_after__gt=now)
    scheduled = Capped(
        max(0, later.count - held.count - retrying.count),
        at_least=later.at_least,
        at_most=not later.at_least and not (held.exact and retrying.exact),
    )
    read, blocked_count, oldest, whole = _due_scan(ready, levels, now, min(scan, cap))
    if whole:  # every due task was tested: both exact
        blocked = Capped(blocked_count)
        runnable = Capped(read - blocked_count)
    else:  # of the first ``scan`` due tasks (the oldest): lower bounds
        blocked = Capped(blocked_count, at_least=True)
        runnable = Capped(read - blocked_count, at_least=True)
    # The oldest due task that could run is among those read unless all were blocked.
    oldest_exact = whole or oldest is not None
    return WaitingCounts(
        queue=queue,
        counts={
            Reason.DUE: runnable,
            Reason.BLOCKED: blocked,
            Reason.HELD: held,
            Reason.RETRYING: retrying,
            Reason.SCHEDULED: scheduled,
        },
        oldest_runnable=oldest,
        oldest_exact=oldest_exact,
    )


__all__ = [
    "COUNT_CAP",
    "WaitingCounts",
    "blocker_id",
    "is_blocked",
    "oldest_runnable",
    "queue_waiting",
    "ready_queues",
    "reason_condition",
]
