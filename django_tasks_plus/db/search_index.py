"""The optional GIN indexes that make the admin's JSON search index-driven on PostgreSQL.

``arg:``, ``kwarg:`` and ``meta:`` search terms (admin/search_terms.py) are ``@>``
containment on the jsonb columns; a ``jsonb_path_ops`` GIN index per column answers them
without reading the table. They are not in the model's migrations: every enqueue would
write three more index entries whether or not anyone searches (docs/performance.md has
the measured cost), so ``manage.py searchindex create`` adds them, ``CONCURRENTLY``, when
an operator wants fast search, and ``searchindex drop`` removes them. Search works without
them, by reading the rows the other filters leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..models import TaskRecord
from . import dialect_for


@dataclass(frozen=True)
class SearchIndex:
    """One GIN index over one jsonb column of the task table."""

    name: str
    column: str

    def create_sql(self, table: str) -> str:
        return (
            f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{self.name}" '
            f'ON "{table}" USING gin ("{self.column}" jsonb_path_ops)'
        )

    def drop_sql(self) -> str:
        return f'DROP INDEX CONCURRENTLY IF EXISTS "{self.name}"'


SEARCH_INDEXES = (
    SearchIndex("dtp_task_args_gin", "args"),
    SearchIndex("dtp_task_kwargs_gin", "kwargs"),
    SearchIndex("dtp_task_metadata_gin", "metadata"),
)


class SearchIndexUnsupported(RuntimeError):
    """The database has no GIN indexes (only PostgreSQL does): SQLite searches without."""


def _check(connection: Any) -> None:
    if not dialect_for(connection).has_search_indexes:
        raise SearchIndexUnsupported(
            "The search indexes are GIN indexes, which only PostgreSQL has; on this "
            "database the search reads the rows the other filters leave instead."
        )
    if connection.in_atomic_block:
        raise RuntimeError("CREATE/DROP INDEX CONCURRENTLY cannot run inside a transaction.")


def present(connection: Any) -> dict[str, bool]:
    """Each search index's name, and whether it exists and is valid (a build that was
    interrupted leaves an invalid index, which ``create`` then rebuilds)."""
    if not dialect_for(connection).has_search_indexes:
        return {index.name: False for index in SEARCH_INDEXES}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.indisvalid FROM pg_class c "
            "JOIN pg_index i ON i.indexrelid = c.oid "
            "WHERE c.relname = ANY(%s) AND pg_table_is_visible(c.oid)",
            [[index.name for index in SEARCH_INDEXES]],
        )
        found = dict(cursor.fetchall())
    return {index.name: bool(found.get(index.name)) for index in SEARCH_INDEXES}


def create(connection: Any) -> list[str]:
    """Build the missing (or invalid) indexes concurrently; the names built."""
    _check(connection)
    table = TaskRecord._meta.db_table
    built = []
    for index in SEARCH_INDEXES:
        state = present(connection)[index.name]
        if state:
            continue
        with connection.cursor() as cursor:
            cursor.execute(index.drop_sql())  # an invalid leftover of an interrupted build
            cursor.execute(index.create_sql(table))
        built.append(index.name)
    return built


def drop(connection: Any) -> list[str]:
    """Drop the indexes concurrently; the names that existed."""
    _check(connection)
    had = present(connection)
    with connection.cursor() as cursor:
        for index in SEARCH_INDEXES:
            cursor.execute(index.drop_sql())
    return [name for name, exists in had.items() if exists]
