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

from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


def fetch_all(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> list[Any]:
    """Execute ``sql`` with server-side binding on Django's connection; return the rows."""
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
