"""The reads behind "what does each READY task wait for" (``waiting.py``): the task ahead
of one in its ordering key, the rows of one reason, and per-queue counts that stay cheap
on a million READY rows.

The counts never scan a queue: each reads at most ``cap + 1`` entries of an index that
holds only the rows it counts (the claim index one priority level at a time, and the
partial indexes of held, retrying and ordering-keyed READY tasks), so a page that shows
them costs about the same on a thousand rows or a million; past the cap a count is a
bound ("10,000+"). The blocked test is
the claim's (``sql.ORDERING_HEAD``): an earlier task of the key that is READY, RUNNING
or dead and blocking it, or a RUNNING task of the key; each probe walks
``dtp_task_ordering_idx`` backwards from the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Exists, Max, OuterRef, Q, QuerySet, Subquery
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


def _oldest_runnable(
    ready: QuerySet[TaskRecord], levels: list[int], now: datetime, cap: int
) -> tuple[datetime | None, bool]:
    """The earliest ``run_after`` of a due task not blocked by its ordering key, and
    whether it is exact: each level's due rows are read in ``run_after`` order (an
    index range) until the first one not blocked, at most ``cap`` rows in all."""
    oldest: datetime | None = None
    exact = True
    budget = cap
    blocked = Exists(_earlier_in_the_way()) | Exists(_running_of_key())
    for index, level in enumerate(levels):
        rows = (
            ready.filter(priority=level, run_after__lte=now)
            .order_by("run_after", "id")
            .annotate(blocked=blocked)
            .values_list("run_after", "ordering_key", "blocked")[:budget]
        )
        read = 0
        for run_after, key, is_blocked in rows.iterator(chunk_size=200):
            read += 1
            if key is None or not is_blocked:
                oldest = run_after if oldest is None else min(oldest, run_after)
                break
        else:
            exact = exact and read < budget  # all read were blocked: older may follow
        budget -= read
        if budget <= 0:
            exact = exact and index == len(levels) - 1  # levels left unread
            break
    return oldest, exact


def queue_waiting(
    database: str, backend: str, queue: str, now: datetime, cap: int = COUNT_CAP
) -> WaitingCounts:
    """One queue's READY tasks by reason, each count reading at most ``cap + 1`` index
    entries: the due and the later ones per priority level (the claim index), the held
    ones and the retries (their own partial indexes), the blocked ones among the tasks
    with an ordering key (``dtp_task_keyed_idx``, each tested against its key)."""
    ready = TaskRecord.objects.using(database).filter(
        backend_name=backend, queue_name=queue, status=READY
    )
    levels = _levels(ready)
    due = _by_level(ready, levels, cap, run_after__lte=now)
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
    keyed = list(
        ready.filter(ordering_key__isnull=False)
        .order_by("ordering_key", "sequence")
        .annotate(blocked=Exists(_earlier_in_the_way()) | Exists(_running_of_key()))
        .values_list("run_after", "blocked")[: cap + 1]
    )
    keyed_capped = len(keyed) > cap
    blocked_count = sum(
        1 for run_after, is_blocked in keyed[:cap] if is_blocked and run_after <= now
    )
    blocked = Capped(blocked_count, at_least=keyed_capped)
    if not keyed_capped:  # blocked is exact: due minus blocked is as exact as due
        runnable = Capped(max(0, due.count - blocked.count), at_least=due.at_least)
    elif due.exact:  # some blocked tasks may not have been read: at most every due one
        runnable = Capped(due.count, at_most=True)
    else:  # both past the cap: nothing better than "some"
        runnable = Capped(0, at_least=True)
    oldest, oldest_exact = _oldest_runnable(ready, levels, now, cap)
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
    "queue_waiting",
    "ready_queues",
    "reason_condition",
]
