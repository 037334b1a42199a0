"""Rows another session holds locked: an operator's change to one task row waits a
bounded time for the row's lock, and a writer of the engine's passes over such rows.

Cancel, redrive, run now, discard and delete (from app code, the admin, the commands)
each change one task row. A session that keeps that row locked (task code inside a long
transaction, a script, a ``psql`` session left open) would make the change wait until
that transaction ends: an admin request that never answers, a command stuck at one row
of thousands. So the row is locked first with ``NOWAIT``, tried again after short pauses
until a deadline, and past it the change raises ``TaskRowLocked`` having changed
nothing. The worker's own locks on a row last milliseconds and are waited out.

The engine's own writers that must not wait at all (the reaper's fence, holding and
releasing a breaker key's tasks) take ``unlocked(rows)``: the rows less those another
session holds locked, in one statement.

Where the database has no row locks (SQLite locks the whole file, and waits for it by
its busy timeout) the change runs as before.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.models import Model, QuerySet
from django.db.models.expressions import RawSQL

from ..exceptions import TaskRowLocked
from . import dialect_for
from .sql import TASKS

# One task's row, locked for the change, or refused at once if another session holds it.
LOCK_ROW = f"SELECT 1 FROM {TASKS} WHERE id = %s FOR UPDATE NOWAIT"

OPERATOR_LOCK_WAIT = 5.0
"""Seconds an operator's change to one task waits for its row by default."""

M = TypeVar("M", bound=Model)

FIRST_PAUSE = 0.01
LONGEST_PAUSE = 0.25


@contextmanager
def task_row_held(database: str, task_id: str, wait: float = OPERATOR_LOCK_WAIT) -> Iterator[None]:
    """Run the block in a transaction holding ``task_id``'s row lock, taken within
    ``wait`` seconds (``0``: one try); else raise ``TaskRowLocked``.

    Inside a caller's transaction the lock is taken in a savepoint, so a refused try
    leaves that transaction usable; the lock then lasts until the caller's commit, as
    the change's own would. A task that no longer exists is not an error here: the
    change finds no row, as it would have."""
    connection = connections[database]
    if not connection.features.has_select_for_update_nowait:
        yield
        return
    dialect = dialect_for(connection)
    key = uuid.UUID(task_id)
    began = time.monotonic()
    pause = FIRST_PAUSE
    while True:
        held = False
        try:
            with transaction.atomic(using=database):
                with connection.cursor() as cursor:
                    cursor.execute(LOCK_ROW, [key])
                held = True
                yield
            return
        except DatabaseError as exc:
            if held or not dialect.lock_not_available(exc):
                raise
        waited = time.monotonic() - began
        if waited >= wait:
            raise TaskRowLocked(
                f"Task {task_id}: another database session holds its row locked (a "
                f"transaction still open in task code, a script or a psql session); "
                f"waited {waited:.1f} s and changed nothing. Try again once that "
                "transaction ends.",
                task_id=task_id,
                waited=waited,
            )
        time.sleep(min(pause, wait - waited))  # the last try falls on the deadline
        pause = min(pause * 2, LONGEST_PAUSE)


@dataclass
class LockPatience:
    """How long one bulk action (the admin's, a command's) waits, in all, for rows other
    sessions hold: each row may wait ``per_row`` seconds until ``total`` seconds have
    gone to rows that stayed locked; then each gets one try, so a long transaction that
    holds a thousand of the rows costs the action seconds, not hours."""

    per_row: float = OPERATOR_LOCK_WAIT
    total: float = 2 * OPERATOR_LOCK_WAIT
    spent: float = 0.0

    def wait(self) -> float:
        """What the next row may wait."""
        return max(0.0, min(self.per_row, self.total - self.spent))

    def gave_up(self, waited: float) -> None:
        """Count a row that stayed locked past its wait (``waited`` seconds)."""
        self.spent += waited


@contextmanager
def lock_refused_as(database: str, error: Callable[[float], Exception]) -> Iterator[None]:
    """Raise ``error(seconds waited)`` for the database's refusal of a lock inside the
    block (a bounded lock wait that ran out): a typed error that says which row and what
    to do, instead of the driver's. Any other failure passes unchanged."""
    began = time.monotonic()
    try:
        yield
    except OperationalError as exc:
        if not dialect_for(connections[database]).lock_not_available(exc):
            raise
        raise error(time.monotonic() - began) from exc


def unlocked(rows: QuerySet[M, Any]) -> QuerySet[M, Any]:
    """``rows`` less those another session holds locked, where the database has row
    locks, as one queryset to update or delete: a writer that must not wait behind a
    transaction someone keeps open takes the rest now, and the row left out is met
    again later (at its own claim, or the caller's next round).

    The outer statement picks the rows by id alone: the sub-select's ``FOR UPDATE``
    checks its conditions again on a row changed since its snapshot, and repeating them
    outside let the planner rescan the sub-select for every row (a release of 20,000
    held tasks took 100 s instead of 0.6 s)."""
    connection = connections[rows.db]
    suffix = dialect_for(connection).skip_locked_rows_sql
    if not suffix:
        return rows
    ids, params = rows.values("pk").query.get_compiler(connection=connection).as_sql()
    return rows.model._default_manager.using(rows.db).filter(pk__in=RawSQL(ids + suffix, params))
