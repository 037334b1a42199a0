"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims, LISTEN/NOTIFY wake-ups, COPY for big
enqueues and one statement per group of outcomes.

The claim and the outcome writes run through ``pgexec`` (server-side binding): their text
is fixed, so psycopg parses it once.
"""

from __future__ import annotations

import json
import select
import zoneinfo
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.db import OperationalError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..extensions import claim_conditions
from ..lifecycle import ClaimedTask, Transition
from . import sql
from .base import (
    NOTIFY_CHANNEL,
    Dialect,
    DriverState,
    claimed_from_row,
    column,
    insert_statements,
    lease_parts,
    sort_claimed,
    table,
)
from .copytext import RowsUnwritable, copy_text
from .pgexec import bound_cursor, fetch_all, worker_session

if TYPE_CHECKING:
    import msgspec.json

    from .completions import Completion

# libpq's PQtransactionStatus values (psycopg 3's pq.TransactionStatus, psycopg 2's
# extensions.TRANSACTION_STATUS_*): idle, a query in flight, in a transaction, in a failed
# one; anything else (PQTRANS_UNKNOWN) is a connection libpq has lost track of.
PQTRANS_IDLE, PQTRANS_ACTIVE, PQTRANS_INTRANS, PQTRANS_INERROR = 0, 1, 2, 3

# SQLSTATE of a lock wait that ran past lock_timeout (or a NOWAIT that met a lock).
LOCK_NOT_AVAILABLE = "55P03"

# Batches at least this big go through COPY, which skips SQL parsing of every row.
COPY_THRESHOLD = 64

# The database's clock for comparisons: fixed for the statement, so every row of a claim
# is judged due against the same instant.
NOW = "statement_timestamp()"

# "N seconds from now" (one parameter): clock_timestamp() is read when the row is written,
# after any lock wait, so a lease is never partly spent before it is handed out.
LEASE_EXPIRY = "clock_timestamp() + %s * interval '1 second'"

# The served queues as rows (sql.CLAIM_LEVELS' {served}). Parameters: backend, queues (one
# text array).
SERVED = "(SELECT DISTINCT %s::text AS backend_name, unnest(%s::text[]) AS queue_name)"

# The claim, in one round trip: lock up to LIMIT candidates no other claim holds, then
# lease them. Due is judged by statement_timestamp(), each lease runs from when its row is
# written, and last_attempted_at (returned last) is the claim's time by the database's
# clock. A hostile row whose worker_ids is not an array gets a fresh one rather than
# failing the whole claim.
# The candidates are sql.CLAIM_CANDIDATES_LATERAL: their cost does not grow with tasks due
# later or tasks of other queues. The rows are then found by primary key (an array, not a
# join: a join's method is chosen by the table's estimated size, and the worker's generic
# plan, pgexec.PLAN_ONCE, may have been made when the table was nearly empty).
# Parameters (``claim_parameters``): backend, queues (one text array), the claim filters',
# limit (twice), lease token, lease seconds, worker id.
CLAIM_TEMPLATE = """
    WITH picked AS ({candidates})
    UPDATE django_tasks_plus_taskrecord task SET
        status = 'RUNNING',
        lease_token = %s,
        lease_expires_at = {lease_expiry},
        attempt = task.attempt + 1,
        worker_ids = (
            CASE WHEN jsonb_typeof(task.worker_ids) = 'array'
            THEN task.worker_ids ELSE '[]'::jsonb END
        ) || jsonb_build_array(%s::text),
        started_at = COALESCE(task.started_at, {now}),
        last_attempted_at = {now}
    WHERE task.id = ANY (ARRAY(SELECT picked.id FROM picked)){commit}
    RETURNING {returning}, task.last_attempted_at
"""


# The claim's transaction commits without waiting for its WAL to reach the disk (a
# transaction-local setting: the session's own value is untouched). Saves the flush,
# 0.3-0.4 ms of each claim on an idle server. What it risks: a PostgreSQL crash (or a
# failover) in the moment after a claim can undo it, and the task, READY again, runs again;
# the first run's outcome then finds no lease and does not land. Any later synchronous
# commit (every outcome write is one) makes the claims before it durable too.
# OPTIONS["SYNCHRONOUS_CLAIMS"] = True leaves it out.
ASYNC_COMMIT = "\n      AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"


@lru_cache(maxsize=16)
def claim_statement(conditions: str = "", synchronous: bool = True) -> str:
    """The claim with the registered claim filters' ``conditions`` (built once per set);
    ``synchronous=False``: committed without waiting for the WAL flush (``ASYNC_COMMIT``)."""
    return CLAIM_TEMPLATE.format(
        candidates=sql.claim_candidates(
            sql.CLAIM_CANDIDATES_LATERAL,
            served=SERVED,
            now=NOW,
            skip_locked="\n            FOR UPDATE SKIP LOCKED",
            conditions=conditions,
        ),
        lease_expiry=LEASE_EXPIRY,
        now=NOW,
        commit="" if synchronous else ASYNC_COMMIT,
        # The id as text: PostgreSQL's form is the canonical one claimed_from_row keeps
        # as it is (no UUID object to build and print again per claimed row).
        returning=", ".join(
            "task.id::text" if name == "id" else f"task.{name}" for name in sql.CLAIM_COLUMNS
        ),
    )


def claim_parameters(
    *,
    backend_name: str,
    queues: Sequence[str],
    filter_params: Sequence[Any],
    limit: int,
    lease_token: str,
    visibility_timeout: float,
    worker_id: str,
) -> list[Any]:
    """The parameters of ``claim_statement``, in the order its text takes them."""
    return [
        backend_name,
        list(queues),
        *filter_params,
        limit,
        limit,
        lease_token,
        visibility_timeout,
        worker_id,
    ]


# The claim with no claim filter registered (parameters: ``claim_parameters``).
CLAIM = claim_statement()

# Wake the workers of the given queues. PostgreSQL delivers notifications only on commit
# and folds identical ones within a transaction: a rollback wakes nobody, and a batch
# wakes each queue once. Parameters: channel, queues (one text array).
NOTIFY_QUEUES = "SELECT pg_notify(%s, queue) FROM unnest(%s::text[]) AS queue"

# An INSERT and its wake-up in one round trip: the insert's parameters, then NOTIFY_QUEUES'.
INSERT_AND_NOTIFY = "WITH inserted AS ({insert}) " + NOTIFY_QUEUES

# The same for the rows of one queue, every enqueue call's case: no array to build and bind.
# Parameters: the insert's, then channel and queue.
INSERT_AND_NOTIFY_ONE = "WITH inserted AS ({insert}) SELECT pg_notify(%s, %s)"

# Bound the worker's own statements: a lock wait gives up sooner than a statement, so a
# stalled table is noticed (logged, retried) while the lease can still be renewed.
# And no JIT: the claim's planner estimate multiplies a guess of ~100 priority levels by
# the per-level cost (its real cost is a few index probes), which passes jit_above_cost
# with a deep backlog and a big prefetch; compiling then took ~270 ms of every claim. The
# worker's statements are short and run thousands of times, never worth compiling.
# Parameters: statement_timeout and lock_timeout in milliseconds, as text.
SET_WORKER_TIMEOUTS = """
    SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false),
           set_config('jit', 'off', false)
"""
# Back to each setting's value at the start of the session (its "reset value": the
# server's, the role's, or the connection options' own).
RESET_WORKER_TIMEOUTS = """
    SELECT set_config(name, reset_val, false) FROM pg_settings
     WHERE name IN ('statement_timeout', 'lock_timeout', 'jit', 'plan_cache_mode', 'enable_seqscan')
"""

# Many fenced outcomes that set the same columns, in one statement: the whole group is
# one JSON parameter that jsonb_to_recordset unpacks into typed columns. Each row lands
# only where its lease token still matches; RETURNING names the rows that landed.
# A row another session holds locked (task code's or an operator's open transaction, a
# reaper) must not hold up every outcome of the batch, and the claims that share this
# session, for as long as a lock can last. So the statement waits for row locks at most
# OUTCOME_LOCK_WAIT (set for its own transaction, by the argument evaluated before any
# row is read: no round trip of its own), long enough for the worker's own short locks
# (a lease renewal); past that it fails with lock_not_available, and the batch is
# written again with UPDATE_OUTCOMES_SKIPPING_LOCKED. Skipping every time would cost
# each row a lock of its own (about 2 µs a row more). Parameters: the records (JSON).
# {assignments}: "column = v.column" for each column the outcomes set;
# {record_columns}: ", column type" for each.
OUTCOME_LOCK_WAIT = "100ms"
UPDATE_OUTCOMES = f"""
    UPDATE django_tasks_plus_taskrecord task SET
        status = v.status, lease_token = NULL, lease_expires_at = NULL{{assignments}}
    FROM jsonb_to_recordset(
            CASE WHEN set_config('lock_timeout', '{OUTCOME_LOCK_WAIT}', true) IS NULL
                 THEN NULL ELSE %s::jsonb END
         ) AS v(id uuid, lease_token text, status text{{record_columns}})
    WHERE task.id = v.id AND task.lease_token = v.lease_token AND task.status = 'RUNNING'
    RETURNING task.id::text
"""

# The same outcomes, skipping the rows another session holds locked instead of waiting:
# the writer asks which rows were skipped (``store.leases_still_held``) and writes them
# again later. For a batch that met a lock, the outcomes written again, and batches in
# a transaction (with outcome hooks, or several statements), where a failed statement
# would spoil the rest. Same parameters and fragments as UPDATE_OUTCOMES.
UPDATE_OUTCOMES_SKIPPING_LOCKED = """
    WITH free AS (
        SELECT v.*
        FROM jsonb_to_recordset(%s::jsonb)
            AS v(id uuid, lease_token text, status text{record_columns})
        JOIN django_tasks_plus_taskrecord task ON task.id = v.id
        WHERE task.lease_token = v.lease_token AND task.status = 'RUNNING'
        FOR NO KEY UPDATE OF task SKIP LOCKED
    )
    UPDATE django_tasks_plus_taskrecord task SET
        status = v.status, lease_token = NULL, lease_expires_at = NULL{assignments}
    FROM free v
    WHERE task.id = v.id AND task.lease_token = v.lease_token AND task.status = 'RUNNING'
    RETURNING task.id::text
"""

# Extend every lease still held, in one statement, skipping rows another session holds
# locked rather than waiting for them (sql.RENEW_LEASES waits): one row locked for longer
# than the lock timeout would otherwise fail every renewal, and every other task of the
# worker would lose its lease. A skipped row is still this attempt's, so it is returned
# as held; it is renewed in a later round, once free. "mine" is read from the statement's
# snapshot, so a task whose outcome lands meanwhile is never mistaken for a lost lease.
# Parameters: the ids (uuid[]), the tokens (text[]), the lease's seconds.
RENEW_LEASES_SKIPPING_LOCKED = f"""
    WITH mine AS (
        SELECT id, lease_token FROM django_tasks_plus_taskrecord
        WHERE id = ANY(%s::uuid[]) AND lease_token = ANY(%s::text[]) AND status = 'RUNNING'
    ), renewed AS (
        UPDATE django_tasks_plus_taskrecord SET lease_expires_at = {LEASE_EXPIRY}
        WHERE id IN (
            SELECT task.id FROM django_tasks_plus_taskrecord task JOIN mine
              ON task.id = mine.id AND task.lease_token = mine.lease_token
            WHERE task.status = 'RUNNING'
            FOR NO KEY UPDATE OF task SKIP LOCKED
        )
    )
    SELECT id::text, lease_token FROM mine
"""

# This transaction's lock_timeout, bounded to %s milliseconds unless the session's is
# shorter already; returns the setting it replaced, for RESTORE_LOCK_WAIT.
BOUND_LOCK_WAIT = """
    SELECT previous, set_config(
        'lock_timeout',
        CASE WHEN bound > 0 AND bound < %s THEN previous ELSE %s::text || 'ms' END,
        true
    )
    FROM (
        SELECT current_setting('lock_timeout') AS previous,
               EXTRACT(EPOCH FROM current_setting('lock_timeout')::interval) * 1000 AS bound
    ) AS setting
"""
RESTORE_LOCK_WAIT = "SELECT set_config('lock_timeout', %s, true)"

# Whether the task table has no planner statistics yet, and whether it holds at least
# the given number of rows. pg_stats shows a column's statistics to whoever may read the
# column; the activity counters (n_live_tup) count rows without reading them. No row for
# a table that does not exist (to_regclass: NULL). Parameters: the number of rows, then
# the table's quoted name.
TASK_TABLE_LACKS_STATISTICS = """
    SELECT NOT EXISTS (
               SELECT 1 FROM pg_stats s
               WHERE s.schemaname = n.nspname AND s.tablename = c.relname
           ),
           coalesce(a.n_live_tup, 0) >= %s
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_stat_user_tables a ON a.relid = c.oid
    WHERE c.oid = to_regclass(%s)
"""

# sql.INSERT_DEDUP_KEY that first bounds the transaction's lock waits as BOUND_LOCK_WAIT
# does (until the transaction ends: its caller owns it), in the same round trip: the
# bound is set when the row is produced, before the insert meets another transaction's
# uncommitted key. Parameters: INSERT_DEDUP_KEY's, then the bound in milliseconds twice.
INSERT_DEDUP_KEY_BOUNDED = """
    INSERT INTO django_tasks_plus_dedupkey
        (backend_name, "key", task_ids, expires_at, until_finished, created_at)
    SELECT %s, %s, %s::jsonb, %s, %s, %s
    FROM (
        SELECT EXTRACT(EPOCH FROM current_setting('lock_timeout')::interval) * 1000 AS bound
    ) AS setting
    WHERE set_config(
        'lock_timeout',
        CASE WHEN bound > 0 AND bound < %s THEN current_setting('lock_timeout')
             ELSE %s::text || 'ms' END,
        true
    ) IS NOT NULL
    ON CONFLICT (backend_name, "key") DO NOTHING
    RETURNING id
"""

# PostgreSQL types of the record columns, so values arrive with the column's type.
_PG_TYPES = {
    "UUIDField": "uuid",
    "CharField": "text",
    "TextField": "text",
    "JSONField": "jsonb",
    "DateTimeField": "timestamptz",
    "PositiveIntegerField": "integer",
    "SmallIntegerField": "smallint",
    "BooleanField": "boolean",
    "BigIntegerField": "bigint",
}


# ``column`` without some keys: jsonb's ``-`` takes them as one text[] parameter.
WITHOUT_JSON_KEYS = (
    "CASE WHEN jsonb_typeof({column}) = 'object' THEN {column} - %s::text[] ELSE {column} END"
)


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    supports_notify = True
    supports_advisory_locks = True
    builds_indexes_concurrently = True
    now_sql = NOW
    skip_locked_rows_sql = " FOR UPDATE SKIP LOCKED"
    json_param = "%s::jsonb"
    driver_takes_plain_values = True
    has_search_indexes = True

    def lock_not_available(self, exc: BaseException) -> bool:
        return _lock_not_available(exc)

    def without_json_keys(self, column: str, keys: Sequence[str]) -> tuple[str, list[Any]]:
        return WITHOUT_JSON_KEYS.format(column=column), [list(keys)]

    def wake(self, connection: BaseDatabaseWrapper, queues: Sequence[str]) -> None:
        with connection.cursor() as cursor:
            cursor.execute(NOTIFY_QUEUES, [NOTIFY_CHANNEL, sorted(set(queues))])

    def json_contains(self, column: str, key: str | None, value: Any) -> tuple[str, list[Any]]:
        # jsonb containment: what the search indexes (jsonb_path_ops GIN) answer.
        wanted = [value] if key is None else {key: value}
        return f"{column} @> %s::jsonb", [json.dumps(wanted)]

    def insert_tasks(
        self,
        connection: BaseDatabaseWrapper,
        rows: Sequence[Mapping[str, Any]],
        *,
        notify: bool = True,
        meanwhile: Callable[[], object] | None = None,
    ) -> None:
        queues = sorted({row["queue_name"] for row in rows})
        if len(rows) >= COPY_THRESHOLD:
            self._copy(connection, rows, meanwhile)
            if notify:
                with connection.cursor() as cursor:
                    cursor.execute(NOTIFY_QUEUES, [NOTIFY_CHANNEL, queues])
            return
        # The sequence column is left out: its default (migration 0002) numbers the rows.
        statements = insert_statements(
            rows, connection, json_placeholder=self.json_param, sequence_sql=None
        )
        with bound_cursor(connection) as cursor:
            for insert, params in statements:
                if not notify:
                    cursor.execute(insert, params)
                elif len(queues) == 1:
                    cursor.execute(_notifying(insert), [*params, NOTIFY_CHANNEL, queues[0]])
                else:
                    statement = INSERT_AND_NOTIFY.format(insert=insert)
                    cursor.execute(statement, [*params, NOTIFY_CHANNEL, queues])
        if meanwhile is not None:
            meanwhile()

    def _copy(
        self,
        connection: BaseDatabaseWrapper,
        rows: Sequence[Mapping[str, Any]],
        meanwhile: Callable[[], object] | None,
    ) -> None:
        """Stream the rows with COPY, in the caller's transaction: as text rendered by
        ``copytext`` (the shared columns once), or through psycopg's ``write_row`` from
        the chunk that holds the first value of a type ``copytext`` does not write.

        The server takes the rows in while the client renders the next chunk, and once
        all are sent, while ``meanwhile`` runs: the client's work and the server's
        overlap instead of following each other (the COPY's end waits for the server).

        psycopg's own cursor bypasses Django's error translation, so it is wrapped here:
        a lost connection surfaces as ``django.db.OperationalError``, as on every other
        path, never as a raw ``psycopg`` error.
        """
        quote = connection.ops.quote_name
        rendered = copy_text(rows)
        names = rendered[0] if rendered is not None else list(rows[0])
        columns = ", ".join(quote(column(name)) for name in names)
        with connection.cursor() as cursor, connection.wrap_database_errors:
            raw = cursor.cursor  # psycopg's own cursor: COPY is not part of the DB-API
            with raw.copy(f"COPY {quote(table())} ({columns}) FROM STDIN") as copy:
                rest = 0  # the first row the driver writes
                if rendered is not None:
                    try:
                        for chunk in rendered[1]:
                            copy.write(chunk)
                        rest = len(rows)
                    except RowsUnwritable as unwritable:
                        rest = unwritable.start
                for row in rows[rest:]:
                    # Envelope values are already driver-ready (UUID, aware datetimes, str,
                    # int, bool, None; JSON as text), so Django's per-field prep is skipped.
                    copy.write_row([row[name] for name in names])
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
        synchronous: bool = True,
    ) -> list[ClaimedTask]:
        conditions, filter_params = claim_conditions(self.vendor, fenced=True)
        params = claim_parameters(
            backend_name=backend_name,
            queues=queues,
            filter_params=filter_params,
            limit=limit,
            lease_token=lease_token,
            visibility_timeout=visibility_timeout,
            worker_id=worker_id,
        )
        rows = fetch_all(connection, claim_statement(conditions, synchronous), params)
        # The last column is the claim's time by the database clock (last_attempted_at).
        repeated: dict[Any, Any] = {}
        shared = repeated.setdefault
        return sort_claimed(
            [
                claimed_from_row(row[:-1], row[-1], id_is_canonical=True, shared=shared)
                for row in rows
            ]
        )

    def outcomes_in_one_statement(self, completions: Sequence[Completion]) -> bool:
        """One ``UPDATE_OUTCOMES`` when every outcome has the same ``_statement_columns``
        (a batch of successes: the common case)."""
        return len({_statement_columns(outcome) for _, outcome in completions}) == 1

    def write_outcomes(
        self,
        connection: BaseDatabaseWrapper,
        completions: Sequence[Completion],
        *,
        expect_locks: bool = False,
    ) -> list[bool]:
        """One ``UPDATE_OUTCOMES`` per set of columns the outcomes set, waiting for a
        row lock at most ``OUTCOME_LOCK_WAIT``; on a longer lock, or with
        ``expect_locks`` or inside a transaction, ``UPDATE_OUTCOMES_SKIPPING_LOCKED``."""
        groups: dict[tuple[str, ...], list[Completion]] = {}
        for claimed, outcome in completions:
            groups.setdefault(_statement_columns(outcome), []).append((claimed, outcome))
        # A failed statement would spoil a transaction: there, skip locked rows at once.
        skip_at_once = expect_locks or connection.in_atomic_block or not connection.get_autocommit()
        landed: set[str] = set()
        for names, members in groups.items():
            records = _records(names, members, connection.timezone_name)
            rows = None
            if not skip_at_once:
                try:
                    rows = fetch_all(connection, _update_outcomes_sql(names), [records])
                except OperationalError as exc:
                    if not _lock_not_available(exc):
                        raise
            if rows is None:
                rows = fetch_all(connection, _skipping_locked_sql(names), [records])
            landed.update(row[0] for row in rows)  # the ids as text, as claims hold them
        return [claimed.id in landed for claimed, _ in completions]

    def driver_state(self, raw: Any) -> DriverState:
        # psycopg 3 and psycopg 2 both report libpq's transaction status.
        if raw.closed:
            return DriverState(autocommit=False, in_transaction=False, usable=False)
        pgconn = getattr(raw, "pgconn", None)  # psycopg 3: skips building a ConnectionInfo
        status = int((pgconn if pgconn is not None else raw.info).transaction_status)
        return DriverState(
            autocommit=bool(raw.autocommit),
            in_transaction=status in (PQTRANS_INTRANS, PQTRANS_INERROR),
            usable=status in (PQTRANS_IDLE, PQTRANS_INTRANS, PQTRANS_INERROR),
        )

    def hung_up(self, raw: Any) -> bool:
        """An idle session's socket has nothing to read, unless the server wrote first: a
        backend that is terminated (``pg_terminate_backend``, a restart) sends its FATAL
        message and closes. A notice or notification also wakes it: a false alarm."""
        if raw.closed:
            return True
        try:
            return _readable(raw.fileno())
        except Exception:  # no socket any more (the driver closed it): it is gone
            return True

    def gather_first_statistics(
        self, connection: BaseDatabaseWrapper, min_rows: int, seconds: float
    ) -> str:
        """``ANALYZE`` the task table once it holds ``min_rows`` rows, if it has never
        had statistics: a new deployment whose autovacuum has not come round yet, or is
        off, plans the worker's statements without any. The ``ANALYZE`` runs in a
        transaction of its own whose statements give up after ``seconds``."""
        name = connection.ops.quote_name(table())

        def lacking() -> tuple[bool, bool]:
            """(no statistics, at least ``min_rows`` rows); a missing table: neither."""
            with connection.cursor() as cursor:
                cursor.execute(TASK_TABLE_LACKS_STATISTICS, [min_rows, name])
                row = cursor.fetchone()
            return (False, False) if row is None else (bool(row[0]), bool(row[1]))

        missing, grown = lacking()
        if not missing:
            return "present"
        if not grown:
            return "too few rows"
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            milliseconds = max(1, int(seconds * 1000))
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [f"{milliseconds}ms"]
            )
            cursor.execute(f"ANALYZE {name}")
        # A user that does not own the table is skipped with a warning, not an error.
        return "refused" if lacking()[0] else "gathered"

    def renew_leases(
        self,
        connection: BaseDatabaseWrapper,
        leases: Iterable[tuple[str, str]],
        visibility_timeout: float,
    ) -> set[tuple[str, str]]:
        """``RENEW_LEASES_SKIPPING_LOCKED``: a row another session holds locked is held
        still, renewed once it is free."""
        leases = set(leases)
        ids, tokens = lease_parts(leases)
        with connection.cursor() as cursor:
            cursor.execute(RENEW_LEASES_SKIPPING_LOCKED, [ids, tokens, visibility_timeout])
            return {(row[0], row[1]) for row in cursor.fetchall()} & leases

    def prepare_worker(self) -> None:
        """msgspec's encoder for outcome batches (``_fast_records``): loaded in each
        forked worker instead, it cost each one its own 0.7 MB (summed PSS of two workers
        78.0 against 79.5 MB)."""
        _fast_records()

    def lease_expiry(self, seconds: float) -> tuple[str, list[Any]]:
        return LEASE_EXPIRY, [seconds]

    def parse_time(self, value: Any) -> datetime:
        return value

    def bound_worker_statements(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        raw = connection.connection
        if raw is None:
            return
        session = worker_session(raw)
        if session.bounded_seconds == seconds:
            return
        milliseconds = max(1, int(seconds * 1000))
        with connection.cursor() as cursor:
            cursor.execute(SET_WORKER_TIMEOUTS, [str(milliseconds), str(max(1, milliseconds // 3))])
        session.bounded_seconds = seconds

    @contextmanager
    def lock_wait_bounded(self, connection: BaseDatabaseWrapper, seconds: float) -> Iterator[None]:
        with connection.cursor() as cursor:
            milliseconds = max(1, int(seconds * 1000))
            cursor.execute(BOUND_LOCK_WAIT, [milliseconds, str(milliseconds)])
            previous = cursor.fetchone()[0]
        yield
        with connection.cursor() as cursor:  # not reached if the block failed: then
            cursor.execute(RESTORE_LOCK_WAIT, [previous])  # its rollback undoes the bound

    def insert_dedup_key(
        self,
        connection: BaseDatabaseWrapper,
        params: Sequence[Any],
        *,
        lock_wait: float | None = None,
    ) -> bool:
        if lock_wait is None:
            return super().insert_dedup_key(connection, params)
        milliseconds = max(1, int(lock_wait * 1000))
        with connection.cursor() as cursor:
            cursor.execute(INSERT_DEDUP_KEY_BOUNDED, [*params, milliseconds, str(milliseconds)])
            return cursor.fetchone() is not None

    def unbound_worker_statements(self, connection: BaseDatabaseWrapper) -> None:
        raw = connection.connection
        if raw is None:
            return
        session = worker_session(raw)
        if session.bounded_seconds is None:
            return
        with connection.cursor() as cursor:
            cursor.execute(RESET_WORKER_TIMEOUTS)
        session.unbound()


def _statement_columns(outcome: Transition) -> tuple[str, ...]:
    """The columns ``outcome`` sets, in order: outcomes with the same ones share one
    ``UPDATE_OUTCOMES`` (``write_outcomes``), which then needs no transaction around it
    (``outcomes_in_one_statement``): one rule for both."""
    return tuple(sorted(outcome.values))


@lru_cache(maxsize=64)
def _update_outcomes_sql(names: tuple[str, ...]) -> str:
    """``UPDATE_OUTCOMES`` for outcomes that set ``names``: built once per set of columns."""
    return UPDATE_OUTCOMES.format(**_outcome_fragments(names))


@lru_cache(maxsize=64)
def _skipping_locked_sql(names: tuple[str, ...]) -> str:
    """``UPDATE_OUTCOMES_SKIPPING_LOCKED`` for outcomes that set ``names``."""
    return UPDATE_OUTCOMES_SKIPPING_LOCKED.format(**_outcome_fragments(names))


def _outcome_fragments(names: tuple[str, ...]) -> dict[str, str]:
    return {
        "assignments": "".join(f", {column(name)} = {_record_value(name)}" for name in names),
        "record_columns": "".join(f", {name} {_record_type(name)}" for name in names),
    }


def _lock_not_available(exc: BaseException) -> bool:
    """Whether ``exc`` (Django's, or the driver's under it) is PostgreSQL's
    lock_not_available: a lock timeout, not a lost connection."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return getattr(cause, "sqlstate", None) == LOCK_NOT_AVAILABLE


def _internal_type(name: str) -> str:
    from ..models import TaskRecord

    return TaskRecord._meta.get_field(name).get_internal_type()


def _record_type(name: str) -> str:
    """A record column's type: the task column's, but microseconds for a datetime."""
    kind = _internal_type(name)
    return "bigint" if kind == "DateTimeField" else _PG_TYPES[kind]


def _record_value(name: str) -> str:
    """The value a record column assigns. A datetime travels as whole microseconds since
    the epoch (``_micros``: a fifth of the client's cost of ISO text, and no date parsing
    on the server), rebuilt exactly: whole seconds, then the rest in microseconds, so no
    factor exceeds what a double holds exactly, even in year 9999."""
    if _internal_type(name) != "DateTimeField":
        return f"v.{name}"
    return (
        f"(timestamptz 'epoch' + (v.{name} / 1000000) * interval '1 second'"
        f" + (v.{name} %% 1000000) * interval '1 microsecond')"
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(value: datetime, session_zone: str) -> int:
    """Microseconds since the epoch; a naive datetime (``USE_TZ = False``) is read in the
    session's time zone, as PostgreSQL would have read it as text."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=zoneinfo.ZoneInfo(session_zone))
    return (value - _EPOCH) // _MICROSECOND


# Outcome values are JSON-ready (datetimes made integers first); NaN never reaches here
# (the codec refuses it). msgspec's encoder takes a batch in an eighth of the standard
# library's time (about 1.2 µs a task); what it refuses (text a lone surrogate makes
# unencodable, a type it does not know, nesting past its recursion limit) goes to the
# standard encoder, which writes or raises as it always did, its allow_nan=False guarding
# the SQL from an invalid literal.
_RECORDS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@lru_cache(maxsize=1)
def _fast_records() -> msgspec.json.Encoder:
    """msgspec's encoder, imported with the first batch of outcomes, so a process that
    only enqueues (a web server) never loads it; a worker supervisor loads it before it
    forks its workers (``prepare_worker``), so they share it."""
    import msgspec.json

    return msgspec.json.Encoder()


def _records(names: tuple[str, ...], members: Sequence[Completion], session_zone: str) -> str:
    """The group as one JSON array of objects: id, lease token, status and ``names``.

    One text parameter, encoded by the C JSON encoder, costs far less on the client than
    a parameter (or an array element) per value; ``jsonb_to_recordset`` unpacks it.
    A JSON ``null`` arrives as SQL NULL, as the ORM stores a null JSON column.
    """
    records = []
    for claimed, outcome in members:
        record: dict[str, Any] = {
            "id": claimed.id,
            "lease_token": claimed.lease_token,
            "status": outcome.status,
        }
        values = outcome.values
        for name in names:
            value = values[name]
            record[name] = _micros(value, session_zone) if isinstance(value, datetime) else value
        records.append(record)
    try:
        return _fast_records().encode(records).decode()
    except Exception:  # whatever msgspec refuses, the standard encoder decides as before
        return _RECORDS.encode(records)


def _readable(fd: int) -> bool:
    """Whether ``fd`` has data (or an end of file) waiting, without waiting."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # Windows: no poll()
    return bool(readable)


@lru_cache(maxsize=64)
def _notifying(insert: str) -> str:
    """``insert`` with the wake-up of its one queue: the same text for the same shape."""
    return INSERT_AND_NOTIFY_ONE.format(insert=insert)
