"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims and LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..lifecycle import ClaimedTask
from .base import (
    CLAIM_COLUMNS,
    NOTIFY_CHANNEL,
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
from .pgexec import fetch_all

# Batches at least this big go through COPY, which skips SQL parsing of every row.
COPY_THRESHOLD = 64


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    supports_notify = True

    def insert_tasks(
        self,
        connection: BaseDatabaseWrapper,
        rows: Sequence[Mapping[str, Any]],
        *,
        notify: bool = True,
    ) -> None:
        queues = sorted({row["queue_name"] for row in rows})
        if len(rows) >= COPY_THRESHOLD:
            self._copy(connection, rows)
            if notify:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_notify(%s, queue) FROM unnest(%s::text[]) AS queue",
                        [NOTIFY_CHANNEL, queues],
                    )
            return
        # The sequence column is left out: its default (migration 0002) numbers the rows.
        statements = insert_statements(
            rows, connection, json_placeholder="%s::jsonb", sequence_sql=None
        )
        with connection.cursor() as cursor:
            for insert, params in statements:
                if not notify:
                    cursor.execute(insert, params)
                    continue
                # One round trip per chunk: the insert and its NOTIFY. PostgreSQL delivers
                # notifications only on commit and folds identical ones within a
                # transaction, so a rollback wakes nobody and a batch wakes workers once.
                cursor.execute(
                    f"WITH inserted AS ({insert}) "
                    "SELECT pg_notify(%s, queue) FROM unnest(%s::text[]) AS queue",
                    [*params, NOTIFY_CHANNEL, queues],
                )

    def _copy(self, connection: BaseDatabaseWrapper, rows: Sequence[Mapping[str, Any]]) -> None:
        """Stream the rows with COPY, in the caller's transaction."""
        quote = connection.ops.quote_name
        names = list(rows[0])
        columns = ", ".join(quote(column(name)) for name in names)
        with connection.cursor() as cursor:
            raw = cursor.cursor  # psycopg's own cursor: COPY is not part of the DB-API
            with raw.copy(f"COPY {quote(table())} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    # Envelope values are already driver-ready (UUID, aware datetimes, str,
                    # int, bool, None; JSON as text), so Django's per-field prep is skipped.
                    copy.write_row(list(row.values()))

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
        params = [
            backend_name,
            list(queues),
            now,
            limit,
            lease_token,
            lease_expires_at,
            worker_id,
            now,
            now,
        ]
        rows = fetch_all(connection, _claim_sql(connection.ops.quote_name), params)
        return sort_claimed([claimed_from_row(row, now) for row in rows])


@lru_cache(maxsize=8)
def _claim_sql(quote: Callable[[str], str]) -> str:
    """The claim statement; its text never changes, so it is built once per connection."""
    t = quote(table())

    def c(name: str) -> str:
        return quote(column(name))

    returning = ", ".join(f"{t}.{c(name)}" for name in CLAIM_COLUMNS)
    return f"""
        WITH picked AS (
            SELECT candidate.{c("id")} FROM {t} candidate
            WHERE candidate.{c("status")} = '{READY}'
              AND candidate.{c("backend_name")} = %s
              AND candidate.{c("queue_name")} = ANY(%s)
              AND candidate.{c("run_after")} <= %s
              AND {ordering_head_sql("candidate", quote)}
            ORDER BY candidate.{c("priority")} DESC, candidate.{c("run_after")},
                     candidate.{c("id")}
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        )
        UPDATE {t} SET
            {c("status")} = '{RUNNING}',
            {c("lease_token")} = %s,
            {c("lease_expires_at")} = %s,
            {c("attempt")} = {t}.{c("attempt")} + 1,
            {c("worker_ids")} = (
                CASE WHEN jsonb_typeof({t}.{c("worker_ids")}) = 'array'
                THEN {t}.{c("worker_ids")} ELSE '[]'::jsonb END
            ) || jsonb_build_array(%s::text),
            {c("started_at")} = COALESCE({t}.{c("started_at")}, %s),
            {c("last_attempted_at")} = %s
        FROM picked WHERE {t}.{c("id")} = picked.{c("id")}
        RETURNING {returning}
    """
