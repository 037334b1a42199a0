"""Writing many attempt outcomes in one transaction (group commit), still fenced.

A worker finishing hundreds of tasks a second would otherwise pay one commit per task.
Outcomes are grouped by the columns they set; on PostgreSQL each group is one
``UPDATE … FROM (VALUES …)`` statement, elsewhere one statement per row, and the whole
batch commits once. Each row still lands only where its lease token matches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..lifecycle import ClaimedTask, Transition
from .base import RUNNING, column, prep, table
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
    with connection.cursor() as cursor:
        for names, members in groups.items():
            sql, params = _update_from_values(connection, names, members)
            cursor.execute(sql, params)
            landed.update(str(row[0]) for row in cursor.fetchall())
    return landed


def _update_from_values(
    connection: BaseDatabaseWrapper, names: tuple[str, ...], members: Sequence[Completion]
) -> tuple[str, list[Any]]:
    from ..models import TaskRecord

    quote = connection.ops.quote_name
    t = quote(table())
    fields = TaskRecord._meta

    def cast(name: str) -> str:
        return _PG_TYPES[fields.get_field(name).get_internal_type()]

    columns = ["id", "lease_token", "status", *names]
    casts = [cast(name) for name in columns]
    row_sql = "(" + ", ".join(f"%s::{kind}" for kind in casts) + ")"
    params: list[Any] = []
    for claimed, outcome in members:
        params.extend([claimed.id, claimed.lease_token, outcome.status])
        for name in names:
            value = outcome.values[name]
            if cast(name) == "jsonb":
                params.append(None if value is None else json.dumps(value, ensure_ascii=False))
            else:
                params.append(prep(name, value, connection))
    assignments = ", ".join(
        [
            f"{quote(column('status'))} = v.{quote('status')}",
            f"{quote(column('lease_token'))} = NULL",
            f"{quote(column('lease_expires_at'))} = NULL",
            *(f"{quote(column(name))} = v.{quote(name)}" for name in names),
        ]
    )
    aliases = ", ".join(quote(name) for name in columns)
    sql = (
        f"UPDATE {t} SET {assignments} "
        f"FROM (VALUES {', '.join([row_sql] * len(members))}) AS v({aliases}) "
        f"WHERE {t}.{quote(column('id'))} = v.{quote('id')} "
        f"AND {t}.{quote(column('lease_token'))} = v.{quote('lease_token')} "
        f"AND {t}.{quote(column('status'))} = '{RUNNING}' "
        f"RETURNING {t}.{quote(column('id'))}"
    )
    return sql, params
