"""What a dialect provides, and the column plumbing every dialect shares."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.dateparse import parse_datetime

from ..codec import loads
from ..lifecycle import ClaimedTask
from ..models import TaskRecord

NOTIFY_CHANNEL = "django_tasks_plus"

# Columns a claim returns, in this order.
CLAIM_COLUMNS = (
    "id",
    "task_path",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "attempt",
    "worker_ids",
    "errors",
    "enqueued_at",
    "run_after",
    "started_at",
    "lease_token",
    "backend_name",
)


def table() -> str:
    return TaskRecord._meta.db_table


def column(name: str) -> str:
    return TaskRecord._meta.get_field(name).column


def prep(name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """``value`` as the database driver wants it for column ``name`` (Django's own rules)."""
    return TaskRecord._meta.get_field(name).get_db_prep_save(value, connection)


def insert_sql_and_params(
    values: Mapping[str, Any], connection: BaseDatabaseWrapper
) -> tuple[str, list[Any]]:
    """A plain one-row INSERT of ``values`` (field name -> Python value)."""
    quote = connection.ops.quote_name
    names = list(values)
    columns = ", ".join(quote(column(name)) for name in names)
    placeholders = ", ".join(["%s"] * len(names))
    params = [prep(name, values[name], connection) for name in names]
    return f"INSERT INTO {quote(table())} ({columns}) VALUES ({placeholders})", params


def _as_datetime(value: Any) -> datetime | None:
    parsed = value if value is None or isinstance(value, datetime) else parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _as_json(value: Any) -> Any:
    return loads(value) if isinstance(value, str | bytes) else value


def claimed_from_row(row: Sequence[Any]) -> ClaimedTask:
    """Build a ``ClaimedTask`` from a RETURNING row in ``CLAIM_COLUMNS`` order.

    JSON columns arrive as text (Django loads jsonb as text, SQLite stores text) and
    datetimes as text on SQLite; both are decoded here, once.
    """
    data = dict(zip(CLAIM_COLUMNS, row, strict=True))
    raw_id = data["id"]
    return ClaimedTask(
        id=str(raw_id if isinstance(raw_id, uuid.UUID) else uuid.UUID(str(raw_id))),
        task_path=data["task_path"],
        queue_name=data["queue_name"],
        priority=int(data["priority"]),
        args=_as_json(data["args"]),
        kwargs=_as_json(data["kwargs"]),
        attempt=int(data["attempt"]),
        worker_ids=tuple(_as_json(data["worker_ids"]) or ()),
        errors=tuple(_as_json(data["errors"]) or ()),
        enqueued_at=_as_datetime(data["enqueued_at"]),  # type: ignore[arg-type]
        run_after=_as_datetime(data["run_after"]),  # type: ignore[arg-type]
        started_at=_as_datetime(data["started_at"]),
        lease_token=data["lease_token"],
        backend_name=data["backend_name"],
    )


class Dialect(ABC):
    """The SQL that differs between databases: inserting with a wake-up, and claiming."""

    vendor: str
    supports_notify: bool = False

    def check(self, connection: BaseDatabaseWrapper) -> list[str]:
        """Problems that stop this database from running the queue (empty if none)."""
        return []

    @abstractmethod
    def insert_task(
        self,
        connection: BaseDatabaseWrapper,
        values: Mapping[str, Any],
        queue_name: str,
        *,
        notify: bool = True,
    ) -> None:
        """Insert one task row on ``connection`` (inside the caller's transaction)."""

    @abstractmethod
    def claim(
        self,
        connection: BaseDatabaseWrapper,
        *,
        backend_name: str,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        lease_token: str,
        now: datetime,
        lease_expires_at: datetime,
    ) -> list[ClaimedTask]:
        """Atomically move up to ``limit`` READY, due tasks to RUNNING under a lease."""
