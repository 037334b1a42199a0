"""The claim pays only for the rows it takes: tasks due later (at any priority) and due
tasks of queues the worker does not serve cost it nothing that grows with their number."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from django_tasks_plus.db import dialect_for
from django_tasks_plus.models import TaskRecord
from tests.conftest import (
    assert_index_migration_runs_concurrently,
    claim_tasks,
    idle_claim_parameters,
    postgres_only,
)

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = TaskRecord._meta.db_table


def _insert(count: int, *, queue: str, priority: int, due_in_seconds: int) -> None:
    """``count`` READY rows of the default backend, due ``due_in_seconds`` from now (past
    when negative), written by one INSERT … SELECT so a big backlog takes no time."""
    if connection.vendor == "postgresql":
        ids, series, due = (
            "gen_random_uuid()",
            f"generate_series(1, {count})",
            f"now() + make_interval(secs => {due_in_seconds})",
        )
    else:
        ids = "lower(hex(randomblob(16)))"
        series = (
            "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n"
            f" WHERE i < {count}) SELECT i FROM n)"
        )
        due = f"strftime('%Y-%m-%d %H:%M:%f', 'now', '{due_in_seconds:+d} seconds')"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {TABLE} (id, task_path, backend_name, queue_name, priority, args,
                kwargs, status, run_after, attempt, worker_ids, enqueued_at, errors,
                dead_letter_reason, ordering_blocked, cancel_requested, metadata)
            SELECT {ids}, 'tests.tasks.add', 'default', %s, %s, '[]', '{{}}', 'READY',
                {due}, 0, '[]', {due}, '[]', '', false, false, '{{}}'
            FROM {series} AS s
            """,
            [queue, priority],
        )


def _backlog(count: int) -> None:
    """The three kinds of rows a claim must not pay for, ``count`` of each."""
    _insert(count, queue="default", priority=0, due_in_seconds=3600)  # retries, scheduled
    _insert(count, queue="default", priority=10, due_in_seconds=3600)  # ... at a higher priority
    _insert(count, queue="elsewhere", priority=0, due_in_seconds=-60)  # a queue not served


def _claim(queues: list[str], limit: int = 16) -> list[Any]:
    return claim_tasks(limit, queues=queues, worker_id="w", visibility_timeout=60.0)


def test_the_claim_takes_due_tasks_in_claim_order_across_queues_and_priorities():
    """Beside a backlog of every kind, the claim takes exactly the due tasks of its own
    queues: highest priority first, then earliest due, whichever served queue holds them."""
    _backlog(50)
    _insert(1, queue="b", priority=5, due_in_seconds=-30)
    _insert(1, queue="a", priority=5, due_in_seconds=-20)
    _insert(1, queue="a", priority=0, due_in_seconds=-50)
    _insert(1, queue="b", priority=0, due_in_seconds=-40)
    _insert(1, queue="a", priority=-3, due_in_seconds=-90)
    _insert(1, queue="b", priority=5, due_in_seconds=+600)  # later: not taken
    first = _claim(["a", "b", "a"], limit=3)  # a queue named twice is served once
    rest = _claim(["a", "b"], limit=16)
    order = [(task.queue_name, task.priority) for task in first + rest]
    assert order == [("b", 5), ("a", 5), ("a", 0), ("b", 0), ("a", -3)]
    assert _claim(["a", "b"]) == []


# The claim's parameters' types, in claim_parameters' order (a PREPARE names them).
CLAIM_PARAMETER_TYPES = "text, text[], bigint, bigint, text, float8, text"


@pytest.mark.postgres
@pytest.mark.parametrize("planning", ["custom", "generic"])
def test_the_claim_reads_the_same_buffers_whatever_the_backlog(planning: str):
    """EXPLAIN (ANALYZE, BUFFERS) of the worker's claim, idle, beside 1,000 and then
    20,000 rows of each kind nobody may take yet: the buffers it reads stay within a small
    constant (a deeper index), where a walk of the backlog would read thousands more.
    Both with a plan made for the call's values and with the generic plan the worker's
    prepared claim runs (``db/pgexec.py``), made without knowing them."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's EXPLAIN")
    from django_tasks_plus.db.postgresql import CLAIM

    params = idle_claim_parameters()
    numbered = CLAIM
    for number in range(1, len(params) + 1):
        numbered = numbered.replace("%s", f"${number}", 1)
    assert "%s" not in numbered

    def idle_claim_buffers() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {TABLE}")
            cursor.execute("BEGIN")
            if planning == "custom":
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM, params)
            else:
                cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                cursor.execute(f"PREPARE dtp_claim ({CLAIM_PARAMETER_TYPES}) AS {numbered}")
                cursor.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE dtp_claim "
                    f"({', '.join(['%s'] * len(params))})",
                    params,
                )
            (raw,) = cursor.fetchone()
            cursor.execute("ROLLBACK")
            # A generic plan shows the parameters where a custom one shows their values.
            assert ("$1" in json.dumps(raw)) == (planning == "generic")
            if planning == "generic":
                cursor.execute("DEALLOCATE dtp_claim")  # a session's, not a transaction's
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
        blocks = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        return blocks, plan["Actual Rows"]

    _backlog(1_000)
    small, claimed = idle_claim_buffers()
    assert claimed == 0
    _backlog(19_000)
    big, claimed = idle_claim_buffers()
    assert claimed == 0
    assert TaskRecord.objects.count() == 60_000
    assert big <= small + 10, (small, big)


def test_the_claim_index_is_built_without_blocking_writes():
    """0014 builds the claim's index (and drops the old one) CONCURRENTLY on PostgreSQL."""
    assert_index_migration_runs_concurrently("0014_claim_index", "dtp_task_claim_idx")


@pytest.mark.postgres
def test_the_worker_s_sessions_run_without_jit():
    """The claim's estimate can pass jit_above_cost with a deep backlog (compiling took
    ~270 ms of every claim): the worker's bookkeeping sessions turn JIT off, and give the
    session's own setting back when unbounded."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's JIT")
    from django_tasks_plus.db import worker_connection

    def jit(on: Any) -> str:
        with on.cursor() as cursor:
            cursor.execute("SELECT current_setting('jit')")
            return cursor.fetchone()[0]

    connection.ensure_connection()
    own = jit(connection)
    bounded = worker_connection("default", 30)
    try:
        assert jit(bounded) == "off"
    finally:
        dialect_for(bounded).unbound_worker_statements(bounded)
    assert jit(bounded) == own


@postgres_only
def test_an_index_an_interrupted_build_left_invalid_is_built_again(caplog):
    """A concurrent build stopped half-way leaves its index behind, invalid (here: a
    unique build that met a duplicate); running the operation again drops it and builds
    a valid one instead of failing on its name, for a unique constraint and an index."""
    from django.db import IntegrityError, models
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    from django_tasks_plus.db.migration_operations import (
        AddConstraintConcurrently,
        AddIndexConcurrently,
    )

    name = "dtp_test_leftover"
    now = timezone.now()
    rows = [
        TaskRecord.objects.create(
            task_path="tests.tasks.add", queue_name="twice", run_after=now, enqueued_at=now
        )
        for _ in range(2)
    ]
    state = MigrationExecutor(connection).loader.project_state()

    def run(operation: Any) -> None:
        after = state.clone()
        operation.state_forwards("django_tasks_plus", after)
        with connection.schema_editor(atomic=False) as editor:
            operation.database_forwards("django_tasks_plus", editor, state, after)

    def valid() -> bool | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name]
            )
            row = cursor.fetchone()
        return None if row is None else row[0]

    unique = AddConstraintConcurrently(
        "taskrecord",
        models.UniqueConstraint(
            fields=["queue_name"], condition=models.Q(status="READY"), name=name
        ),
    )
    try:
        with pytest.raises(IntegrityError):
            run(unique)
        assert valid() is False  # the interrupted build's leftover
        rows[1].delete()
        run(unique)
        assert valid() is True
        assert f"Index '{name}' was left invalid" in caplog.text

        with connection.cursor() as cursor:  # a leftover again, then a plain index
            cursor.execute(f"DROP INDEX {name}")
        TaskRecord.objects.create(
            task_path="tests.tasks.add", queue_name="twice", run_after=now, enqueued_at=now
        )
        with pytest.raises(IntegrityError):
            run(unique)
        assert valid() is False
        run(AddIndexConcurrently("taskrecord", models.Index(fields=["queue_name"], name=name)))
        assert valid() is True
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
