"""The database boundary: every hand-written SQL statement, one module per dialect.

``dialect_for(connection)`` returns the ``Dialect`` (``db/base.py``) of that connection's
vendor: the only place that looks at ``connection.vendor``. The statements every dialect
shares are written once in ``db/sql.py`` with slots for dialect fragments; each dialect
module writes its own. ``store`` (task rows by alias), ``completions`` (batched
outcomes) and ``dedup`` (dedup keys) call the dialect; their ORM queries are
vendor-neutral.

Adding a database is one module with a ``Dialect`` subclass, one line in ``DIALECTS``,
and its tests (see docs/development.md, "Adding a database").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.module_loading import import_string

from ..exceptions import UnsupportedDatabase
from .unpooled import is_pooled

if TYPE_CHECKING:  # the dialects import the models: load them only when used
    from .base import Dialect

# Django's vendor name -> the dialect class, imported on first use.
DIALECTS = {
    "postgresql": "django_tasks_plus.db.postgresql.PostgreSQLDialect",
    "sqlite": "django_tasks_plus.db.sqlite.SQLiteDialect",
}
SUPPORTED_VENDORS = tuple(DIALECTS)

_instances: dict[str, Dialect] = {}


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    """The dialect for ``connection``; raise ``UnsupportedDatabase`` for other vendors.

    Dialects hold no state, so there is one instance per vendor."""
    vendor = connection.vendor
    dialect = _instances.get(vendor)
    if dialect is None:
        if vendor not in DIALECTS:
            raise UnsupportedDatabase(
                f"django-tasks-plus does not support the {vendor!r} database yet; "
                f"use one of: {', '.join(SUPPORTED_VENDORS)}."
            )
        dialect = _instances[vendor] = import_string(DIALECTS[vendor])()
    return dialect


def worker_connection(database: str, bound_seconds: float) -> BaseDatabaseWrapper:
    """This thread's connection to ``database``, open, with the worker's own statements
    bounded to ``bound_seconds`` (``Dialect.bound_worker_statements``): what the worker's
    bookkeeping threads (claim, heartbeat, outcomes, pruning) use, never task code.

    The bounds are session settings, so the session must be one no other thread will
    get: a thread whose alias has a connection pool must run ``outside_the_pool()``
    (``db/unpooled.py``); otherwise this raises rather than leak them into the pool."""
    connection = connections[database]
    if is_pooled(connection):
        raise RuntimeError(
            f"The worker's own statements on database {database!r} must not run on a "
            "pooled connection (its bounds would reach task code): run this thread "
            "inside django_tasks_plus.db.unpooled.outside_the_pool()."
        )
    connection.ensure_connection()
    dialect_for(connection).bound_worker_statements(connection, bound_seconds)
    return connection


__all__ = [
    "DIALECTS",
    "SUPPORTED_VENDORS",
    "UnsupportedDatabase",
    "dialect_for",
    "worker_connection",
]
