"""``manage.py prunetasks``: delete finished tasks now, by id or by filter.

What the leader's pruner does on its own by ``OPTIONS["RETENTION"]``, on demand: for a
backend whose workers do not run, a retention turned off, or a one-off clean-up
(``--finished-before 7d --status successful``). Only finished tasks are deleted
(SUCCESSFUL, FAILED); a FAILED task that blocks its ordering key is kept (discard or
redrive it first). The matching rows are deleted ``--batch-size`` at a time, each batch
one short statement, so a million rows never sit in one transaction. A row another
session holds locked is passed over, not waited for, and named at the end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...backend import DatabaseBackend
from ...compat import TaskResultStatus
from ...conf import UNFINISHED_STATUSES, positive_int_problem
from ...db.retention import FINISHED, delete_finished_by_id
from ...models import TaskRecord
from ...selection import Row
from ..selecting import SelectingCommand, plural, skipped_text

BATCH_SIZE = 1000
LOCKED = "locked"  # ``_kept``'s reason for a finished row the DELETE passed over


def batches(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    """``rows`` in lists of at most ``size``."""
    walk = iter(rows)
    while batch := list(islice(walk, size)):
        yield batch


class Command(SelectingCommand):
    help = (
        "Delete finished (SUCCESSFUL or FAILED) tasks, in batches. Select them by id or by "
        "filter, e.g. --finished-before 30d --status successful; --dry-run shows what matches."
    )
    verb = "prune"
    statuses = (TaskResultStatus.SUCCESSFUL.value, TaskResultStatus.FAILED.value)

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH_SIZE,
            metavar="N",
            help=f"Tasks deleted per statement (default {BATCH_SIZE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for text in options.get("statuses") or ():
            if text.strip().upper() in UNFINISHED_STATUSES:
                raise CommandError(
                    f"--status {text}: {text.strip().upper()} tasks have not finished and "
                    "are never pruned. Cancel them first (manage.py canceltasks), or "
                    "choose SUCCESSFUL or FAILED."
                )
        problem = positive_int_problem(options["batch_size"])
        if problem:
            raise CommandError(f"--batch-size {problem}.")
        self.batch_size = options["batch_size"]
        self.batches_run = 0
        super().handle(*args, **options)

    def act_on_all(
        self, backend: DatabaseBackend, rows: Iterable[Row]
    ) -> tuple[Counter[str], dict[str, str]]:
        database = backend.settings.database
        outcomes: Counter[str] = Counter()
        skipped: dict[str, str] = {}
        for batch in batches(rows, self.batch_size):
            ids = [row.id for row in batch]
            deleted = delete_finished_by_id(database, ids)
            self.batches_run += 1
            kept = self._kept(database, ids) if deleted < len(ids) else {}
            for row in batch:
                if kept.get(row.id) == LOCKED:
                    self.locked.append(row.id)
                elif row.id in kept:
                    skipped[row.id] = f"skipped: {kept[row.id]}"
                    outcomes["skipped"] += 1
                else:
                    outcomes[row.status] += 1
            # Rows gone before the DELETE (another prune) are counted as deleted: the
            # operator asked for them to be gone, and they are.
        return outcomes, skipped

    @staticmethod
    def _kept(database: str, ids: list[str]) -> dict[str, str]:
        """Why each of ``ids`` still exists after the batch's DELETE: it blocks its
        ordering key, it is no longer finished (its status), or, finished and free, its
        row was locked by another session (``LOCKED``)."""
        rows = TaskRecord.objects.using(database).filter(pk__in=ids)
        return {
            str(pk): "blocks its ordering key"
            if blocked
            else (LOCKED if status in FINISHED else status)
            for pk, status, blocked in rows.values_list("pk", "status", "ordering_blocked")
        }

    def summary(self, outcomes: Counter[str], skipped: dict[str, str]) -> str:
        by_status = [f"{outcomes[status]} {status}" for status in self.statuses if outcomes[status]]
        total = sum(outcomes[status] for status in self.statuses)
        detail = f" ({', '.join(by_status)})" if by_status else ""
        batches = "1 batch" if self.batches_run == 1 else f"{self.batches_run} batches"
        return f"Deleted {plural(total, 'task')}{detail} in {batches}." + skipped_text(
            skipped, "not deleted"
        )
