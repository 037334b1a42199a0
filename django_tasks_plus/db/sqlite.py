"""SQLite: one ``UPDATE … RETURNING`` statement claims atomically.

SQLite has no row locks; a writing statement takes the database's write lock before it
reads, so a single UPDATE that selects and marks rows can never hand the same task to two
workers. Run SQLite in WAL mode with a busy timeout (see the docs) so readers and the one
writer do not block each other.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.dateparse import parse_datetime

from ..lifecycle import ClaimedTask
from .base import (
    CLAIM_COLUMNS,
    READY,
    RUNNING,
    Dialect,
    claimed_from_row,
    column,
    insert_statements,
    ordering_head_sql,
    sort_claimed,
    table,
)

MIN_SQLITE_VERSION = (3, 35, 0)  # UPDATE … RETURNING


# SQLite has no server: its clock is the host's, read inside the statement (so a wait for
# the write lock cannot make an expiry stale). The text format is the one Django stores
# datetimes in (UTC, space-separated), with milliseconds, so comparisons stay textual.
_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
_NOW_PLUS = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"


class SQLiteDialect(Dialect):
    vendor = "sqlite"

    def check(self, connection: BaseDatabaseWrapper) -> list[str]:
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            wanted = ".".join(map(str, MIN_SQLITE_VERSION))
            return [
                f"SQLite {sqlite3.sqlite_version} is too old: django-tasks-plus needs "
                f"{wanted}+ for UPDATE … RETURNING."
            ]
        return []

    def insert_tasks(
        self,
        connection: BaseDatabaseWrapper,
        rows: Sequence[Mapping[str, Any]],
        *,
        notify: bool = True,
    ) -> None:
        quote = connection.ops.quote_name
        # Writes are serialized, so the statement itself can number its rows: whether
        # SQLite evaluates the sub-selects before or between row inserts, the numbers
        # come out distinct and increasing.
        next_sequence = (
            f"(SELECT COALESCE(MAX({quote(column('sequence'))}), 0) + {{offset}} "
            f"FROM {quote(table())})"
        )
        statements = insert_statements(
            rows,
            connection,
            json_placeholder="%s",
            sequence_sql=lambda index: next_sequence.format(offset=index + 1),
        )
        with connection.cursor() as cursor:
            for insert, params in statements:
                cursor.execute(insert, params)

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
        quote = connection.ops.quote_name
        t = quote(table())

        def c(name: str) -> str:
            return quote(column(name))

        queue_marks = ", ".join(["%s"] * len(queues))
        returning = ", ".join(c(name) for name in CLAIM_COLUMNS)
        sql = f"""
            UPDATE {t} SET
                {c("status")} = '{RUNNING}',
                {c("lease_token")} = %s,
                {c("lease_expires_at")} = {_NOW_PLUS},
                {c("attempt")} = {c("attempt")} + 1,
                {c("worker_ids")} = json_insert({_array_or_empty(c("worker_ids"))}, '$[#]', %s),
                {c("started_at")} = COALESCE({c("started_at")}, {_NOW}),
                {c("last_attempted_at")} = {_NOW}
            WHERE {c("id")} IN (
                SELECT candidate.{c("id")} FROM {t} candidate
                WHERE candidate.{c("status")} = '{READY}'
                  AND candidate.{c("backend_name")} = %s
                  AND candidate.{c("queue_name")} IN ({queue_marks})
                  AND candidate.{c("run_after")} <= {_NOW}
                  AND {ordering_head_sql("candidate", quote)}
                ORDER BY candidate.{c("priority")} DESC, candidate.{c("run_after")},
                         candidate.{c("id")}
                LIMIT %s
            )
            RETURNING {returning}, {c("last_attempted_at")}
        """
        params = [
            lease_token,
            _seconds_modifier(visibility_timeout),
            worker_id,
            backend_name,
            *queues,
            limit,
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        # The last column is the claim's time by the database clock (last_attempted_at).
        return sort_claimed([claimed_from_row(row[:-1], self.parse_time(row[-1])) for row in rows])

    now_sql = _NOW

    def lease_expiry(self, seconds: float) -> tuple[str, list[Any]]:
        return _NOW_PLUS, [_seconds_modifier(seconds)]

    def parse_time(self, value: Any) -> datetime:
        parsed = parse_datetime(value) if isinstance(value, str) else value
        if not isinstance(parsed, datetime):
            raise ValueError(f"SQLite returned {value!r} for the current time")
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _seconds_modifier(seconds: float) -> str:
    """SQLite's date modifier for "``seconds`` later" (fractions allowed)."""
    return f"{seconds:+.3f} seconds"


def _array_or_empty(column_sql: str) -> str:
    """The column if it holds a JSON array, else ``'[]'``: one corrupt row must not make
    every claim fail (``json_insert`` raises on malformed JSON)."""
    return (
        f"CASE WHEN json_valid({column_sql}) AND json_type({column_sql}) = 'array' "
        f"THEN {column_sql} ELSE '[]' END"
    )
