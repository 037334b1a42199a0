"""Returning expired leases: safe to run in any number of workers at once.

A worker that dies (SIGKILL, OOM, lost host) stops renewing its leases. Any live
worker's reaper then treats each such attempt as failed with ``LeaseExpired``: the task's
retry policy decides between READY (attempt counted) and dead letter. Each write is fenced
by the dead worker's token and by the lease still being expired, so two reapers, or a
worker that wakes up late, cannot both win.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from ..db.store import apply_transition, expired_tasks
from ..definition import resolve_task
from ..exceptions import LeaseExpired, TaskNotRegistered
from ..lifecycle import Aborted, Event, Failed, transition

if TYPE_CHECKING:
    from ..backend import DatabaseBackend

logger = logging.getLogger("django_tasks_plus.worker")


def reap_expired(backend: DatabaseBackend, clock: Callable[[], datetime], limit: int = 100) -> int:
    """Settle up to ``limit`` expired leases; return how many this call settled."""
    database = backend.settings.database
    now = clock()
    settled = 0
    for claimed in expired_tasks(database, backend.alias, now, limit):
        holder = claimed.worker_ids[-1] if claimed.worker_ids else "unknown"
        policy = backend.settings.retry
        block = False
        event: Event
        try:
            task = resolve_task(claimed.task_path)
            policy = backend.retry_policy_for(task)
            block = getattr(task, "ordering_failure", "continue") == "block"
            event = Failed(
                LeaseExpired(
                    f"worker {holder} stopped renewing its lease during attempt {claimed.attempt}"
                )
            )
        except TaskNotRegistered as exc:
            event = Aborted(exc, reason=str(exc))
        outcome = transition(claimed, event, policy=policy, now=now, block_ordering=block)
        if apply_transition(database, claimed, outcome, lease_expired_before=now):
            settled += 1
            logger.warning(
                "Task %s (%s): lease of worker %s expired; now %s",
                claimed.id,
                claimed.task_path,
                holder,
                outcome.status,
            )
    return settled
