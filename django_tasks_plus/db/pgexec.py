"""Running the worker's hot statements on PostgreSQL with server-side parameter binding.

Django's psycopg backend binds parameters on the client by default: every execution
re-parses the SQL text for placeholders and quotes each value into it. For the claim and
the batched completions, that was about a sixth of a worker's CPU. Here the SQL text is
fixed (a batch of outcomes travels as one JSON parameter, not as one placeholder per
value), so psycopg's placeholder cache applies and values are sent separately.
If the project sets ``OPTIONS["prepare_threshold"]``, psycopg also prepares them.

The statements still run on Django's connection, inside its transaction management, and
driver errors still surface as ``django.db`` exceptions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from functools import cache
from typing import Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper


def fetch_all(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> list[Any]:
    """Execute ``sql`` with server-side binding on Django's connection; return the rows."""
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        if connection.timezone is UTC:
            # Django's timestamp loader re-stamps each value with its time zone in Python
            # (a twentieth of a worker's CPU in a drain: six timestamps per claimed row).
            # psycopg's own reads them in C, in the session's time zone: in the UTC
            # session Django keeps, the same values; in a session someone set to another
            # zone, still the right instants (Django's re-stamping would shift them).
            cursor.adapters.register_loader("timestamptz", _driver_timestamp_loader())
        cursor.execute(sql, params)
        return cursor.fetchall()


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
