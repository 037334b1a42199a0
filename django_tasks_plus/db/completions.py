"""Writing many attempt outcomes in one transaction (group commit), still fenced.

A worker finishing hundreds of tasks a second would otherwise pay one commit per task.
Outcomes are grouped by the columns they set; on PostgreSQL each group is one
``UPDATE … FROM jsonb_to_recordset(…)`` statement with the whole group as one JSON
parameter, elsewhere one statement per row, and the whole batch commits once. Each row
still lands only where its lease token matches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..lifecycle import ClaimedTask, Transition
from .base import RUNNING, column, table
from .pgexec import fetch_all
from .store import apply_transition

Completion = tuple[ClaimedTask, Transition]

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
        sql = _update_from_records_sql(connection.ops.quote_name, names)
        rows = fetch_all(connection, sql, [_records_json(names, members)])
        landed.update(str(row[0]) for row in rows)
    return landed


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column value")


# Outcome values are JSON-ready but for datetimes; NaN never reaches here (the codec
# refuses it), so allow_nan=False only guards the SQL from an invalid literal.
_RECORDS = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_iso
)


def _records_json(names: tuple[str, ...], members: Sequence[Completion]) -> str:
    """The batch as one JSON array of objects: id, lease token, status and ``names``.

    One text parameter, encoded by the C JSON encoder, costs far less on the client than
    a parameter (or an array element) per value; ``jsonb_to_recordset`` unpacks it.
    A JSON ``null`` arrives as SQL NULL, as the ORM stores a null JSON column.
    """
    records = []
    for claimed, outcome in members:
        record = {"id": claimed.id, "lease_token": claimed.lease_token, "status": outcome.status}
        values = outcome.values
        for name in names:
            record[name] = values[name]
        records.append(record)
    return _RECORDS.encode(records)


@lru_cache(maxsize=64)
def _update_from_records_sql(quote: Callable[[str], str], names: tuple[str, ...]) -> str:
    """``UPDATE … FROM jsonb_to_recordset(%s)``, fenced by lease token. The text depends
    only on which columns the outcomes set, so it is built once per set of columns."""
    t = quote(table())
    columns = ["id", "lease_token", "status", *names]
    record_type = ", ".join(f"{quote(name)} {_pg_type(name)}" for name in columns)
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
        f"FROM jsonb_to_recordset(%s::jsonb) AS v({record_type}) "
        f"WHERE {t}.{quote(column('id'))} = v.{quote('id')} "
        f"AND {t}.{quote(column('lease_token'))} = v.{quote('lease_token')} "
        f"AND {t}.{quote(column('status'))} = '{RUNNING}' "
        f"RETURNING {t}.{quote(column('id'))}"
    )


def _pg_type(name: str) -> str:
    from ..models import TaskRecord

    return _PG_TYPES[TaskRecord._meta.get_field(name).get_internal_type()]
