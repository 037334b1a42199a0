"""Every hand-written SQL statement, one module per database dialect.

``dialect_for(connection)`` returns the object that knows the claim and insert SQL of
that connection's vendor. The shared, ORM-expressible writes (fenced completion, lease
renewal, reaping) live in ``store`` and work the same on every database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.backends.base.base import BaseDatabaseWrapper

from ..exceptions import UnsupportedDatabase

if TYPE_CHECKING:  # the dialects import the models: load them only when used
    from .base import Dialect

SUPPORTED_VENDORS = ("postgresql", "sqlite")


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    """The dialect for ``connection``; raise ``UnsupportedDatabase`` for other vendors."""
    vendor = connection.vendor
    if vendor == "postgresql":
        from .postgresql import PostgreSQLDialect

        return PostgreSQLDialect()
    if vendor == "sqlite":
        from .sqlite import SQLiteDialect

        return SQLiteDialect()
    raise UnsupportedDatabase(
        f"django-tasks-plus does not support the {vendor!r} database yet; "
        f"use one of: {', '.join(SUPPORTED_VENDORS)}."
    )


__all__ = ["SUPPORTED_VENDORS", "UnsupportedDatabase", "dialect_for"]
