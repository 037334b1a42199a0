"""What a dialect provides, and the SQL plumbing every dialect shares."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.utils.dateparse import parse_datetime

from ..compat import TaskResultStatus
from ..envelope import JsonText
from ..lifecycle import ClaimedTask
from ..models import TaskRecord
from ..stored import error_list, parse_column, worker_id_list

NOTIFY_CHANNEL = "django_tasks_plus"
# Rows per INSERT statement: well under PostgreSQL's 65,535 and SQLite's 32,766 parameters.
INSERT_CHUNK = 1000

# Inlined as literals (not parameters) so the planner can match the partial indexes.
READY = TaskResultStatus.READY.value
RUNNING = TaskResultStatus.RUNNING.value
FAILED = TaskResultStatus.FAILED.value

# Columns a claim returns, in this order.
CLAIM_COLUMNS = (
    "id",
    "task_path",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "attempt",
    "worker_ids",
    "errors",
    "enqueued_at",
    "run_after",
    "started_at",
    "lease_token",
    "backend_name",
    "ordering_key",
    "requested_run_after",
)


@cache
def _fields() -> dict[str, Field]:
    return {f.name: f for f in TaskRecord._meta.concrete_fields}


def table() -> str:
    return TaskRecord._meta.db_table


def column(name: str) -> str:
    return _fields()[name].column


def prep(name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """``value`` as the database driver wants it for column ``name`` (Django's own rules)."""
    return _fields()[name].get_db_prep_save(value, connection)


def insert_statements(
    rows: Sequence[Mapping[str, Any]],
    connection: BaseDatabaseWrapper,
    *,
    json_placeholder: str,
    sequence_sql: Callable[[int], str] | None,
) -> list[tuple[str, list[Any]]]:
    """Multi-row INSERTs (one per ``INSERT_CHUNK`` rows) of same-shaped rows.

    ``JsonText`` values are passed as text with ``json_placeholder`` (a cast where the
    database needs one), so JSON is encoded once, by the codec. ``sequence_sql(i)`` is the
    SQL expression numbering row ``i`` of a statement in enqueue order (None: the column's
    default does).
    """
    quote = connection.ops.quote_name
    names = list(rows[0])
    quoted = [quote(column(name)) for name in names]
    if sequence_sql is not None:
        quoted.append(quote(column("sequence")))
    columns = ", ".join(quoted)
    head = f"INSERT INTO {quote(table())} ({columns}) VALUES "
    statements = []
    for start in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[start : start + INSERT_CHUNK]
        tuples: list[str] = []
        params: list[Any] = []
        for index, row in enumerate(chunk):
            marks = []
            for name in names:
                value = row[name]
                if isinstance(value, JsonText):
                    marks.append(json_placeholder)
                    params.append(str(value))
                else:
                    marks.append("%s")
                    params.append(prep(name, value, connection))
            if sequence_sql is not None:
                marks.append(sequence_sql(index))
            tuples.append(f"({', '.join(marks)})")
        statements.append((head + ", ".join(tuples), params))
    return statements


def ordering_head_sql(candidate: str, quote: Callable[[str], str]) -> str:
    """SQL true for a candidate row that may run now under its ordering key.

    A keyed task runs only when no earlier task of its key is still pending (READY or
    RUNNING, or dead-lettered under ordering_failure='block') and none of its key is
    running. Earlier rows include the one a concurrent claim has locked, so two workers can
    never pick two tasks of one key; a unique index backs this up.
    """
    t = quote(table())

    def c(name: str) -> str:
        return quote(column(name))

    key, seq, status, backend = c("ordering_key"), c("sequence"), c("status"), c("backend_name")
    return f"""(
        {candidate}.{key} IS NULL OR (
            NOT EXISTS (
                SELECT 1 FROM {t} earlier
                WHERE earlier.{backend} = {candidate}.{backend}
                  AND earlier.{key} = {candidate}.{key}
                  AND earlier.{seq} < {candidate}.{seq}
                  AND (earlier.{status} IN ('{READY}', '{RUNNING}')
                       OR (earlier.{status} = '{FAILED}' AND earlier.{c("ordering_blocked")}))
            )
            AND NOT EXISTS (
                SELECT 1 FROM {t} running
                WHERE running.{backend} = {candidate}.{backend}
                  AND running.{key} = {candidate}.{key}
                  AND running.{status} = '{RUNNING}'
            )
        )
    )"""


def _as_datetime(value: Any) -> datetime | None:
    parsed = value if value is None or isinstance(value, datetime) else parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def claimed_from_row(row: Sequence[Any], claimed_at: datetime | None = None) -> ClaimedTask:
    """Build a ``ClaimedTask`` from a RETURNING row in ``CLAIM_COLUMNS`` order.

    JSON columns arrive as text (Django loads jsonb as text, SQLite stores text) and
    datetimes as text on SQLite; both are decoded here, once. A corrupt JSON column never
    raises here (see ``stored``): one bad row must not fail the claim of the others.
    """
    data = dict(zip(CLAIM_COLUMNS, row, strict=True))
    raw_id = data["id"]
    return ClaimedTask(
        id=str(raw_id if isinstance(raw_id, uuid.UUID) else uuid.UUID(str(raw_id))),
        task_path=data["task_path"],
        queue_name=data["queue_name"],
        priority=int(data["priority"]),
        args=parse_column(data["args"]),
        kwargs=parse_column(data["kwargs"]),
        attempt=int(data["attempt"]),
        worker_ids=worker_id_list(data["worker_ids"]),
        errors=error_list(data["errors"]),
        enqueued_at=_as_datetime(data["enqueued_at"]),  # type: ignore[arg-type]
        run_after=_as_datetime(data["run_after"]),  # type: ignore[arg-type]
        started_at=_as_datetime(data["started_at"]),
        lease_token=data["lease_token"],
        backend_name=data["backend_name"],
        ordering_key=data["ordering_key"],
        claimed_at=claimed_at,
        requested_run_after=_as_datetime(data["requested_run_after"]),
    )


class Dialect(ABC):
    """The SQL that differs between databases: inserting with a wake-up, claiming, and
    the database's own clock.

    Leases and due times are compared and computed with the database's clock, never the
    worker host's: a host whose clock runs fast or slow cannot then reap a live task or
    run one early, and an expiry is computed when the statement really runs, after any
    wait for a lock, not when the worker decided to send it.
    """

    vendor: str
    supports_notify: bool = False
    now_sql: str
    """The database's current time, as SQL: for comparisons (due, expired)."""
    lock_rows_sql: str = ""
    """Appended to a sub-select to lock its rows (where the database has row locks)."""

    def check(self, connection: BaseDatabaseWrapper) -> list[str]:
        """Problems that stop this database from running the queue (empty if none)."""
        return []

    @abstractmethod
    def lease_expiry(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for "``seconds`` from now" by the database's clock,
        evaluated when the row is written, so waiting for a lock cannot shorten a lease."""

    @abstractmethod
    def parse_time(self, value: Any) -> datetime:
        """A time the database returned for ``now_sql``, as an aware datetime."""

    def current_time(self, connection: BaseDatabaseWrapper) -> datetime:
        """The database's clock, now."""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {self.now_sql}", [])  # [] so that %% is unescaped
            (value,) = cursor.fetchone()
        return self.parse_time(value)

    def bound_worker_statements(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        """Make the worker's own statements on ``connection`` give up after ``seconds``
        instead of waiting without end (a stalled table must not hang the worker's
        bookkeeping threads). Task code never runs on these connections.

        The default does nothing: a database without such settings waits as it waits."""
        return None

    @abstractmethod
    def insert_tasks(
        self,
        connection: BaseDatabaseWrapper,
        rows: Sequence[Mapping[str, Any]],
        *,
        notify: bool = True,
    ) -> None:
        """Insert task rows on ``connection``, numbering them in order, waking workers."""

    @abstractmethod
    def claim(
        self,
        connection: BaseDatabaseWrapper,
        *,
        backend_name: str,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        lease_token: str,
        visibility_timeout: float,
    ) -> list[ClaimedTask]:
        """Atomically move up to ``limit`` READY, due tasks to RUNNING under a lease of
        ``visibility_timeout`` seconds; due and expiry by the database's clock."""


def sort_claimed(claimed: list[ClaimedTask]) -> list[ClaimedTask]:
    """RETURNING has no order: restore the claim order (priority, due time, id)."""
    claimed.sort(key=lambda task: (-task.priority, task.run_after, task.id))
    return claimed
