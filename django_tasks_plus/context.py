"""The ``TaskContext`` our worker passes to ``takes_context`` tasks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from . import compat

if TYPE_CHECKING:
    from .backend import DatabaseBackend


# django-stubs declare Django's (frozen) TaskContext as not frozen.
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskContext(compat.TaskContext):  # type: ignore[misc]
    """Django's ``TaskContext`` plus the task's metadata and a way to notice a cancel
    request while running."""

    # The task's metadata (docs/tasks.md#metadata), decoded, read-only: as enqueued.
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def cancel_requested(self) -> bool:
        """True once ``cancel()`` was called for this task (one indexed query).

        Long tasks should check it between units of work and stop, for example by
        raising ``Cancelled``, which dead-letters the task as cancelled without retrying.
        """
        from .db.store import cancel_requested

        backend = cast("DatabaseBackend", self.task_result.task.get_backend())
        return cancel_requested(backend.settings.database, self.task_result.id)
