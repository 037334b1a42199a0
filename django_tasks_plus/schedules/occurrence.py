"""What a scheduled task knows about why it runs: its schedule's name and occurrence time.

The scheduler writes both into the task's metadata when it enqueues an occurrence
(``store.enqueue_occurrence``); they live for the call, so a redriven task still knows
which occurrence it is. ``occurrence_of`` reads them back from a ``TaskContext``, a
``TaskResult`` (or its id) or a metadata map; None for a task no schedule enqueued.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..compat import TaskResult
from ..metadata import register_key
from ..operations import get_metadata

SCHEDULE_KEY = register_key(
    "schedule.name", lifetime="call", description="the schedule that enqueued the task"
)
OCCURRENCE_KEY = register_key(
    "schedule.at", lifetime="call", description="the occurrence (UTC) the task was enqueued for"
)


@dataclass(frozen=True)
class Occurrence:
    """The schedule that enqueued a task and the occurrence it was enqueued for."""

    schedule: str
    at: datetime  # aware, UTC; for run-now, the moment it was asked


def occurrence_metadata(schedule: str, at: datetime) -> dict[str, Any]:
    """The metadata the scheduler stores on the task of one occurrence."""
    return {SCHEDULE_KEY.name: schedule, OCCURRENCE_KEY.name: at}


def occurrence_of(source: Any) -> Occurrence | None:
    """The occurrence of a scheduled task, else None.

    ``source`` is a ``TaskContext`` (``occurrence_of(context)`` inside the task), a
    ``TaskResult`` or a task id (one read of the row), or a metadata map.
    """
    metadata: Mapping[str, Any]
    if isinstance(source, Mapping):
        metadata = source
    elif isinstance(getattr(source, "metadata", None), Mapping):
        metadata = source.metadata
    elif isinstance(source, TaskResult | str):
        metadata = get_metadata(source)
    else:
        raise TypeError(
            f"occurrence_of() takes a TaskContext, a TaskResult, a task id or a metadata "
            f"map, got {type(source).__name__}."
        )
    schedule, at = metadata.get(SCHEDULE_KEY.name), metadata.get(OCCURRENCE_KEY.name)
    if not isinstance(schedule, str) or not isinstance(at, datetime):
        return None
    return Occurrence(schedule, at)
