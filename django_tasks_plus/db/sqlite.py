"""SQLite: one ``UPDATE … RETURNING`` statement claims atomically.

SQLite has no row locks; a writing statement takes the database's write lock before it
reads, so a single UPDATE that selects and marks rows can never hand the same task to two
workers. Run SQLite in WAL mode with a busy timeout (see the docs) so readers and the one
writer do not block each other.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

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
    prep,
    sort_claimed,
    table,
)

MIN_SQLITE_VERSION = (3, 35, 0)  # UPDATE … RETURNING


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
        now: datetime,
        lease_expires_at: datetime,
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
                {c("lease_expires_at")} = %s,
                {c("attempt")} = {c("attempt")} + 1,
                {c("worker_ids")} = json_insert({_array_or_empty(c("worker_ids"))}, '$[#]', %s),
                {c("started_at")} = COALESCE({c("started_at")}, %s),
                {c("last_attempted_at")} = %s
            WHERE {c("id")} IN (
                SELECT candidate.{c("id")} FROM {t} candidate
                WHERE candidate.{c("status")} = '{READY}'
                  AND candidate.{c("backend_name")} = %s
                  AND candidate.{c("queue_name")} IN ({queue_marks})
                  AND candidate.{c("run_after")} <= %s
                  AND {ordering_head_sql("candidate", quote)}
                ORDER BY candidate.{c("priority")} DESC, candidate.{c("run_after")},
                         candidate.{c("id")}
                LIMIT %s
            )
            RETURNING {returning}
        """
        params = [
            lease_token,
            prep("lease_expires_at", lease_expires_at, connection),
            worker_id,
            prep("started_at", now, connection),
            prep("last_attempted_at", now, connection),
            backend_name,
            *queues,
            prep("run_after", now, connection),
            limit,
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return sort_claimed([claimed_from_row(row, now) for row in rows])


def _array_or_empty(column_sql: str) -> str:
    """The column if it holds a JSON array, else ``'[]'``: one corrupt row must not make
    every claim fail (``json_insert`` raises on malformed JSON)."""
    return (
        f"CASE WHEN json_valid({column_sql}) AND json_type({column_sql}) = 'array' "
        f"THEN {column_sql} ELSE '[]' END"
    )
