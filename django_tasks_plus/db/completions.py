"""Writing many attempt outcomes in one transaction (group commit), still fenced.

A worker finishing hundreds of tasks a second would otherwise pay one commit per task.
The dialect writes the batch (``Dialect.write_outcomes``: on PostgreSQL one statement per
group of outcomes that set the same columns, elsewhere one per row) and the whole batch
commits once (a batch written by one statement, with no hook to run, commits as that
statement: no transaction is opened around it). Each row still lands only where its
lease token matches.

The registered outcome hooks (``extensions.outcome_hooks``) run in the same transaction,
after the writes, with the outcomes that landed: a feature's bookkeeping (a group's
counter, dependents becoming due) commits or rolls back with the outcomes. With no hook
registered nothing more is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, transaction

from ..extensions import WrittenOutcome, outcome_hooks, run_outcome_hooks
from ..lifecycle import ClaimedTask, Transition
from . import dialect_for
from .store import apply_transition

Completion = tuple[ClaimedTask, Transition]


def apply_transitions(
    database: str, completions: Sequence[Completion], *, expect_locks: bool = False
) -> list[bool]:
    """Write every completion in one transaction; return, in order, which landed.

    A row another session holds locked does not land (``Dialect.write_outcomes``; with
    ``expect_locks`` it is skipped without the short wait). A hook that raises rolls the
    whole batch back and the exception propagates: the caller handles it as any failed
    write (the reporter retries row by row)."""
    if not completions:
        return []
    connection = connections[database]
    dialect = dialect_for(connection)
    if not outcome_hooks and dialect.outcomes_in_one_statement(completions):
        # One statement is atomic on its own: no BEGIN and COMMIT round trips around it.
        return dialect.write_outcomes(connection, completions, expect_locks=expect_locks)
    with transaction.atomic(using=database):
        landed = dialect.write_outcomes(connection, completions, expect_locks=expect_locks)
        if outcome_hooks:
            written = [
                WrittenOutcome(claimed, outcome)
                for (claimed, outcome), ok in zip(completions, landed, strict=True)
                if ok
            ]
            run_outcome_hooks(connection, database, written)
        return landed


def apply_outcome(
    database: str,
    claimed: ClaimedTask,
    outcome: Transition,
    *,
    only_if_expired: bool = False,
    skip_locked: bool = False,
) -> bool:
    """Write one outcome outside the reporter (the reaper, a release at shutdown) with
    the outcome hooks, as ``apply_transitions`` does; one autocommit statement when no
    hook is registered. The fences are ``store.apply_transition``'s."""
    fences = {"only_if_expired": only_if_expired, "skip_locked": skip_locked}
    if not outcome_hooks:
        return apply_transition(database, claimed, outcome, **fences)
    connection = connections[database]
    with transaction.atomic(using=database):
        landed = apply_transition(database, claimed, outcome, **fences)
        if landed:
            run_outcome_hooks(connection, database, [WrittenOutcome(claimed, outcome)])
        return landed
