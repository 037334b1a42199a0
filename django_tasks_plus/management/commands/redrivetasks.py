"""``manage.py redrivetasks``: run dead-lettered tasks again, by id or by filter.

Each task goes through ``DatabaseBackend.redrive()``, as the admin's action does: back to
READY with a fresh retry budget, its errors and worker history kept, its ordering key
released, a ``task.redriven`` event emitted.
"""

from __future__ import annotations

from collections import Counter

from ...backend import DatabaseBackend
from ...compat import TaskResultStatus
from ...selection import Row
from ..selecting import SelectingCommand, plural, skipped_text


class Command(SelectingCommand):
    help = (
        "Redrive dead-lettered (FAILED) tasks: run them again with a fresh retry budget, "
        "keeping their history. Select them by id or by filter; --dry-run shows what matches."
    )
    verb = "redrive"
    statuses = (TaskResultStatus.FAILED.value,)

    def act(self, backend: DatabaseBackend, row: Row, lock_wait: float) -> str:
        if backend.redrive(row.id, lock_wait=lock_wait):
            return "redriven"
        # Not FAILED when selected (named by id), or redriven by someone else meanwhile.
        status = row.status if row.status != TaskResultStatus.FAILED else "no longer FAILED"
        return f"skipped: {status}"

    def summary(self, outcomes: Counter[str], skipped: dict[str, str]) -> str:
        return f"Redriven {plural(outcomes['redriven'], 'task')}." + skipped_text(
            skipped, "not FAILED"
        )
