"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims and LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..compat import TaskResultStatus
from ..lifecycle import ClaimedTask
from .base import (
    CLAIM_COLUMNS,
    NOTIFY_CHANNEL,
    Dialect,
    claimed_from_row,
    column,
    insert_sql_and_params,
    prep,
    table,
)

# Inlined as literals (not parameters) so the planner can match the partial READY index.
READY = TaskResultStatus.READY.value
RUNNING = TaskResultStatus.RUNNING.value


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    supports_notify = True

    def insert_task(
        self,
        connection: BaseDatabaseWrapper,
        values: Mapping[str, Any],
        queue_name: str,
        *,
        notify: bool = True,
    ) -> None:
        # One round trip: the insert and its NOTIFY. PostgreSQL delivers the notification
        # only when the surrounding transaction commits, and folds identical ones, so a
        # rolled-back enqueue wakes nobody and a bulk transaction wakes workers once.
        insert, params = insert_sql_and_params(values, connection)
        if not notify:
            with connection.cursor() as cursor:
                cursor.execute(insert, params)
            return
        sql = f"WITH inserted AS ({insert} RETURNING 1) SELECT pg_notify(%s, %s) FROM inserted"
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, NOTIFY_CHANNEL, queue_name])

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

        returning = ", ".join(f"{t}.{c(name)}" for name in CLAIM_COLUMNS)
        sql = f"""
            WITH picked AS (
                SELECT {c("id")} FROM {t}
                WHERE {c("status")} = '{READY}' AND {c("backend_name")} = %s
                  AND {c("queue_name")} = ANY(%s) AND {c("run_after")} <= %s
                ORDER BY {c("priority")} DESC, {c("run_after")}, {c("id")}
                LIMIT %s
                FOR UPDATE SKIP LOCKED
            )
            UPDATE {t} SET
                {c("status")} = '{RUNNING}',
                {c("lease_token")} = %s,
                {c("lease_expires_at")} = %s,
                {c("attempt")} = {t}.{c("attempt")} + 1,
                {c("worker_ids")} = {t}.{c("worker_ids")} || jsonb_build_array(%s::text),
                {c("started_at")} = COALESCE({t}.{c("started_at")}, %s),
                {c("last_attempted_at")} = %s
            FROM picked WHERE {t}.{c("id")} = picked.{c("id")}
            RETURNING {returning}
        """
        params = [
            backend_name,
            list(queues),
            prep("run_after", now, connection),
            limit,
            lease_token,
            prep("lease_expires_at", lease_expires_at, connection),
            worker_id,
            prep("started_at", now, connection),
            prep("last_attempted_at", now, connection),
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        claimed = [claimed_from_row(row) for row in rows]
        claimed.sort(key=lambda task: (-task.priority, task.run_after, task.id))
        return claimed
