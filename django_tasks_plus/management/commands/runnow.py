"""``manage.py runnow``: make waiting tasks due now (a retry, a scheduled task, one a
circuit breaker holds), by id or by filter.

Each task goes through ``DatabaseBackend.run_now()``, as the admin's "Run now" does: a
READY task whose ``run_after`` lies ahead becomes due now, guarded by the attempt count
read with it, so a task a worker claimed (and perhaps rescheduled) meanwhile is skipped.
A held task's circuit still decides at its claim: while it is open, the breaker holds it
again (the summary says how many were held).
"""

from __future__ import annotations

from collections import Counter

from ...backend import DatabaseBackend
from ...compat import TaskResultStatus
from ...selection import Row
from ..selecting import SelectingCommand, plural, skipped_text


class Command(SelectingCommand):
    help = (
        "Run waiting tasks now: READY tasks waiting for a retry, a scheduled time or a "
        "circuit breaker become due at once. Select them by id or by filter; --dry-run "
        "shows what matches."
    )
    verb = "run now"
    statuses = (TaskResultStatus.READY.value,)

    def act(self, backend: DatabaseBackend, row: Row, lock_wait: float) -> str:
        if backend.run_now(row.id, attempt=row.attempt, lock_wait=lock_wait):
            return "made due"
        # Due already, not READY, or claimed by a worker since it was read.
        status = row.status if row.status != TaskResultStatus.READY else "not waiting"
        return f"skipped: {status}"

    def summary(self, outcomes: Counter[str], skipped: dict[str, str]) -> str:
        return f"Made {plural(outcomes['made due'], 'waiting task')} due now." + skipped_text(
            skipped, "not waiting for their time"
        )
