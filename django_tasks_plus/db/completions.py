"""Writing many attempt outcomes in one transaction (group commit), still fenced.

A worker finishing hundreds of tasks a second would otherwise pay one commit per task.
Outcomes are grouped by the columns they set; on PostgreSQL each group is one
``UPDATE … FROM unnest(…)`` statement with one array parameter per column, elsewhere one
statement per row, and the whole batch commits once. Each row still lands only where its
lease token matches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..codec import dumps
from ..lifecycle import ClaimedTask, Transition
from .base import RUNNING, column, table
from .pgexec import fetch_all
from .store import apply_transition

Completion = tuple[ClaimedTask, Transition]

# PostgreSQL types for the VALUES list, so NULLs and literals take the column's type.
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


def apply_transitions(database: str, completions: Sequence[Completion]) -> list[bool]:
    """Write every completion in one transaction; return, in order, which landed."""
    if not completions:
        return []
    connection = connections[database]
    with transaction.atomic(using=database):
        if connection.vendor == "postgresql":
            landed_ids = _postgresql(connection, completions)
            return [(claimed.id in landed_ids) for claimed, _ in completions]
        return [apply_transition(database, claimed, outcome) for claimed, outcome in completions]


def _postgresql(connection: BaseDatabaseWrapper, completions: Sequence[Completion]) -> set[str]:
    groups: dict[tuple[str, ...], list[Completion]] = {}
    for claimed, outcome in completions:
        groups.setdefault(tuple(sorted(outcome.values)), []).append((claimed, outcome))
    landed: set[str] = set()
    for names, members in groups.items():
        sql = _update_from_arrays_sql(connection.ops.quote_name, names)
        rows = fetch_all(connection, sql, _column_arrays(names, members))
        landed.update(str(row[0]) for row in rows)
    return landed


def _column_arrays(names: tuple[str, ...], members: Sequence[Completion]) -> list[list[Any]]:
    """One array per column (id, lease token, status, then ``names``), a row per member."""
    arrays: list[list[Any]] = [
        [claimed.id for claimed, _ in members],
        [claimed.lease_token for claimed, _ in members],
        [outcome.status for _, outcome in members],
    ]
    for name in names:
        values = [outcome.values[name] for _, outcome in members]
        if _pg_type(name) == "jsonb":
            # SQL NULL for None (not JSON null), as the ORM stores a null JSON column.
            values = [None if value is None else dumps(value) for value in values]
        arrays.append(values)
    return arrays


@lru_cache(maxsize=64)
def _update_from_arrays_sql(quote: Callable[[str], str], names: tuple[str, ...]) -> str:
    """``UPDATE … FROM unnest(arrays)``: fenced by lease token; the text depends only on
    which columns the outcomes set, so it is built once and psycopg caches its parsing."""
    t = quote(table())
    columns = ["id", "lease_token", "status", *names]
    arrays = ", ".join(f"%s::{_pg_type(name)}[]" for name in columns)
    aliases = ", ".join(quote(name) for name in columns)
    assignments = ", ".join(
        [
            f"{quote(column('status'))} = v.{quote('status')}",
            f"{quote(column('lease_token'))} = NULL",
            f"{quote(column('lease_expires_at'))} = NULL",
            *(f"{quote(column(name))} = v.{quote(name)}" for name in names),
        ]
    )
    return (
        f"UPDATE {t} SET {assignments} "
        f"FROM unnest({arrays}) AS v({aliases}) "
        f"WHERE {t}.{quote(column('id'))} = v.{quote('id')} "
        f"AND {t}.{quote(column('lease_token'))} = v.{quote('lease_token')} "
        f"AND {t}.{quote(column('status'))} = '{RUNNING}' "
        f"RETURNING {t}.{quote(column('id'))}"
    )


def _pg_type(name: str) -> str:
    from ..models import TaskRecord

    return _PG_TYPES[TaskRecord._meta.get_field(name).get_internal_type()]
