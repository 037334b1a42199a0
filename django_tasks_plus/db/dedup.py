"""Deduplication keys: at most one enqueue per key while the key is held.

Taken inside the enqueuing transaction by the dialect's insert-unless-held
(``Dialect.insert_dedup_key``: ``INSERT … ON CONFLICT DO NOTHING``), so the unique
constraint settles races (a concurrent taker waits, a bounded time, for the holder's
transaction and then sees its row, or, after a rollback, takes the key itself). A held
key whose window has passed is re-taken under a row lock. ``prune_keys`` deletes keys
that no longer hold, safely while others enqueue.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, QuerySet

from ..compat import TaskResultStatus
from ..exceptions import DedupKeyLocked
from ..models import DedupKey, TaskRecord
from . import dialect_for
from .rowlock import lock_refused_as

DEDUP_LOCK_WAIT = 5.0
"""Seconds an enqueue waits for another transaction taking the same key to end. That
wait is how a race is settled (the other may commit, or roll back and leave the key
free); a transaction kept open longer (a slow view under ``ATOMIC_REQUESTS``, a
``psql`` session) must not hang every enqueue of the key, so past it the enqueue raises
``DedupKeyLocked``. A shorter lock timeout of the session (the scheduler's) is kept."""

PENDING = (TaskResultStatus.READY, TaskResultStatus.RUNNING)

# How often ``take_key`` starts over when the key row vanished under it. Only a cleanup
# deleting a key that had lapsed does that, and the next INSERT then takes the key (or
# finds the row of whoever did), so a second round is already rare.
_TAKE_ROUNDS = 5

# Keys per DELETE when pruning: two parameters each, under SQLite's old limit of 999.
_PRUNE_CHUNK = 400


class _KeyVanished(RuntimeError):
    """Internal: the key row was deleted between the INSERT and the read of the holder."""


@dataclass(frozen=True)
class KeyTake:
    """One enqueue's claim on a key: for ``task_ids``, from ``now`` to ``expires_at``
    (or until those tasks have finished)."""

    backend_name: str
    key: str
    task_ids: Sequence[str]
    now: datetime
    expires_at: datetime
    until_finished: bool


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

    Why a short loop and not one ``INSERT … ON CONFLICT DO UPDATE … WHERE <lapsed>``
    statement: whether a key still holds depends on *other* rows (its tasks' status, or
    whether they still exist). On PostgreSQL one statement judges those rows by the
    snapshot it started with, so a taker that waited for a concurrent holder's commit
    would not see that holder's new task rows, judge the key lapsed, and take it too:
    two tasks for one key. Reading the holder in a statement of its own (and, to take it
    over, again after the row is locked) sees them. The price is a gap between the
    INSERT and that read, in which a cleanup may delete a lapsed key row; the loop then
    simply starts over, and the unique constraint keeps the outcome race-free.

    Each wait for another transaction on the key lasts at most ``DEDUP_LOCK_WAIT``, then
    ``DedupKeyLocked`` is raised; the caller's transaction (or savepoint) must then roll
    back, as the enqueue's own ``atomic()`` does.
    """
    take = KeyTake(backend_name, key, task_ids, now, expires_at, until_finished)
    dialect = dialect_for(connection)
    # The enqueue's own transaction (not one of the caller's, nor a savepoint in one)
    # commits right after its INSERT: the key's INSERT sets the bound, to last until
    # then, in its own round trip. A caller's transaction gets it back as it was.
    owned = len(connection.atomic_blocks) == 1 and connection.commit_on_exit
    bounded = nullcontext() if owned else dialect.lock_wait_bounded(connection, DEDUP_LOCK_WAIT)
    refused = lock_refused_as(
        connection.alias,
        lambda waited: DedupKeyLocked(
            f"Dedup key {key!r} of backend {backend_name!r}: another transaction is taking "
            f"it and has not ended (an enqueue or a take-over of that key, inside a "
            f"transaction still open); waited {waited:.1f} s and enqueued nothing. Try "
            "again once that transaction ends.",
            key=key,
            waited=waited,
        ),
    )
    with refused, bounded:
        return _take(connection, take, lock_wait=DEDUP_LOCK_WAIT if owned else None)


def _take(
    connection: BaseDatabaseWrapper, take: KeyTake, *, lock_wait: float | None
) -> list[str] | None:
    """``take_key``'s rounds; ``lock_wait``: the INSERT's own bound, if it sets one."""
    for _ in range(_TAKE_ROUNDS):
        if _insert_key(connection, take, lock_wait):
            return None
        try:
            return _take_over_if_lapsed(connection.alias, take)
        except _KeyVanished:
            continue
    raise RuntimeError(
        f"Could not take dedup key {take.key!r}: its row was deleted {_TAKE_ROUNDS} times "
        "while this enqueue tried to read it. Is a cleanup deleting keys that still hold? "
        "Use django_tasks_plus.prune_dedup_keys(), which deletes only lapsed keys."
    )


def _insert_key(connection: BaseDatabaseWrapper, take: KeyTake, lock_wait: float | None) -> bool:
    """Insert the key row unless one exists; True if this call inserted it."""

    def prep(name: str, value: Any) -> Any:
        field = cast(Field, DedupKey._meta.get_field(name))
        return field.get_db_prep_save(value, connection)

    params = [
        prep("backend_name", take.backend_name),
        prep("key", take.key),
        _json_ids(take.task_ids),
        prep("expires_at", take.expires_at),
        prep("until_finished", take.until_finished),
        prep("created_at", take.now),
    ]
    return dialect_for(connection).insert_dedup_key(connection, params, lock_wait=lock_wait)


def _take_over_if_lapsed(database: str, take: KeyTake) -> list[str] | None:
    """Return the holders of the existing key row if it still holds; else lock it,
    judge again, and rewrite it for the take if it lapsed (None).

    A key that holds is read without a lock: a duplicate enqueue then never waits for
    another duplicate's transaction, which would keep the row locked until it ends.
    Only a take-over locks the row."""
    rows = DedupKey.objects.using(database).filter(backend_name=take.backend_name, key=take.key)
    seen = rows.first()
    if seen is None:
        raise _KeyVanished(take.key)
    if _still_held(seen, database, take.now):
        return [str(task_id) for task_id in seen.task_ids]
    held = rows.select_for_update().first()
    if held is None:
        raise _KeyVanished(take.key)
    if _still_held(held, database, take.now):  # taken over, or its holder committed, meanwhile
        return [str(task_id) for task_id in held.task_ids]
    held.task_ids = list(take.task_ids)
    held.expires_at = take.expires_at
    held.until_finished = take.until_finished
    held.created_at = take.now
    held.save(using=database)
    return None


def _still_held(held: DedupKey, database: str, now: datetime) -> bool:
    holders = TaskRecord.objects.using(database).filter(pk__in=held.task_ids)
    if held.until_finished:
        return holders.filter(status__in=PENDING).exists()
    # A key whose tasks were deleted (pruned) admits nobody's result: take it over.
    return held.expires_at > now and holders.exists()


def _json_ids(task_ids: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{task_id}"' for task_id in task_ids) + "]"


def prune_keys(database: str, backend_name: str, now: datetime) -> int:
    """Delete the keys of ``backend_name`` that have lapsed; return how many.

    Lapsed: a ``"ttl"`` key whose window has passed, or a ``"finished"`` key none of whose
    tasks is still READY or RUNNING. Safe while others enqueue: each key is deleted only
    if its row is still the version judged lapsed (same ``created_at``), so a key that a
    concurrent enqueue took over in the meantime is kept. (A re-check of the lapse rule in
    the DELETE itself would not do on PostgreSQL: it would judge the new holder's tasks by
    the DELETE's older snapshot, in which they do not exist yet.)
    """
    keys = DedupKey.objects.using(database).filter(backend_name=backend_name)
    deleted = 0
    expired = keys.filter(until_finished=False, expires_at__lte=now)
    for page in _pages(expired, "created_at"):
        deleted += _delete_unchanged(database, page)
    for page in _pages(keys.filter(until_finished=True), "created_at", "task_ids"):
        deleted += _delete_unchanged(database, _without_pending(database, page))
    return deleted


def _pages(keys: QuerySet[DedupKey], *fields: str) -> Iterator[list[tuple[Any, ...]]]:
    """``(pk, *fields)`` rows of ``keys`` in pages of ``_PRUNE_CHUNK``, by primary key."""
    last = None
    while True:
        page = keys if last is None else keys.filter(pk__gt=last)
        rows = list(page.order_by("pk").values_list("pk", *fields)[:_PRUNE_CHUNK])
        if not rows:
            return
        yield rows
        last = rows[-1][0]


def _without_pending(database: str, page: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The ``(pk, created_at)`` of the keys in ``page`` none of whose tasks is pending."""
    ids = {task_id for _, _, task_ids in page for task_id in _id_list(task_ids)}
    pending = set(
        TaskRecord.objects.using(database)
        .filter(pk__in=ids, status__in=PENDING)
        .values_list("pk", flat=True)
    )
    return [
        (pk, created_at)
        for pk, created_at, task_ids in page
        if pending.isdisjoint(_id_list(task_ids))
    ]


def _id_list(task_ids: Any) -> list[uuid.UUID]:
    """A key's ``task_ids`` as UUIDs; anything else (a hand edit) counts as no task."""
    found = []
    for task_id in task_ids if isinstance(task_ids, list) else ():
        try:
            found.append(uuid.UUID(str(task_id)))
        except ValueError:
            continue
    return found


def _delete_unchanged(database: str, keys: Sequence[tuple[Any, ...]]) -> int:
    """Delete each ``(pk, created_at)`` key whose row still has that ``created_at``.

    Hand-written so the guard is in the DELETE's own statement: the ORM's ``delete()``
    may first select the rows, then delete them by primary key alone. Where the database
    has row locks, the guard picks the rows in a sub-select that locks them (``FOR
    UPDATE`` checks it again on a row changed since the snapshot) and passes over the
    ones another session holds (an enqueue taking the key over, in a transaction still
    open), rather than waiting: the pruner shares its session with the worker's lease
    renewal. A row it locked cannot change before the DELETE, so that joins by id (an
    ``IN`` over the guard was a nested loop: four times slower for 20,000 keys).
    """
    if not keys:
        return 0
    connection = connections[database]
    quote = connection.ops.quote_name
    meta = DedupKey._meta
    created = meta.get_field("created_at")
    # Concrete fields always have a column (django-stubs allow None).
    pk_column, created_column = cast(str, meta.pk.column), cast(str, created.column)
    match = f"({quote(pk_column)} = %s AND {quote(created_column)} = %s)"
    params: list[Any] = []
    for pk, created_at in keys:
        params += [pk, created.get_db_prep_value(created_at, connection)]
    table, where = quote(meta.db_table), " OR ".join([match] * len(keys))
    skip_locked = dialect_for(connection).skip_locked_rows_sql
    statement = f"DELETE FROM {table} WHERE {where}"
    if skip_locked:  # the rows the guard picked and this statement could lock, once
        column = quote(pk_column)
        statement = (
            f"WITH free AS (SELECT {column} FROM {table} WHERE {where}{skip_locked}) "
            f"DELETE FROM {table} USING free WHERE {table}.{column} = free.{column}"
        )
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount
