"""The task-row operations the worker and the backend call, by database alias.

Most are ORM queries (workers, cancel, redrive, discard, the fenced single write), which
every database runs the same way; those whose SQL differs (lease renewal, reaping) are
the dialect's. Every write after a claim is **fenced**: it only lands where the row still
carries the lease token the writer holds. A worker that lost its lease (paused,
partitioned, too slow, reaped) therefore cannot overwrite the outcome of whoever owns the
task now.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import JSONField
from django.db.models.expressions import RawSQL

from ..compat import TaskResultStatus
from ..lifecycle import ClaimedTask, Transition
from ..liveness import may_forget
from ..models import TaskRecord, WorkerRecord
from ..stored import error_list
from . import dialect_for
from .rowlock import unlocked


def apply_transition(
    database: str,
    task: ClaimedTask,
    transition: Transition,
    *,
    only_if_expired: bool = False,
    skip_locked: bool = False,
) -> bool:
    """Write ``transition`` if ``task``'s lease is still held; return whether it landed.

    ``only_if_expired`` is the reaper's extra fence: it only takes rows whose lease is
    still expired by the database's clock, so a heartbeat that renewed the lease a moment
    ago wins. ``skip_locked``: a row another session holds locked (where the database
    has row locks) does not land, rather than being waited for; the caller comes back to
    it (the reaper in a later round) or leaves it to its lease's expiry.
    """
    rows = TaskRecord.objects.using(database).filter(
        pk=task.id, lease_token=task.lease_token, status=TaskResultStatus.RUNNING
    )
    if only_if_expired:  # by the database's clock
        now = dialect_for(connections[database]).now_sql
        rows = rows.filter(lease_expires_at__lt=RawSQL(now, ()))
    if skip_locked:
        rows = unlocked(rows)
    updated = rows.update(
        status=transition.status, lease_token=None, lease_expires_at=None, **transition.values
    )
    return updated == 1


def renew_leases(
    database: str, leases: Iterable[tuple[str, str]], visibility_timeout: float
) -> set[tuple[str, str]]:
    """Extend every still-held lease in one statement; return the ``(id, token)`` pairs
    no longer held.

    The new expiry is ``visibility_timeout`` seconds after the row is written, by the
    database's clock (``Dialect.renew_leases``).
    """
    leases = list(leases)
    if not leases:
        return set()
    connection = connections[database]
    held = dialect_for(connection).renew_leases(connection, leases, visibility_timeout)
    return set(leases) - held


def leases_still_held(database: str, leases: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """The ``(id, token)`` pairs whose row is still RUNNING under that token.

    Asked about outcomes that did not land: where the outcome write skips rows another
    session holds locked (``Dialect.write_outcomes`` on PostgreSQL), a lease still held
    means the row was skipped, not taken over, and its outcome is worth writing again."""
    leases = set(leases)
    if not leases:
        return set()
    rows = (
        TaskRecord.objects.using(database)
        .filter(
            pk__in=[uuid.UUID(task_id) for task_id, _ in leases], status=TaskResultStatus.RUNNING
        )
        .values_list("pk", "lease_token")
    )
    return {(str(pk), str(token)) for pk, token in rows if token is not None} & leases


def expired_tasks(database: str, backend_name: str, limit: int = 100) -> list[ClaimedTask]:
    """Running tasks of this backend whose lease ran out by the database's clock, oldest
    expiry first (``Dialect.expired_tasks``: a hostile row reads as corrupt, never raises
    and stops every reaper round)."""
    connection = connections[database]
    return dialect_for(connection).expired_tasks(connection, backend_name, limit)


@dataclass(frozen=True)
class WorkerRegistration:
    """What a worker writes on its row: when it starts, and again whenever its heartbeat
    finds the row gone (deleted while the process was paused past the pruning age)."""

    worker_id: str
    backend_name: str
    queues: tuple[str, ...]
    concurrency: int
    visibility_timeout: float
    started_at: datetime
    version: str = ""


@dataclass(frozen=True)
class WorkerStatus:
    """What a worker's row says of it beyond liveness, rewritten by every heartbeat in
    the same UPDATE: the attempts it finished and failed since it started, and since when
    it leads its backend (None while a follower)."""

    tasks_processed: int = 0
    tasks_failed: int = 0
    leader_since: datetime | None = None

    def columns(self) -> dict[str, Any]:
        return {
            "tasks_processed": self.tasks_processed,
            "tasks_failed": self.tasks_failed,
            "leader_since": self.leader_since,
        }


WORKER_ROW_LOCK_WAIT = 1.0
"""Seconds the worker's own writes of its row (the heartbeat's touch, the removal at
shutdown) wait for it. Others lock it for a moment (the leader's pruner, an operator's
delete); a session that keeps it locked must not hold the heartbeat's session (shared
with leadership and the scheduler) for the session's whole lock timeout, a third of a
lease, nor a stopping worker past its grace period."""


def register_worker(
    database: str,
    registration: WorkerRegistration,
    now: datetime,
    status: WorkerStatus | None = None,
    *,
    lock_wait: float = WORKER_ROW_LOCK_WAIT,
) -> None:
    """Write the worker's row (again, if its id is reused), waiting at most ``lock_wait``
    seconds for a row another session holds locked; else the database's lock error."""
    connection = connections[database]
    bounded = dialect_for(connection).lock_wait_bounded(connection, lock_wait)
    with transaction.atomic(using=database), bounded:
        WorkerRecord.objects.using(database).update_or_create(
            worker_id=registration.worker_id,
            defaults={
                "backend_name": registration.backend_name,
                "hostname": socket.gethostname()[:255],
                "pid": os.getpid(),
                "queues": sorted(registration.queues),
                "concurrency": registration.concurrency,
                "visibility_timeout": registration.visibility_timeout,
                "started_at": registration.started_at,
                "last_heartbeat_at": now,
                "version": registration.version[:40],
                **(status or WorkerStatus()).columns(),
            },
        )


def heartbeat_worker(
    database: str, worker_id: str, now: datetime, status: WorkerStatus | None = None
) -> bool:
    """Touch the worker's row, writing ``status`` in the same statement; False if the row
    is gone (the caller registers it again). Raises the database's lock error if the row
    stays locked past ``WORKER_ROW_LOCK_WAIT``."""
    connection = connections[database]
    rows = WorkerRecord.objects.using(database).filter(worker_id=worker_id)
    values = status.columns() if status is not None else {}
    bounded = dialect_for(connection).lock_wait_bounded(connection, WORKER_ROW_LOCK_WAIT)
    with transaction.atomic(using=database), bounded:
        return rows.update(last_heartbeat_at=now, **values) > 0


def remove_worker(database: str, worker_id: str) -> None:
    """Delete the worker's row at shutdown, waiting at most ``WORKER_ROW_LOCK_WAIT`` for
    it (else the database's lock error: the leader's pruner forgets the row later)."""
    connection = connections[database]
    bounded = dialect_for(connection).lock_wait_bounded(connection, WORKER_ROW_LOCK_WAIT)
    with transaction.atomic(using=database), bounded:
        WorkerRecord.objects.using(database).filter(worker_id=worker_id).delete()


def prune_workers(database: str, now: datetime) -> list[str]:
    """Forget the workers silent for ``STALE_WORKER_FACTOR`` of *their own* visibility
    timeouts (crashed or killed); returns their ids.

    Each row is judged by the timeout its worker declared, so a worker with a long one
    is not taken for dead between its beats by a leader with a short one. A row is only
    deleted if it has not beaten since it was read, and not while another session holds
    it locked (a worker stalled inside its touch, an operator): a later round does."""
    rows = WorkerRecord.objects.using(database).values_list(
        "worker_id", "last_heartbeat_at", "visibility_timeout"
    )
    forgotten = []
    for worker_id, last_heartbeat, visibility_timeout in rows:
        if not may_forget(last_heartbeat, now, visibility_timeout):
            continue
        silent = WorkerRecord.objects.using(database).filter(
            worker_id=worker_id, last_heartbeat_at=last_heartbeat
        )
        deleted, _ = unlocked(silent).delete()
        if deleted:
            forgotten.append(worker_id)
    return forgotten


def ready_depth(database: str, backend_name: str, queue_name: str, cap: int) -> int:
    """READY tasks in a queue, counted up to ``cap`` (so the cost is bounded)."""
    rows = TaskRecord.objects.using(database).filter(
        backend_name=backend_name, queue_name=queue_name, status=TaskResultStatus.READY
    )
    return rows[:cap].count()


def cancel_ready(database: str, task_id: str, error: dict, now: datetime) -> bool:
    """Dead-letter a READY task as cancelled; False if it was no longer READY."""
    for _ in range(5):  # optimistic: retry if a worker touched the row in between
        row = (
            TaskRecord.objects.using(database)
            .filter(pk=task_id)
            .values("status", "attempt", "errors")
            .first()
        )
        if row is None or row["status"] != TaskResultStatus.READY:
            return False
        updated = (
            TaskRecord.objects.using(database)
            .filter(pk=task_id, status=TaskResultStatus.READY, attempt=row["attempt"])
            .update(
                status=TaskResultStatus.FAILED,
                finished_at=now,
                errors=[*error_list(row["errors"]), error],
                dead_letter_reason="cancelled",
                cancel_requested=True,
                held_since=None,  # finished: no longer held back by a breaker
            )
        )
        if updated:
            return True
    return False


def request_cancel(database: str, task_id: str) -> bool:
    """Flag a RUNNING task for cooperative cancellation."""
    return bool(
        TaskRecord.objects.using(database)
        .filter(pk=task_id, status=TaskResultStatus.RUNNING)
        .update(cancel_requested=True)
    )


def cancel_requested(database: str, task_id: str) -> bool:
    return TaskRecord.objects.using(database).filter(pk=task_id, cancel_requested=True).exists()


# What a redriven task starts its new run with: every column that belongs to one run.
# The history (``errors``: every earlier attempt's error, ``worker_ids``, ``started_at``)
# is kept, as the admin shows it across runs.
NEW_RUN = {
    "status": TaskResultStatus.READY,
    "attempt": 0,  # a fresh retry budget
    "finished_at": None,
    "dead_letter_reason": "",
    "ordering_blocked": False,
    "cancel_requested": False,
    "lease_token": None,
    "lease_expires_at": None,
    # A breaker's held TTL counts from the first hold of this run: a task cancelled or
    # dropped while held would otherwise be dropped again the moment it is claimed.
    "held_since": None,
}


def _woken(database: str, queue: str | None, changed: bool) -> bool:
    """A task an operator made due now wakes the workers of its queue (a redrive seen
    running at once, not at the next poll); returns ``changed``."""
    if changed and queue is not None:
        connection = connections[database]
        dialect_for(connection).wake(connection, [queue])
    return changed


def redrive(
    database: str,
    task_id: str,
    now: datetime,
    *,
    clear_metadata: Sequence[str] = (),
    queue: str | None = None,
) -> bool:
    """Start a new run of a dead-lettered task: READY now, with the state of a run reset
    (``NEW_RUN``) and its history kept. Every redrive (API, admin, command) lands here.

    ``clear_metadata``: the metadata keys that live for one run (``metadata.run_keys()``),
    removed in the same statement. ``queue``: the task's, whose workers are woken."""
    changes: dict[str, Any] = {}
    if clear_metadata:
        connection = connections[database]
        column = connection.ops.quote_name("metadata")
        expression, params = dialect_for(connection).without_json_keys(column, clear_metadata)
        changes["metadata"] = RawSQL(expression, params, output_field=JSONField())
    changed = (
        TaskRecord.objects.using(database)
        .filter(pk=task_id, status=TaskResultStatus.FAILED)
        .update(**NEW_RUN, run_after=now, **changes)
    )
    return _woken(database, queue, bool(changed))


def run_now(
    database: str, task_id: str, *, attempt: int | None = None, queue: str | None = None
) -> bool:
    """Make a waiting READY task due now (by the database's clock): a retry, a scheduled
    task or one a breaker holds. Guarded in the statement: only while READY and not yet
    due, and (``attempt``) only in the wait the operator saw, so a worker that claimed it
    meanwhile (or ran it and scheduled its next retry) keeps it as it is. ``held_since``
    is kept: the breaker still counts the task's held time."""
    connection = connections[database]
    now = dialect_for(connection).current_time(connection)
    rows = TaskRecord.objects.using(database).filter(
        pk=task_id, status=TaskResultStatus.READY, run_after__gt=now
    )
    if attempt is not None:
        rows = rows.filter(attempt=attempt)
    return _woken(database, queue, bool(rows.update(run_after=now)))


# A task may be deleted unless a worker runs it (cancel it first): waiting, or finished.
DELETABLE = (TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)


def delete(database: str, task_id: str) -> bool:
    """Delete a task's row unless it is RUNNING, in one guarded statement (a claim that
    takes it first wins). A dead task blocking its ordering key no longer blocks it; a
    dedup key it held is released once none of its tasks waits (``prune_keys``)."""
    deleted, _by_model = (
        TaskRecord.objects.using(database).filter(pk=task_id, status__in=DELETABLE).delete()
    )
    return bool(deleted)


def discard(database: str, task_id: str, *, queue: str | None = None) -> bool:
    """Leave a dead-lettered task dead but stop it blocking its ordering key (the
    key's next task may run now: ``queue``'s workers are woken)."""
    changed = (
        TaskRecord.objects.using(database)
        .filter(pk=task_id, status=TaskResultStatus.FAILED, ordering_blocked=True)
        .update(ordering_blocked=False)
    )
    return _woken(database, queue, bool(changed))
