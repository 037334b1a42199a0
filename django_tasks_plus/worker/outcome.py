"""The one way an attempt's event becomes its row's next state, for every path.

The worker after a run, the worker when something unexpected broke mid-attempt, the
reaper after a lease ran out and shutdown for claims never started all go through
``outcome_for``, so the task's own retry policy and ``ordering_failure`` always apply:
no path can fall back to the backend-wide policy by accident.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from .. import compat
from ..lifecycle import ClaimedTask, ClaimEnd, Transition, transition

if TYPE_CHECKING:
    from ..backend import DatabaseBackend


def blocks_ordering(task: compat.Task | None) -> bool:
    """Whether a dead-lettered attempt of ``task`` keeps its ordering key blocked.

    A row whose task cannot be resolved has no ``ordering_failure`` to read, so it
    releases its key; cancellation never blocks (``lifecycle`` decides that).
    """
    return getattr(task, "ordering_failure", "continue") == "block"


def outcome_for(
    backend: DatabaseBackend,
    claimed: ClaimedTask,
    event: ClaimEnd,
    *,
    task: compat.Task | None,
    now: datetime,
    started: datetime | None = None,
) -> Transition:
    """The row's next state after ``event``, by ``task``'s own options (``None``: the
    row names no resolvable task, so the backend's defaults apply)."""
    policy = backend.retry_policy_for(task) if task is not None else backend.settings.retry
    return transition(
        claimed,
        event,
        policy=policy,
        now=now,
        block_ordering=blocks_ordering(task),
        started=started,
    )
