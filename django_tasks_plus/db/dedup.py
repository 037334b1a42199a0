"""Deduplication keys: at most one enqueue per key while the key is held.

Taken inside the enqueuing transaction: ``INSERT … ON CONFLICT DO NOTHING`` lets the
unique constraint settle races (a concurrent taker waits for the holder's transaction and
then sees its row, or, after a rollback, takes the key itself). A held key whose window
has passed is re-taken under a row lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper

from ..compat import TaskResultStatus
from ..envelope import JsonText
from ..models import DedupKey, TaskRecord

PENDING = (TaskResultStatus.READY, TaskResultStatus.RUNNING)


def take_key(
    connection: BaseDatabaseWrapper,
    *,
    backend_name: str,
    key: str,
    task_ids: Sequence[str],
    now: datetime,
    expires_at: datetime,
    until_finished: bool,
) -> list[str] | None:
    """Take ``key`` for ``task_ids``; return None if taken, else the holder's task ids.

    Must run inside a transaction on ``connection`` (the caller's enqueue transaction).
    """
    quote = connection.ops.quote_name
    meta = DedupKey._meta
    names = ["backend_name", "key", "task_ids", "expires_at", "until_finished", "created_at"]
    values = [backend_name, key, JsonText(_json_ids(task_ids)), expires_at, until_finished, now]
    columns = ", ".join(quote(meta.get_field(name).column) for name in names)
    marks, params = [], []
    for name, value in zip(names, values, strict=True):
        if isinstance(value, JsonText):
            marks.append("%s::jsonb" if connection.vendor == "postgresql" else "%s")
            params.append(str(value))
        else:
            marks.append("%s")
            params.append(meta.get_field(name).get_db_prep_save(value, connection))
    conflict = ", ".join(quote(meta.get_field(name).column) for name in ("backend_name", "key"))
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({', '.join(marks)}) "
        f"ON CONFLICT ({conflict}) DO NOTHING RETURNING {quote(meta.pk.column)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.fetchone() is not None:
            return None

    held = (
        DedupKey.objects.using(connection.alias)
        .select_for_update()
        .get(backend_name=backend_name, key=key)
    )
    if _still_held(held, connection.alias, now):
        return [str(task_id) for task_id in held.task_ids]
    held.task_ids = list(task_ids)
    held.expires_at = expires_at
    held.until_finished = until_finished
    held.created_at = now
    held.save(using=connection.alias)
    return None


def _still_held(held: DedupKey, database: str, now: datetime) -> bool:
    holders = TaskRecord.objects.using(database).filter(pk__in=held.task_ids)
    if held.until_finished:
        return holders.filter(status__in=PENDING).exists()
    # A key whose tasks were deleted (pruned) admits nobody's result: take it over.
    return held.expires_at > now and holders.exists()


def _json_ids(task_ids: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{task_id}"' for task_id in task_ids) + "]"
