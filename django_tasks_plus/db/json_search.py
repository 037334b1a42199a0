"""``JsonContains``: a JSON column holds a value, as an ORM condition on any database.

The admin's ``arg:``, ``kwarg:`` and ``meta:`` searches filter with it. Django's own
``__contains`` on a JSONField is PostgreSQL-only; this asks the connection's dialect
(``Dialect.json_contains``): jsonb ``@>`` on PostgreSQL, which the optional GIN indexes
answer (``db/search_index.py``), and a ``json_each`` walk on SQLite.
"""

from __future__ import annotations

from typing import Any

from django.db.models import BooleanField, F, Func

from . import dialect_for


class JsonContains(Func):
    """True where ``column`` holds ``value``: as an array element (``key`` None), or
    under ``key`` of the object."""

    output_field = BooleanField()

    def __init__(self, column: str, value: Any, key: str | None = None) -> None:
        super().__init__(F(column))
        self.value = value
        self.key = key

    def as_sql(  # type: ignore[override]  # one statement from the dialect, no template
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> Any:
        column_sql, column_params = compiler.compile(self.get_source_expressions()[0])
        sql, params = dialect_for(connection).json_contains(column_sql, self.key, self.value)
        return sql, (*column_params, *params)
