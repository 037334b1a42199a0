"""SQLite: one ``UPDATE … RETURNING`` statement claims atomically.

SQLite has no row locks; a writing statement takes the database's write lock before it
reads, so a single UPDATE that selects and marks rows can never hand the same task to two
workers. Run SQLite in WAL mode with a busy timeout (see the docs) so readers and the one
writer do not block each other.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.dateparse import parse_datetime

from ..extensions import claim_conditions
from ..lifecycle import ClaimedTask
from . import sql
from .base import Dialect, DriverState, claimed_from_row, insert_statements, sort_claimed

MIN_SQLITE_VERSION = (3, 35, 0)  # UPDATE … RETURNING

# SQLite has no server: its clock is the host's, read inside the statement (so a wait for
# the write lock cannot make an expiry stale). The text format is the one Django stores
# datetimes in (UTC, space-separated), with milliseconds, so comparisons stay textual.
# (%% because the statements run with parameters.)
NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"

# What is due: run_after is written with microseconds (by Django, from the worker's
# clock), the clock above has milliseconds, so a task due within the current millisecond
# must count as due: otherwise a retry written "now" could be missed by the very next
# claim (and a --burst worker would stop with it still waiting).
DUE = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+0.001 seconds')"

# "N seconds from now"; its one parameter is a date modifier (``_seconds_modifier``).
LEASE_EXPIRY = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

# The next free sequence number, plus {offset}. Writes are serialized, so an INSERT can
# number its own rows: whether SQLite evaluates these sub-selects before or between row
# inserts, the numbers come out distinct and increasing.
NEXT_SEQUENCE = "(SELECT COALESCE(MAX(sequence), 0) + {offset} FROM django_tasks_plus_taskrecord)"

# The claim: one UPDATE that selects and leases its rows. SQLite takes the write lock
# before the statement reads, so no other claim can pick the same rows (no SKIP LOCKED
# needed). Every time is read inside the statement; last_attempted_at (returned last) is
# the claim's time. json_insert raises on malformed JSON, so a worker_ids that is not an
# array is replaced by a fresh one: one corrupt row must not fail every claim.
# The candidates are sql.CLAIM_CANDIDATES_CORRELATED: their cost does not grow with tasks
# due later or tasks of other queues.
# Parameters: lease token, lease modifier, worker id, backend, the queues (one JSON array),
# the claim filters', limit (twice).
CLAIM = """
    UPDATE django_tasks_plus_taskrecord SET
        status = 'RUNNING',
        lease_token = %s,
        lease_expires_at = {lease_expiry},
        attempt = attempt + 1,
        worker_ids = json_insert(
            CASE WHEN json_valid(worker_ids) AND json_type(worker_ids) = 'array'
            THEN worker_ids ELSE '[]' END,
            '$[#]', %s
        ),
        started_at = COALESCE(started_at, {now}),
        last_attempted_at = {now}
    WHERE id IN ({candidates})
    RETURNING {returning}, last_attempted_at
"""


# The served queues as rows (sql.CLAIM_LEVELS' {served}). Parameters: backend, queues (one
# JSON array).
SERVED = "(SELECT DISTINCT %s AS backend_name, value AS queue_name FROM json_each(%s))"


@lru_cache(maxsize=16)
def _claim_sql(conditions: str = "") -> str:
    """``CLAIM`` with the claim filters' ``conditions``: built once per set of filters."""
    return CLAIM.format(
        candidates=sql.claim_candidates(
            sql.CLAIM_CANDIDATES_CORRELATED, served=SERVED, now=DUE, conditions=conditions
        ),
        lease_expiry=LEASE_EXPIRY,
        now=NOW,
        returning=", ".join(sql.CLAIM_COLUMNS),
    )


# ``column`` without some keys: one JSON path parameter per key ({paths}), ``$."key"``;
# json_remove raises on text that is not JSON, hence the guard.
WITHOUT_JSON_KEYS = (
    "CASE WHEN json_valid({column}) AND json_type({column}) = 'object' "
    "THEN json_remove({column}, {paths}) ELSE {column} END"
)


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    now_sql = NOW

    def without_json_keys(self, column: str, keys: Sequence[str]) -> tuple[str, list[Any]]:
        paths = sql.placeholders(len(keys))
        return WITHOUT_JSON_KEYS.format(column=column, paths=paths), [f'$."{k}"' for k in keys]

    def json_contains(self, column: str, key: str | None, value: Any) -> tuple[str, list[Any]]:
        # No containment operator: one walk of the top level with json_each, whose
        # ``type`` tells a string from a number or a boolean (the column's CHECK
        # constraint keeps every stored value valid JSON).
        match, params = json_each_match(value)
        if key is not None:
            match, params = f"dtp_j.key = %s AND {match}", [key, *params]
        return f"EXISTS (SELECT 1 FROM json_each({column}) AS dtp_j WHERE {match})", params

    def check(self, connection: BaseDatabaseWrapper) -> list[str]:
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            wanted = ".".join(map(str, MIN_SQLITE_VERSION))
            return [
                f"SQLite {sqlite3.sqlite_version} is too old: django-tasks-plus needs "
                f"{wanted}+ for UPDATE … RETURNING."
            ]
        return []

    def driver_state(self, raw: Any) -> DriverState:
        # Django runs SQLite's driver with isolation_level None for autocommit, and an
        # explicit BEGIN for atomic blocks; in_transaction is SQLite's own answer.
        try:
            return DriverState(
                autocommit=raw.isolation_level is None,
                in_transaction=raw.in_transaction,
                usable=True,
            )
        except sqlite3.ProgrammingError:  # closed
            return DriverState(autocommit=False, in_transaction=False, usable=False)

    def insert_tasks(
        self,
        connection: BaseDatabaseWrapper,
        rows: Sequence[Mapping[str, Any]],
        *,
        notify: bool = True,
        meanwhile: Callable[[], object] | None = None,
    ) -> None:
        statements = insert_statements(
            rows,
            connection,
            json_placeholder=self.json_param,
            sequence_sql=NEXT_SEQUENCE,
        )
        with connection.cursor() as cursor:
            for insert, params in statements:
                cursor.execute(insert, params)
        if meanwhile is not None:
            meanwhile()

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
        synchronous: bool = True,  # SQLite commits as its own PRAGMA synchronous says
    ) -> list[ClaimedTask]:
        conditions, filter_params = claim_conditions(self.vendor)
        params: list[Any] = [
            lease_token,
            _seconds_modifier(visibility_timeout),
            worker_id,
            backend_name,
            json.dumps(list(queues)),
            *filter_params,
            limit,
            limit,
        ]
        with connection.cursor() as cursor:
            cursor.execute(_claim_sql(conditions), params)
            rows = cursor.fetchall()
        # The last column is the claim's time by the database clock (last_attempted_at).
        return sort_claimed([claimed_from_row(row[:-1], self.parse_time(row[-1])) for row in rows])

    def lease_expiry(self, seconds: float) -> tuple[str, list[Any]]:
        return LEASE_EXPIRY, [_seconds_modifier(seconds)]

    def parse_time(self, value: Any) -> datetime:
        parsed = parse_datetime(value) if isinstance(value, str) else value
        if not isinstance(parsed, datetime):
            raise ValueError(f"SQLite returned {value!r} for the current time")
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _seconds_modifier(seconds: float) -> str:
    """SQLite's date modifier for "``seconds`` later" (fractions allowed)."""
    return f"{seconds:+.3f} seconds"


def json_each_match(value: Any) -> tuple[str, list[Any]]:
    """The condition on a ``json_each`` row (alias ``dtp_j``) that it holds ``value``:
    scalars by type and value (``1`` and ``1.0`` are one number, as in jsonb); an object
    or array by its whole JSON text (SQLite has no containment, docs/admin.md#search)."""
    if value is True or value is False or value is None:
        return f"dtp_j.type = '{json.dumps(value)}'", []
    if isinstance(value, int | float):
        return "dtp_j.type IN ('integer', 'real') AND dtp_j.value = %s", [value]
    if isinstance(value, str):
        return "dtp_j.type = 'text' AND dtp_j.value = %s", [value]
    kind = "object" if isinstance(value, dict) else "array"
    return f"dtp_j.type = '{kind}' AND json(dtp_j.value) = json(%s)", [json.dumps(value)]
