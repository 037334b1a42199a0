"""Running the worker's hot statements on PostgreSQL with server-side parameter binding.

Django's psycopg backend binds parameters on the client by default: every execution
re-parses the SQL text for placeholders and quotes each value into it. For the claim and
the batched completions, that was about a sixth of a worker's CPU. Here the SQL text is
fixed (a batch of outcomes travels as one JSON parameter, not as one placeholder per
value), so psycopg's placeholder cache applies and values are sent separately.

They are also prepared, on the worker's own session, and planned once: parsing and
planning the claim took about 1.5 ms of each idle claim's 1.8 (an empty table, this
machine), so every fresh task waited that long before it started. PostgreSQL keeps
re-planning a prepared claim with each call's values (its generic plan is estimated
dearer, though its shape is the same), so the session asks for the generic plan, made
of index paths only (``PLAN_ONCE``). A project that sets
``OPTIONS["prepare_threshold"] = None`` in so many words opts out. Behind a pooler that
cannot keep prepared statements (PgBouncer in transaction mode before 1.21), the first
statement that misses its prepared statement turns preparing off for that session, with
a warning, and is run again unprepared (inside a transaction: raised as a lost
connection, which the outcome writer retries): nothing is lost.

The statements still run on Django's connection, inside its transaction management, and
driver errors still surface as ``django.db`` exceptions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from functools import cache
from typing import Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_tasks_plus.worker")

# psycopg prepares a statement once it has run this many times, unless told to at the
# call: a count no statement reaches, so on the worker's session only the statements
# named here are prepared, not every query of a bookkeeping thread.
ONLY_WHEN_ASKED = 2**31 - 1

# SQLSTATEs of a prepared statement the server session does not hold as psycopg
# believes: missing (26000: a pooler gave us another server session), or already there
# under the same name (42P05: another client's, on a shared server session).
PREPARED_STATEMENT_TROUBLE = frozenset({"26000", "42P05"})

# The generic plan for every statement prepared on the session, and index paths only:
# set only on the session ``fetch_all`` runs on (the claim loop's and outcome writer's),
# whose prepared statements are the worker's own, written with literal statuses so a
# generic plan still matches the partial indexes. A generic plan is kept until the table's
# statistics change, so one made while the table was nearly empty would otherwise read
# the whole table once it is not (a sequential scan is the cheapest plan for a few rows;
# measured: a claim beside 200,000 rows took 190 ms instead of 0.5). Every statement of
# the session reaches its rows through an index. Undone with the worker's other bounds
# (``RESET_WORKER_TIMEOUTS``).
PLAN_ONCE = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', false),"
    " set_config('enable_seqscan', 'off', false)"
)


@dataclass
class WorkerSession:
    """What the worker has set on one PostgreSQL session. Kept on the driver's connection
    object, which lives exactly as long as the server session, so a reconnect starts
    from nothing; written here and by the dialect's bound/unbound, read nowhere else."""

    # The worker's statement and lock timeouts (``Dialect.bound_worker_statements``);
    # None on an application's session, which ``fetch_all`` never prepares on.
    bounded_seconds: float | None = None
    # ``PLAN_ONCE`` is set and ``fetch_all`` prepares its statements.
    planned_once: bool = False
    # A prepared statement failed here (a pooler): prepare nothing more on this session.
    unprepared: bool = False

    def unbound(self) -> None:
        """The worker's settings were reset (``RESET_WORKER_TIMEOUTS`` undoes
        ``PLAN_ONCE`` too): set them again before preparing."""
        self.bounded_seconds = None
        self.planned_once = False


def worker_session(raw: Any) -> WorkerSession:
    """The worker's record of the session behind the driver connection ``raw``."""
    state = getattr(raw, "_dtp_worker_session", None)
    if state is None:
        state = WorkerSession()
        raw._dtp_worker_session = state
    return cast(WorkerSession, state)


def fetch_all(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> list[Any]:
    """Execute ``sql`` with server-side binding on Django's connection, prepared where
    the session may (``prepares``); return the rows."""
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
        prepare = prepares(connection)
        if connection.timezone is UTC:
            # Django's timestamp loader re-stamps each value with its time zone in Python
            # (a twentieth of a worker's CPU in a drain: six timestamps per claimed row).
            # psycopg's own reads them in C, in the session's time zone: in the UTC
            # session Django keeps, the same values; in a session someone set to another
            # zone, still the right instants (Django's re-stamping would shift them).
            cursor.adapters.register_loader("timestamptz", _driver_timestamp_loader())
        try:
            cursor.execute(sql, params, prepare=prepare)
        except psycopg.Error as exc:
            if not prepare or not _prepared_statement_trouble(exc):
                raise
            stop_preparing(raw, exc)
            if _in_transaction(connection):
                # The transaction is spoilt: its owner runs it again (now unprepared).
                raise psycopg.OperationalError(
                    f"a prepared statement failed ({exc}); preparing is now off for this session"
                ) from exc
            cursor.execute(sql, params, prepare=False)
        return cursor.fetchall()


def _in_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the session is inside a transaction (or a failed one), as the driver
    reports it (``Dialect.driver_state``), not as Django's bookkeeping says; a driver
    that cannot tell counts as inside one (no session setting, no silent retry)."""
    from . import dialect_for

    state = dialect_for(connection).driver_state(connection.connection)
    return state is None or state.in_transaction


def _prepared_statement_trouble(exc: Any) -> bool:
    """Whether ``exc`` says the session's prepared statements are not what psycopg
    believes, or are stale: a migration changed a column the plan returns (0A000, "cached
    plan must not change result type")."""
    if exc.sqlstate in PREPARED_STATEMENT_TROUBLE:
        return True
    message = getattr(exc.diag, "message_primary", None) or ""
    return exc.sqlstate == "0A000" and "cached plan" in message


def prepares(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``fetch_all`` prepares its statements on this session: on a worker's own
    session (bounded by ``Dialect.bound_worker_statements``; never an application's),
    unless the project set ``OPTIONS["prepare_threshold"] = None``, or the session could
    not keep them. Where psycopg would prepare nothing (Django's default threshold, None),
    it is given a threshold no count reaches, so only what is asked for is prepared."""
    raw = connection.connection
    session = worker_session(raw)
    if session.planned_once:
        return True
    if session.unprepared or session.bounded_seconds is None:
        return False
    options = connection.settings_dict.get("OPTIONS") or {}
    if "prepare_threshold" in options and options["prepare_threshold"] is None:
        return False
    if _in_transaction(connection):
        return False  # the session setting below would end with this transaction
    with raw.cursor() as cursor:
        # Plan each prepared statement once: a session setting, not a transaction's.
        cursor.execute(PLAN_ONCE)
    if raw.prepare_threshold is None:
        raw.prepare_threshold = ONLY_WHEN_ASKED
    session.planned_once = True
    return True


def stop_preparing(raw: Any, exc: Exception) -> None:
    """Prepare nothing more on this session (until the worker replaces it); say why once
    per session."""
    session = worker_session(raw)
    if session.unprepared:
        return
    session.unprepared = True
    session.planned_once = False
    raw.prepare_threshold = None
    if getattr(exc, "sqlstate", None) == "0A000":  # a stale plan: _prepared_statement_trouble
        cause = "a migration changed a column it returns."
        remedy = "restart workers after such migrations to prepare again"
    else:
        cause = "is a pooler in transaction mode in between?"
        remedy = (
            'set DATABASES[...]["OPTIONS"]["prepare_threshold"] = None to never prepare, '
            "or use PgBouncer 1.21+ with max_prepared_statements"
        )
    logger.warning(
        "A prepared statement of the worker failed on its database session (%s): %s The "
        "worker stops preparing on that session; %s.",
        exc,
        cause,
        remedy,
    )


@cache
def _driver_timestamp_loader() -> Any:
    """psycopg's own ``timestamptz`` loader (Django registers a wrapper of it)."""
    import psycopg
    from psycopg.pq import Format

    oid = psycopg.adapters.types["timestamptz"].oid
    return psycopg.adapters.get_loader(oid, Format.TEXT)


@contextmanager
def bound_cursor(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """A cursor as ``connection.cursor()`` gives it, binding on the server.

    For statements on the caller's path (the enqueue INSERT): Django's wrapper stays
    around psycopg's cursor, so execute wrappers (APM) and Django's exception types see
    the statement as they see any query; only the binding differs. While Django logs
    queries (``DEBUG``, ``assertNumQueries``, debug toolbars) it is Django's own cursor.
    Nothing is prepared unless the project sets ``OPTIONS["prepare_threshold"]`` (a
    pooler in transaction mode stays safe).
    """
    import psycopg

    if connection.queries_logged:
        # DEBUG or a query capture: Django's own cursor, whose log shows the values bound
        # (a server-bound statement would be logged with $1 placeholders).
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw = psycopg.Cursor(connection.connection)
    with connection.make_cursor(cast(Any, raw)) as wrapped:  # the stubs say CursorWrapper
        yield wrapped
