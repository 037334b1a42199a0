"""The worker's claim and outcome writes are prepared on its own session and planned once
(PostgreSQL), unless the project says ``OPTIONS["prepare_threshold"] = None``; a session
that loses its prepared statements (a pooler in transaction mode) goes on unprepared and
loses nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db import dialect_for, worker_connection
from django_tasks_plus.db.completions import apply_transitions
from django_tasks_plus.db.pgexec import worker_session
from django_tasks_plus.lifecycle import Transition
from django_tasks_plus.models import TaskRecord
from tests import tasks
from tests.conftest import claim_tasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="PostgreSQL's prepared statements"
    ),
]


@pytest.fixture(autouse=True)
def fresh_session() -> Iterator[None]:
    """Each test starts on a new session, bounded as the worker's own sessions are, and
    leaves none behind with its settings."""
    connection.close()
    worker_connection("default", 30)
    yield
    connection.close()


def _claim(limit: int = 16) -> list[Any]:
    return claim_tasks(limit, worker_id="w", visibility_timeout=60.0)


def _prepared() -> dict[str, tuple[int, int]]:
    """This session's prepared statements: the first words of each, with its generic and
    custom plan counts."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return {" ".join(text.split())[:40]: (generic, custom) for text, generic, custom in cursor}


def _deallocate_behind_the_drivers_back() -> None:
    """Drop every prepared statement of the session one by one (psycopg notices only
    ``DEALLOCATE ALL`` and ``DISCARD ALL``): what a pooler handing over another server
    session amounts to."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        for (name,) in cursor.fetchall():
            cursor.execute(f'DEALLOCATE "{name}"')


def _claim_plans() -> tuple[int, int] | None:
    return next(
        (plans for text, plans in _prepared().items() if text.startswith("WITH picked")), None
    )


def test_the_claim_is_prepared_once_and_planned_generically():
    for _ in range(3):
        tasks.add.enqueue(1, 2)
    assert len(_claim(limit=1)) == 1
    assert len(_claim(limit=1)) == 1
    assert _claim() != []
    assert _claim() == []
    # Four claims, one prepared statement, planned without its values each time: no
    # parse and no plan per claim.
    assert _claim_plans() == (4, 0)


def test_an_explicit_prepare_threshold_of_none_prepares_nothing(settings):  # type: ignore[no-untyped-def]
    options = connection.settings_dict.setdefault("OPTIONS", {})
    had = "prepare_threshold" in options
    before = options.get("prepare_threshold")
    options["prepare_threshold"] = None
    try:
        tasks.add.enqueue(1, 2)
        assert len(_claim()) == 1
        assert _claim() == []
        assert _prepared() == {}
        with connection.cursor() as cursor:
            cursor.execute("SHOW plan_cache_mode")
            assert cursor.fetchone()[0] == "auto"
    finally:
        if had:
            options["prepare_threshold"] = before
        else:
            del options["prepare_threshold"]


def test_a_claim_whose_prepared_statement_vanished_runs_unprepared(caplog):  # type: ignore[no-untyped-def]
    """What a pooler in transaction mode does: the next server session lacks the
    statement. The claim runs again unprepared, says why once, and prepares no more."""
    assert _claim() == []
    assert _claim_plans() is not None
    _deallocate_behind_the_drivers_back()
    result = tasks.add.enqueue(1, 2)
    with caplog.at_level(logging.WARNING, logger="django_tasks_plus.worker"):
        [claimed] = _claim()
        assert _claim() == []
    assert claimed.id == result.id
    warnings = [r for r in caplog.records if "prepared statement" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "prepare_threshold" in warnings[0].getMessage()
    assert _prepared() == {}


def test_a_claim_whose_result_type_a_migration_changed_runs_unprepared(caplog):  # type: ignore[no-untyped-def]
    """A migration that changes a column the claim returns, while a worker runs: the
    prepared claim fails with "cached plan must not change result type" (0A000), and is
    run again unprepared, as for a vanished statement."""
    import psycopg

    from django_tasks_plus.limits import TASK_PATH_MAX_LENGTH

    assert _claim() == []
    assert _claim_plans() is not None
    table = TaskRecord._meta.db_table

    def task_path_length(length: int) -> None:
        # From another session, as ``migrate`` would (on its own session, psycopg drops
        # its prepared statements after an ALTER and the failure never shows).
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
            other.execute(f"ALTER TABLE {table} ALTER COLUMN task_path TYPE varchar({length})")

    task_path_length(TASK_PATH_MAX_LENGTH + 1)
    try:
        result = tasks.add.enqueue(1, 2)
        with caplog.at_level(logging.WARNING, logger="django_tasks_plus.worker"):
            [claimed] = _claim()
        assert claimed.id == result.id
        warnings = [r for r in caplog.records if "prepared statement" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "a migration" in warnings[0].getMessage()
        assert not worker_session(connection.connection).planned_once
        # The stale statement is left on the server but never executed again.
        tasks.add.enqueue(3, 4)
        assert len(_claim()) == 1
        assert _claim_plans() == (1, 0)
    finally:
        task_path_length(TASK_PATH_MAX_LENGTH)


def test_an_outcome_whose_prepared_statement_vanished_is_written_on_the_retry():
    """Inside the outcome's transaction (a batch of two shapes of outcome, written by two
    statements) the statement cannot simply run again: the write fails as a lost
    connection would (the reporter retries those), and the retry lands."""
    first, fourth, fifth, second, third = (tasks.add.enqueue(n, n) for n in range(5))
    claimed = {task.id: task for task in _claim()}
    success = Transition(TaskResultStatus.SUCCESSFUL, {"return_value": 3})
    finished = {"return_value": 4, "finished_at": timezone.now()}
    success_at = Transition(TaskResultStatus.SUCCESSFUL, finished)
    assert apply_transitions("default", [(claimed[first.id], success)]) == [True]
    # A batch of the same two shapes prepares the statements such a batch runs.
    warm_up = [(claimed[fourth.id], success), (claimed[fifth.id], success_at)]
    assert apply_transitions("default", warm_up) == [True, True]
    assert any("UPDATE" in text for text in _prepared())
    _deallocate_behind_the_drivers_back()
    batch = [(claimed[second.id], success), (claimed[third.id], success_at)]
    with pytest.raises(OperationalError, match="prepared statement"):
        apply_transitions("default", batch)
    statuses = TaskRecord.objects.filter(id__in=[second.id, third.id]).values_list("status")
    assert set(statuses) == {("RUNNING",)}  # rolled back whole
    assert not transaction.get_connection().in_atomic_block
    assert apply_transitions("default", batch) == [True, True]
    statuses = TaskRecord.objects.filter(id__in=[second.id, third.id]).values_list("status")
    assert set(statuses) == {("SUCCESSFUL",)}
    assert _prepared() == {}


def test_a_one_statement_outcome_batch_whose_prepared_statement_vanished_lands_at_once():
    """A batch one statement writes runs with no transaction around it (it is atomic on
    its own), so the statement is simply run again unprepared."""
    first, second, third = (tasks.add.enqueue(n, n) for n in range(3))
    claimed = {task.id: task for task in _claim()}
    success = Transition(TaskResultStatus.SUCCESSFUL, {"return_value": 3})
    assert apply_transitions("default", [(claimed[first.id], success)]) == [True]
    _deallocate_behind_the_drivers_back()
    batch = [(claimed[second.id], success), (claimed[third.id], success)]
    assert apply_transitions("default", batch) == [True, True]
    statuses = TaskRecord.objects.filter(id__in=[second.id, third.id]).values_list("status")
    assert set(statuses) == {("SUCCESSFUL",)}
    assert _prepared() == {}


def test_a_claim_planned_on_an_empty_table_stays_on_indexes_as_the_table_grows():
    """A generic plan is kept until the table's statistics change (never, here: no
    ANALYZE), so the one made at the first claim, on an empty table, must not be the
    cheapest plan for a few rows (a sequential scan): beside 60,000 rows nobody may take
    yet, the cached claim still reads a few dozen buffers."""
    import json

    from tests.test_claim_backlog import _backlog, _insert

    assert _claim() == []
    [name] = [
        name
        for name, text in _named_statements()
        if " ".join(text.split()).startswith("WITH picked")
    ]
    _backlog(20_000)
    _insert(3, queue="default", priority=0, due_in_seconds=-5)
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(
            f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "{name}" '
            "('default', '{default}', 16, 16, 'token', 60, 'w')"
        )
        (raw,) = cursor.fetchone()
        cursor.execute("ROLLBACK")
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    assert plan["Actual Rows"] == 3
    assert "$1" in json.dumps(raw)  # the cached generic plan, not one made for these values
    blocks = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert blocks < 200, blocks  # a sequential scan reads ~1,200 (the whole table)


def _named_statements() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, statement FROM pg_prepared_statements")
        return cursor.fetchall()


def _planner_settings() -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan')"
        )
        return cursor.fetchone()


def test_the_planner_settings_go_with_the_worker_s_other_bounds():
    """The generic plan and index-only paths are the worker session's, set at its first
    prepared statement; unbinding the session (a pooled one handed back) gives them back,
    and an application's session (never bounded) prepares nothing."""
    assert _planner_settings() == ("auto", "on")
    _claim()
    assert _planner_settings() == ("force_generic_plan", "off")
    dialect_for(connection).unbound_worker_statements(connection)
    assert _planner_settings() == ("auto", "on")
    connection.close()  # a new session, as an application's: not bounded
    tasks.add.enqueue(1, 2)
    assert len(_claim()) == 1
    assert _planner_settings() == ("auto", "on")
    assert _prepared() == {}
    worker_connection("default", 30)
    _claim()
    assert _planner_settings() == ("force_generic_plan", "off")


def test_a_worker_prepares_on_its_own_session_only():
    """A burst worker (in this process) drains three tasks: the session its claim loop
    and outcome writer share prepared their statements; no other session did."""
    from django.db.backends.signals import connection_created

    from django_tasks_plus.worker.config import WorkerConfig
    from django_tasks_plus.worker.engine import Worker

    opened: list[Any] = []

    def remember(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(connection.connection)

    results = [tasks.add.enqueue(n, n) for n in range(3)]
    connection_created.connect(remember, dispatch_uid="test_prepared_statements")
    try:
        assert Worker(WorkerConfig.from_settings("default", burst=True)).run() == 0
    finally:
        connection_created.disconnect(dispatch_uid="test_prepared_statements")
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    preparing = [raw for raw in opened if worker_session(raw).planned_once]
    assert len(preparing) == 1, (len(opened), len(preparing))
    assert len(opened) >= 2  # the periodic services' session (and maybe others) did not
