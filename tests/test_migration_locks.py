"""The lock each index migration of the task table takes on PostgreSQL, read from the
server while the migration runs.

Every later migration that adds or drops an index of the task table does it
``CONCURRENTLY`` (``db/migration_operations.py``), so a deployment migrates while it
enqueues and claims. What holds that promise is the lock mode: ``SHARE UPDATE EXCLUSIVE``
lets every ``INSERT``, ``UPDATE`` and ``DELETE`` through, where a plain ``CREATE INDEX``
takes ``SHARE`` (every write waits for the whole build) and a plain ``DROP INDEX``
``ACCESS EXCLUSIVE`` (every read waits too).

Each operation of each such migration is run backwards and then forwards on a session of
its own while another transaction that wrote to the table stays open: a concurrent
build or drop waits for it, and while it waits the test reads ``pg_locks`` for what that
session holds on the table, and writes to the table from a third session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from django_tasks_plus.models import TaskRecord
from tests.conftest import postgres_only
from tests.test_locked_rows import _other_session

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

APP = "django_tasks_plus"
TABLE = TaskRecord._meta.db_table
CONCURRENT_INDEX_MIGRATIONS = (
    "0014_claim_index",
    "0015_task_finished_index",
    "0017_task_waiting_indexes",
    "0020_task_dead_index",
    "0021_one_running_key",
)
# The only mode on the table a migration of its indexes may take.
LETS_WRITES_THROUGH = "ShareUpdateExclusiveLock"
# Seconds the third session's INSERT may wait for a lock before it counts as held up.
WRITE_PATIENCE = 2


def _row(queue: str) -> str:
    now = timezone.now()
    record = TaskRecord.objects.create(
        task_path="tests.tasks.add", queue_name=queue, run_after=now, enqueued_at=now
    )
    return str(record.pk)


def _while_a_writer_waits(change: Callable[[], None]) -> tuple[set[str], float | None]:
    """Run ``change`` (a schema change, on its own thread and database session) while
    another transaction that updated a task row stays open; return the lock modes that
    session holds or waits for on the task table once it waits, and how long an
    ``INSERT`` from a third session took meanwhile (None: it met ``lock_timeout``)."""
    import psycopg

    held_row, template = _row("held"), _row("template")
    blocker, writer = _other_session(), _other_session()
    migrating_pid: list[int] = []
    failure: list[BaseException] = []

    def migrate() -> None:
        try:
            own = connections[connection.alias]
            own.ensure_connection()
            migrating_pid.append(own.connection.info.backend_pid)
            change()
        except BaseException as exc:
            failure.append(exc)
        finally:
            connections[connection.alias].close()

    blocker.execute("BEGIN")
    blocker.execute(f"UPDATE {TABLE} SET priority = priority WHERE id = %s", [held_row])
    thread = threading.Thread(target=migrate)
    try:
        thread.start()
        modes: set[str] = set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not failure:
            if migrating_pid:
                waiting = blocker.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    [migrating_pid[0]],
                ).fetchone()
                if waiting and waiting[0]:
                    modes = {
                        mode
                        for (mode,) in blocker.execute(
                            "SELECT mode FROM pg_locks WHERE pid = %s AND relation = %s::regclass",
                            [migrating_pid[0], TABLE],
                        ).fetchall()
                    }
                    break
            time.sleep(0.02)
        assert not failure, failure
        assert modes, "the schema change never waited for the open transaction"
        writer.execute(f"SET lock_timeout = '{WRITE_PATIENCE}s'")
        began = time.monotonic()
        inserted: float | None
        try:
            writer.execute(
                f"INSERT INTO {TABLE} SELECT (jsonb_populate_record(task,"
                " jsonb_build_object('id', gen_random_uuid(), 'queue_name', 'during'))).*"
                f" FROM {TABLE} task WHERE id = %s",
                [template],
            )
            inserted = time.monotonic() - began
        except psycopg.errors.LockNotAvailable:
            inserted = None
    finally:
        blocker.execute("ROLLBACK")
        thread.join(timeout=30)
        blocker.close()
        writer.close()
    assert not thread.is_alive(), "the schema change did not finish once the transaction ended"
    assert not failure, failure
    return modes, inserted


def _operations(migration: str) -> tuple[list[Any], list[Any]]:
    """The migration's operations, and the project state before each of them."""
    loader = MigrationExecutor(connection).loader
    node = (APP, migration)
    state = loader.project_state(node, at_end=False)
    operations = list(loader.graph.nodes[node].operations)
    states = []
    for operation in operations:
        states.append(state)
        state = state.clone()
        operation.state_forwards(APP, state)
    states.append(state)
    return operations, states


def _applied(operation: Any, before: Any, after: Any, *, forwards: bool) -> Callable[[], None]:
    """Running ``operation`` forwards (``before`` → ``after``) or backwards, outside a
    transaction, as ``migrate`` runs a non-atomic migration's operations."""

    def run() -> None:
        with connections[connection.alias].schema_editor(atomic=False) as editor:
            if forwards:
                operation.database_forwards(APP, editor, before, after)
            else:
                operation.database_backwards(APP, editor, after, before)

    return run


@pytest.mark.parametrize("migration", CONCURRENT_INDEX_MIGRATIONS)
def test_each_index_migration_of_the_task_table_lets_writes_through(migration):
    """Backwards (last operation first) and forwards again: each step takes
    SHARE UPDATE EXCLUSIVE on the table and nothing stronger, and a write from another
    session goes through while the step waits; the indexes end as the migration left them."""
    operations, states = _operations(migration)

    def step(index: int, forwards: bool) -> Callable[[], None]:
        return _applied(operations[index], states[index], states[index + 1], forwards=forwards)

    undone: list[int] = []
    try:
        for index in reversed(range(len(operations))):
            modes, inserted = _while_a_writer_waits(step(index, forwards=False))
            undone.append(index)
            assert modes == {LETS_WRITES_THROUGH}, (migration, "backwards", index, modes)
            assert inserted is not None, (migration, "backwards", index)
        for index in range(len(operations)):
            modes, inserted = _while_a_writer_waits(step(index, forwards=True))
            undone.remove(index)
            assert modes == {LETS_WRITES_THROUGH}, (migration, "forwards", index, modes)
            assert inserted is not None, (migration, "forwards", index)
    finally:
        for index in sorted(undone):  # a failed check must not leave the schema changed
            step(index, forwards=True)()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass AND NOT indisvalid",
            [TABLE],
        )
        assert cursor.fetchone() == (0,)


def test_a_plain_index_build_would_be_caught():
    """The check itself: Django's own AddIndex (a plain CREATE INDEX) waits for SHARE on
    the table and the third session's INSERT waits behind it, so the test above would
    fail on such a migration."""
    from django.db import migrations, models

    state = MigrationExecutor(connection).loader.project_state()
    plain = migrations.AddIndex(
        "taskrecord", models.Index(fields=["priority"], name="dtp_test_plain")
    )
    after = state.clone()
    plain.state_forwards(APP, after)

    try:
        modes, inserted = _while_a_writer_waits(_applied(plain, state, after, forwards=True))
        assert modes == {"ShareLock"}
        assert inserted is None
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS dtp_test_plain")
