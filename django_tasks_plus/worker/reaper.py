"""Returning expired leases: safe to run in any number of workers at once.

A worker that dies (SIGKILL, OOM, lost host) stops renewing its leases. Any live
worker's reaper then treats each such attempt as failed with ``LeaseExpired``: the task's
retry policy decides between READY (attempt counted) and dead letter. Expiry is judged by
the database's clock, so a worker on a host whose clock runs ahead cannot take a live
task. Each write is fenced by the dead worker's token and by the lease still being
expired, so two reapers, or a worker that wakes up late, cannot both win. A row another
session holds locked is skipped, not waited for, and returned in a later round: one
locked row never holds up the return of the others. A worker never returns a lease it
holds itself: it is alive, so it renews that lease or writes its outcome, whose write
its own reaper must not race (after a stall, say, that outlasted the lease).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import DatabaseError, DataError, IntegrityError

from .. import compat, events
from ..db.completions import apply_outcome
from ..db.store import expired_tasks
from ..definition import resolve_task
from ..exceptions import LeaseExpired, TaskNotRegistered
from ..lifecycle import (
    Aborted,
    ClaimedTask,
    ClaimEnd,
    Failed,
    Lease,
    Transition,
    unstorable_outcome,
)
from .outcome import outcome_for

if TYPE_CHECKING:
    from ..backend import DatabaseBackend

logger = logging.getLogger("django_tasks_plus.worker")


def reap_expired(
    backend: DatabaseBackend,
    clock: Callable[[], datetime],
    limit: int = 100,
    *,
    still_prompt: Callable[[], bool] | None = None,
    spare: Collection[Lease] = (),
) -> int:
    """Settle up to ``limit`` expired leases; return how many this call settled.

    A row that cannot be settled is logged and skipped, and a row whose outcome the
    database refuses is dead-lettered alone (``_write``): one hostile row must not stop
    the others from being returned. Other database errors are the caller's to retry.

    ``still_prompt`` is asked once the expired leases are read: False (the read waited,
    for a table lock, say, as the holders' renewals did) settles none of them this time
    (see ``reapgate``).

    ``spare``: the calling worker's own leases, never returned by it.
    """
    # Read past the spared ones, so that they cannot take the others' places.
    expired = expired_tasks(backend.settings.database, backend.alias, limit + len(spare))
    expired = [claimed for claimed in expired if claimed.lease not in spare][:limit]
    if expired and still_prompt is not None and not still_prompt():
        return 0
    settled = 0
    for claimed in expired:
        try:
            settled += _reap(backend, claimed, clock())
        except DatabaseError:
            raise
        except Exception:
            logger.exception("Could not return the expired lease of task %s", claimed.id)
    return settled


def _write(
    backend: DatabaseBackend, claimed: ClaimedTask, outcome: Transition, now: datetime
) -> Transition | None:
    """Write the reaper's outcome; the outcome that landed, or None.

    A value the database refuses (``DataError``, ``IntegrityError``) settles this row
    alone, dead-lettered with ``OutcomeNotStorable`` as the outcome writer does, so it
    cannot fail every later reaper round; a lost connection is the caller's to retry.
    """
    database = backend.settings.database
    try:
        landed = apply_outcome(database, claimed, outcome, only_if_expired=True, skip_locked=True)
    except (DataError, IntegrityError) as problem:
        logger.error(
            "Task %s: the outcome of its expired lease cannot be stored (%s); "
            "dead-lettering it instead.",
            claimed.id,
            type(problem).__name__,
        )
        outcome = unstorable_outcome(claimed, outcome, problem, now=now)
        try:
            landed = apply_outcome(
                database, claimed, outcome, only_if_expired=True, skip_locked=True
            )
        except (DataError, IntegrityError):
            logger.exception("Task %s: could not record the failure either", claimed.id)
            return None
    return outcome if landed else None


def _reap(backend: DatabaseBackend, claimed: ClaimedTask, now: datetime) -> bool:
    holder = claimed.worker_ids[-1] if claimed.worker_ids else "unknown"
    task: compat.Task | None
    event: ClaimEnd
    try:
        task = resolve_task(claimed.task_path)
        event = Failed(
            LeaseExpired(
                f"worker {holder} stopped renewing its lease during attempt {claimed.attempt}"
            )
        )
    except TaskNotRegistered as exc:
        task = None
        event = Aborted(exc, reason=str(exc))
    intended = outcome_for(backend, claimed, event, task=task, now=now)
    outcome = _write(backend, claimed, intended, now)
    if outcome is None:
        return False
    events.emit_reaped(claimed, outcome, now)
    logger.warning(
        "Task %s (%s): lease of worker %s expired; now %s",
        claimed.id,
        claimed.task_path,
        holder,
        outcome.status,
    )
    return True
