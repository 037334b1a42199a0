"""Writing many attempt outcomes in one transaction (group commit), still fenced.

A worker finishing hundreds of tasks a second would otherwise pay one commit per task.
The dialect writes the batch (``Dialect.write_outcomes``: on PostgreSQL one statement per
group of outcomes that set the same columns, elsewhere one per row) and the whole batch
commits once. Each row still lands only where its lease token matches.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, transaction

from ..lifecycle import ClaimedTask, Transition
from . import dialect_for

Completion = tuple[ClaimedTask, Transition]


def apply_transitions(database: str, completions: Sequence[Completion]) -> list[bool]:
    """Write every completion in one transaction; return, in order, which landed."""
    if not completions:
        return []
    connection = connections[database]
    with transaction.atomic(using=database):
        return dialect_for(connection).write_outcomes(connection, completions)
