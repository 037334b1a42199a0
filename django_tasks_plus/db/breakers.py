"""Circuit breaker rows, and the task rows a circuit holds or releases in one statement.

A circuit changes only under its row lock: ``locked_circuit`` inserts the row if missing
(``INSERT … ON CONFLICT DO NOTHING``) and then reads it ``FOR UPDATE``. On SQLite, where
there are no row locks, the insert takes the database's write lock first, which
serialises the same way. Every query here is vendor-neutral ORM; the one time value the
caller needs from the database is its clock (``database_now``), so that breakers on
hosts with skewed clocks agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Case, Count, F, IntegerField, Value, When
from django.db.models.functions import Coalesce

from ..compat import TaskResultStatus
from ..models import BreakerRecord, TaskRecord
from . import dialect_for
from .rowlock import unlocked

# Seconds a circuit's decision or record waits for its row, which workers lock for a
# moment each; far longer than that means a session keeps it locked.
CIRCUIT_LOCK_WAIT = 5.0

# The columns a circuit is stored in, in the order ``breaker.parse_circuit`` takes them.
CIRCUIT_COLUMNS = (
    "state",
    "failures",
    "opened_at",
    "probe_task_id",
    "probe_started_at",
    "parked_until",
)


def _bounded_lock_wait(database: str, wait: float | None) -> AbstractContextManager[None]:
    """Wait at most ``wait`` seconds (default ``CIRCUIT_LOCK_WAIT``, read at the call)
    for the circuit's row: a session that keeps it locked (a transaction left open)
    fails the decision or the record, which the callers survive (a short hold, a failure
    not counted), instead of stalling every task thread whose task uses that circuit;
    an operator's force raises ``CircuitLocked``."""
    connection = connections[database]
    seconds = CIRCUIT_LOCK_WAIT if wait is None else wait
    return dialect_for(connection).lock_wait_bounded(connection, seconds)


def database_now(database: str) -> datetime:
    """The database's clock (not this host's)."""
    connection = connections[database]
    return dialect_for(connection).current_time(connection)


def _rows(database: str, backend_name: str, name: str, key: str) -> Any:
    return BreakerRecord.objects.using(database).filter(
        backend_name=backend_name, name=name, key=key
    )


def stored_circuit(database: str, backend_name: str, name: str, key: str) -> tuple[Any, ...] | None:
    """The circuit's columns without a lock (the fast path: most circuits are closed),
    or None when the key never failed."""
    return _rows(database, backend_name, name, key).values_list(*CIRCUIT_COLUMNS).first()


def locked_circuit(
    database: str,
    backend_name: str,
    name: str,
    key: str,
    now: datetime,
    wait: float | None = None,
) -> tuple[Any, ...]:
    """The circuit's columns, its row locked until the caller's transaction ends.

    Must run inside ``transaction.atomic(using=database)``. Creates a closed row first
    when there is none, so two workers deciding about a new key queue on one row.
    """
    with _bounded_lock_wait(database, wait):
        BreakerRecord.objects.using(database).bulk_create(
            [BreakerRecord(backend_name=backend_name, name=name, key=key, updated_at=now)],
            ignore_conflicts=True,
        )
        row = (
            _rows(database, backend_name, name, key)
            .select_for_update()
            .values_list(*CIRCUIT_COLUMNS)
            .first()
        )
    if row is None:  # an operator deleted it between the two statements
        return ("closed", "[]", None, None, None, None)
    return tuple(row)


def locked_existing_circuit(
    database: str, backend_name: str, name: str, key: str, wait: float | None = None
) -> tuple[Any, ...] | None:
    """The circuit's columns, its row locked until the caller's transaction ends; None
    (and nothing created) when no circuit is stored. Must run inside ``atomic()``."""
    with _bounded_lock_wait(database, wait):
        row = (
            _rows(database, backend_name, name, key)
            .select_for_update()
            .values_list(*CIRCUIT_COLUMNS)
            .first()
        )
    return None if row is None else tuple(row)


def circuits_of_key(database: str, backend_name: str, key: str) -> list[tuple[str, str]]:
    """``(name, state)`` of every stored circuit of ``key``, under any breaker name."""
    rows = (
        BreakerRecord.objects.using(database)
        .filter(backend_name=backend_name, key=key)
        .order_by("name")
        .values_list("name", "state")
    )
    return [(str(name), str(state)) for name, state in rows]


def stored_names(database: str, backend_name: str) -> set[str]:
    """The breaker names of the backend's stored circuits."""
    return set(
        BreakerRecord.objects.using(database)
        .filter(backend_name=backend_name)
        .values_list("name", flat=True)
        .distinct()
    )


def name_in_use(database: str, backend_name: str, name: str) -> bool:
    """Whether a stored circuit or a waiting task uses the breaker name ``name``."""
    if BreakerRecord.objects.using(database).filter(backend_name=backend_name, name=name).exists():
        return True
    return (
        TaskRecord.objects.using(database)
        .filter(
            backend_name=backend_name,
            status=TaskResultStatus.READY,
            breaker_key__startswith=f"{name}/",
        )
        .exists()
    )


def save_circuit(
    database: str,
    backend_name: str,
    name: str,
    key: str,
    columns: Mapping[str, Any],
    now: datetime,
) -> bool:
    """Write the circuit's columns; False when its row is gone."""
    updated = _rows(database, backend_name, name, key).update(**columns, updated_at=now)
    return updated == 1


def park_tasks(
    database: str, backend_name: str, breaker_key: str, until: datetime, now: datetime
) -> int:
    """Hold every waiting task of the key until ``until`` in one statement; how many.

    A task already due later keeps its time; ``held_since`` keeps the first hold's time.
    A task whose row another session holds locked is left out: the breaker holds it
    when it is claimed."""
    rows = TaskRecord.objects.using(database).filter(
        backend_name=backend_name,
        breaker_key=breaker_key,
        status=TaskResultStatus.READY,
        run_after__lt=until,
    )
    return unlocked(rows).update(run_after=until, held_since=Coalesce(F("held_since"), Value(now)))


def release_tasks(database: str, backend_name: str, breaker_key: str, now: datetime) -> int:
    """Make the key's held tasks due now (its circuit closed); how many. A task whose
    row another session holds locked stays held until its hold ends."""
    rows = TaskRecord.objects.using(database).filter(
        backend_name=backend_name,
        breaker_key=breaker_key,
        status=TaskResultStatus.READY,
        held_since__isnull=False,
        run_after__gt=now,
    )
    return unlocked(rows).update(run_after=now)


def running_leases(
    database: str, backend_name: str, breaker_key: str, besides: str
) -> list[tuple[str, str]]:
    """``(id, lease token)`` of the key's RUNNING tasks other than ``besides``."""
    rows = (
        TaskRecord.objects.using(database)
        .filter(backend_name=backend_name, breaker_key=breaker_key, status=TaskResultStatus.RUNNING)
        .values_list("pk", "lease_token")
    )
    return [(str(pk), str(token)) for pk, token in rows if str(pk) != besides]


def still_running(database: str, leases: list[tuple[str, str]]) -> bool:
    """Whether any of these attempts (a task under that lease) is still RUNNING."""
    return (
        TaskRecord.objects.using(database)
        .filter(
            pk__in=[pk for pk, _token in leases],
            lease_token__in=[token for _pk, token in leases],
            status=TaskResultStatus.RUNNING,
        )
        .exists()
    )


def breaker_rows(database: str, backend_name: str) -> list[BreakerRecord]:
    """Every stored circuit of the backend, by breaker name and key."""
    return list(
        BreakerRecord.objects.using(database)
        .filter(backend_name=backend_name)
        .order_by("name", "key")
    )


def held_counts(database: str, backend_name: str, now: datetime) -> dict[str, int]:
    """Tasks a breaker holds back now, per stored breaker key (``name/key``): held, and not
    yet due (a released task keeps ``held_since`` until it runs, but is due)."""
    rows = (
        TaskRecord.objects.using(database)
        .filter(
            backend_name=backend_name,
            status=TaskResultStatus.READY,
            breaker_key__isnull=False,
            held_since__isnull=False,
            run_after__gt=now,
        )
        .values("breaker_key")
        .annotate(count=Count("id"))
    )
    return {str(row["breaker_key"]): int(row["count"]) for row in rows}


def state_counts(database: str, backend_name: str) -> list[tuple[str, str, int]]:
    """``(breaker name, stored state, circuits)`` of the backend: one grouped read of the
    breaker table (a row per key that ever failed; the task table is not read)."""
    rows = (
        BreakerRecord.objects.using(database)
        .filter(backend_name=backend_name)
        .values("name", "state")
        .annotate(count=Count("id"))
        .order_by("name", "state")
    )
    return [(str(row["name"]), str(row["state"]), int(row["count"])) for row in rows]


def leading_circuits(database: str, backend_name: str, limit: int) -> list[BreakerRecord]:
    """At most ``limit`` stored circuits, those not closed first (the most recently
    opened first), then the closed ones most recently changed: the circuits a scrape
    names one by one when there are more than it may name."""
    closed_last = Case(
        When(state="closed", then=Value(1)), default=Value(0), output_field=IntegerField()
    )
    return list(
        BreakerRecord.objects.using(database)
        .filter(backend_name=backend_name)
        .order_by(
            closed_last,
            F("opened_at").desc(nulls_last=True),
            F("updated_at").desc(),
            "name",
            "key",
        )[:limit]
    )


# One statement counts the held tasks of this many circuits (a UNION ALL of capped reads).
HELD_BATCH = 100


def held_capped(
    database: str, backend_name: str, breaker_keys: list[str], now: datetime, cap: int
) -> dict[str, tuple[int, bool]]:
    """Per circuit (``name/key``): the tasks it holds back now, and whether more may be
    held than that. Each circuit reads at most ``cap + 1`` of its key's READY rows (the
    breaker index, ``dtp_task_breaker_idx``), whatever the rest of the table holds: an
    open circuit's waiting tasks are all held, so its count is exact up to the cap; a
    closed one with a backlog of more than ``cap`` due tasks counts the held ones among
    the first ``cap + 1`` only (a closed circuit released its tasks as it closed).
    One statement per ``HELD_BATCH`` circuits, on PostgreSQL and SQLite alike."""
    connection = connections[database]
    quote = connection.ops.quote_name
    table, ready = quote(TaskRecord._meta.db_table), str(TaskResultStatus.READY)
    at = connection.ops.adapt_datetimefield_value(now)
    one = (
        f"SELECT %s, COUNT(*), COALESCE(SUM(CASE WHEN held_since IS NOT NULL AND "
        f"run_after > %s THEN 1 ELSE 0 END), 0) FROM (SELECT held_since, run_after "
        f"FROM {table} WHERE backend_name = %s AND breaker_key = %s AND status = %s "
        f"LIMIT %s) AS found"
    )
    counted: dict[str, tuple[int, bool]] = {}
    for start in range(0, len(breaker_keys), HELD_BATCH):
        batch = breaker_keys[start : start + HELD_BATCH]
        params: list[Any] = []
        for key in batch:
            params += [key, at, backend_name, key, ready, cap + 1]
        with connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join([one] * len(batch)), params)
            for key, read, held in cursor.fetchall():
                counted[str(key)] = (min(int(held), cap), int(read) > cap)
    return counted
