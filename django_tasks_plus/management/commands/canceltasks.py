"""``manage.py canceltasks``: cancel waiting tasks and stop running ones, by id or filter.

Each task goes through ``DatabaseBackend.cancel()``, as the admin's action does: a READY
task is dead-lettered as cancelled and never runs; a RUNNING task is asked to stop (its
``TaskContext.cancel_requested()`` turns true, and its next failure is not retried); a
finished task is left alone.
"""

from __future__ import annotations

from collections import Counter

from ...backend import DatabaseBackend
from ...compat import TaskResultStatus
from ...selection import Row
from ..selecting import SelectingCommand, plural, skipped_text


class Command(SelectingCommand):
    help = (
        "Cancel tasks: READY ones never run, RUNNING ones are asked to stop. Select them "
        "by id or by filter; --dry-run shows what matches."
    )
    verb = "cancel"
    statuses = (TaskResultStatus.READY.value, TaskResultStatus.RUNNING.value)

    def act(self, backend: DatabaseBackend, row: Row, lock_wait: float) -> str:
        outcome = backend.cancel(row.id, lock_wait=lock_wait)
        if outcome.outcome == "already_finished":
            return f"skipped: {outcome.status}"
        return outcome.outcome

    def summary(self, outcomes: Counter[str], skipped: dict[str, str]) -> str:
        parts = [f"Cancelled {plural(outcomes['cancelled'], 'waiting task')}"]
        if outcomes["cancel_requested"]:
            parts.append(f"asked {plural(outcomes['cancel_requested'], 'running task')} to stop")
        return "; ".join(parts) + "." + skipped_text(skipped, "already finished")
