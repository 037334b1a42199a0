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
        """Stream the rows with COPY, in the caller's transaction.

        psycopg's own cursor bypasses Django's error translation, so it is wrapped here:
        a lost connection surfaces as ``django.db.OperationalError``, as on every other
        path, never as a raw ``psycopg`` error.
        """
        quote = connection.ops.quote_name
        names = list(rows[0])
        columns = ", ".join(quote(column(name)) for name in names)
        with connection.cursor() as cursor, connection.wrap_database_errors:
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
        visibility_timeout: float,
    ) -> list[ClaimedTask]:
        params = [backend_name, list(queues), limit, lease_token, visibility_timeout, worker_id]
        rows = fetch_all(connection, _claim_sql(connection.ops.quote_name), params)
        # The last column is the claim's time by the database clock (last_attempted_at).
        return sort_claimed([claimed_from_row(row[:-1], row[-1]) for row in rows])

    now_sql = "statement_timestamp()"
    lock_rows_sql = " FOR UPDATE"

    def lease_expiry(self, seconds: float) -> tuple[str, list[Any]]:
        # clock_timestamp() is read when the row is written: after any lock wait.
        return "clock_timestamp() + %s * interval '1 second'", [seconds]

    def parse_time(self, value: Any) -> datetime:
        return value  # type: ignore[no-any-return]

    def bound_worker_statements(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        raw = connection.connection
        if raw is None or getattr(raw, "_dtp_bounded", None) == seconds:
            return
        milliseconds = max(1, int(seconds * 1000))
        with connection.cursor() as cursor:
            # A lock wait gives up sooner than a statement, so a stalled table is noticed
            # (and logged, and retried) while the lease can still be renewed.
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, false), "
                "set_config('lock_timeout', %s, false)",
                [str(milliseconds), str(max(1, milliseconds // 3))],
            )
        raw._dtp_bounded = seconds


@lru_cache(maxsize=8)
def _claim_sql(quote: Callable[[str], str]) -> str:
    """The claim statement; its text never changes, so it is built once per connection.

    Every time in it is the database's: due is ``run_after <= statement_timestamp()``, and
    the lease runs from when each row is written (``clock_timestamp()``), so a claim that
    waited for a lock does not hand out a lease that is already partly spent.
    """
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
              AND candidate.{c("run_after")} <= statement_timestamp()
              AND {ordering_head_sql("candidate", quote)}
            ORDER BY candidate.{c("priority")} DESC, candidate.{c("run_after")},
                     candidate.{c("id")}
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        )
        UPDATE {t} SET
            {c("status")} = '{RUNNING}',
            {c("lease_token")} = %s,
            {c("lease_expires_at")} = clock_timestamp() + %s * interval '1 second',
            {c("attempt")} = {t}.{c("attempt")} + 1,
            {c("worker_ids")} = (
                CASE WHEN jsonb_typeof({t}.{c("worker_ids")}) = 'array'
                THEN {t}.{c("worker_ids")} ELSE '[]'::jsonb END
            ) || jsonb_build_array(%s::text),
            {c("started_at")} = COALESCE({t}.{c("started_at")}, statement_timestamp()),
            {c("last_attempted_at")} = statement_timestamp()
        FROM picked WHERE {t}.{c("id")} = picked.{c("id")}
        RETURNING {returning}, {t}.{c("last_attempted_at")}
    """
