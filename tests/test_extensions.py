"""What features add to the engine without touching it (``extensions.py``): hooks inside
the outcome transaction and conditions on the claim, through real workers and real
databases, with test-only features that write to tables of their own.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_tasks_plus import extensions
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db import dialect_for
from django_tasks_plus.db.completions import apply_transitions
from django_tasks_plus.extensions import ClaimFilter, OutcomeBatch, Registry
from django_tasks_plus.lifecycle import Transition
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import Worker
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)

OUTCOME_LOG = "dtp_test_outcome_log"
PAUSED = "dtp_test_paused_queue"


def _execute(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall()) if cursor.description else []


@pytest.fixture
def feature_tables() -> Iterator[None]:
    """The test features' own tables (a feature brings its own, never a task column)."""
    _execute(f"CREATE TABLE {OUTCOME_LOG} (task_id varchar(64) NOT NULL, status varchar(16))")
    _execute(f"CREATE TABLE {PAUSED} (queue_name varchar(100) PRIMARY KEY)")
    yield
    extensions.reset()
    _execute(f"DROP TABLE {OUTCOME_LOG}")
    _execute(f"DROP TABLE {PAUSED}")


def log_outcomes(batch: OutcomeBatch) -> None:
    """A test-only feature's bookkeeping: one row per outcome, in the outcome's transaction."""
    with batch.connection.cursor() as cursor:
        for written in batch.outcomes:
            cursor.execute(
                f"INSERT INTO {OUTCOME_LOG} (task_id, status) VALUES (%s, %s)",
                [written.claimed.id, str(written.transition.status)],
            )


def _claim_one(result_id: str):  # type: ignore[no-untyped-def]
    dialect = dialect_for(connection)
    [claimed] = dialect.claim(
        connection,
        backend_name="default",
        queues=["default"],
        limit=1,
        worker_id="w",
        lease_token=uuid.uuid4().hex,
        visibility_timeout=60.0,
    )
    assert claimed.id == result_id
    return claimed


def _success() -> Transition:
    return Transition(TaskResultStatus.SUCCESSFUL, {"return_value": 2})


def _burst(**options) -> Worker:  # type: ignore[no-untyped-def]
    worker = Worker(WorkerConfig.from_settings("default", burst=True, **options))
    assert worker.run() == 0
    return worker


# -- the registry ----------------------------------------------------------------------------


def test_a_registry_keeps_one_of_each_entry_and_reset_keeps_the_builtin_ones():
    registry: Registry[object] = Registry("things")
    own, feature = object(), object()
    registry.register(own, builtin=True)
    registry.register(feature)
    registry.register(feature)
    assert registry.entries == (own, feature)
    version = registry.version
    registry.reset()
    assert registry.entries == (own,) and registry.version > version
    with registry.registered(feature):
        assert feature in registry.entries
    assert registry.entries == (own,)


# -- hooks inside the outcome transaction ----------------------------------------------------


def test_with_no_hook_registered_an_outcome_batch_sends_no_extra_statement(
    feature_tables, monkeypatch
):
    """The mechanism itself costs nothing: with no hook, a batch one statement writes
    opens no transaction; a registered hook that writes nothing adds only the transaction
    it runs in, and a hook writing one row per outcome sends exactly that row's statement
    more. (On PostgreSQL the write runs on the worker's own psycopg cursor, which Django
    does not log; Django 6 logs BEGIN and COMMIT, 5.2 does not.)"""
    from django_tasks_plus.db import completions

    opened: list[str] = []
    real_atomic = completions.transaction.atomic

    def counting_atomic(*args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append("atomic")
        return real_atomic(*args, **kwargs)

    monkeypatch.setattr(completions.transaction, "atomic", counting_atomic)

    def statements(hook=None) -> list[str]:  # type: ignore[no-untyped-def]
        result = tasks.add.enqueue(1, 1)
        claimed = _claim_one(result.id)
        opened.clear()
        with CaptureQueriesContext(connection) as queries:
            if hook is None:
                assert apply_transitions("default", [(claimed, _success())]) == [True]
            else:
                with extensions.outcome_hooks.registered(hook):
                    assert apply_transitions("default", [(claimed, _success())]) == [True]
        return [query["sql"] for query in queries]

    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")

    def besides_control(sqls: list[str]) -> list[str]:
        return [sql for sql in sqls if not sql.startswith(control)]

    bare = statements()  # PostgreSQL: none logged; SQLite: the ORM's UPDATE
    assert opened == [] and besides_control(bare) == bare, bare
    quiet = statements(lambda batch: None)
    assert opened == ["atomic"] and len(besides_control(quiet)) == len(bare), quiet
    logged = besides_control(statements(log_outcomes))
    assert len(logged) == len(bare) + 1 and logged[-1].startswith("INSERT"), logged


def test_a_hook_sees_only_the_outcomes_that_landed(feature_tables):
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    claimed_first, claimed_second = _claim_one(first.id), _claim_one(second.id)
    stale = claimed_second._replace(lease_token="lost")
    with extensions.outcome_hooks.registered(log_outcomes):
        landed = apply_transitions("default", [(claimed_first, _success()), (stale, _success())])
    assert landed == [True, False]
    assert _execute(f"SELECT task_id, status FROM {OUTCOME_LOG}") == [(first.id, "SUCCESSFUL")]


def test_a_hook_writes_its_rows_with_each_outcome_through_a_real_worker(feature_tables):
    results = [tasks.add.enqueue(n, n) for n in range(12)]
    results.append(tasks.always_fails.enqueue("boom"))
    extensions.outcome_hooks.register(log_outcomes)
    _burst(concurrency=4)
    rows = _execute(f"SELECT task_id, status FROM {OUTCOME_LOG}")
    # One row per written outcome, with the status the task row got with it: one success
    # per add, and for the failing task one row per attempt (retries, then the dead letter).
    for result in results[:-1]:
        assert [s for task_id, s in rows if task_id == result.id] == ["SUCCESSFUL"]
    failing = TaskRecord.objects.get(pk=results[-1].id)
    assert failing.status == TaskResultStatus.FAILED
    mine = [s for task_id, s in rows if task_id == results[-1].id]
    assert sorted(mine) == sorted(["READY"] * (failing.attempt - 1) + ["FAILED"])
    assert len(rows) == len(results) - 1 + failing.attempt


def test_a_hook_that_raises_rolls_its_batch_back_as_a_failed_write(feature_tables):
    """A hook raising on one task's success: the batch is written again row by row (the
    engine's handling of a write that fails on its content); that task's success is
    refused and it is dead-lettered with OutcomeNotStorable instead; nothing of the
    refused outcome is left half-written, and every other outcome lands with its row."""
    doomed = tasks.echo.enqueue("doomed")

    def refuses_doomed(batch: OutcomeBatch) -> None:
        log_outcomes(batch)
        for written in batch.outcomes:
            if written.claimed.id == doomed.id and written.transition.status == "SUCCESSFUL":
                raise RuntimeError("the feature's bookkeeping failed")

    others = [tasks.add.enqueue(n, n) for n in range(8)]
    extensions.outcome_hooks.register(refuses_doomed)
    _burst(concurrency=4, prefetch=16)
    row = TaskRecord.objects.get(pk=doomed.id)
    assert row.status == TaskResultStatus.FAILED
    assert row.errors[-1]["exception_class_path"].endswith("OutcomeNotStorable")
    logged = _execute(f"SELECT task_id, status FROM {OUTCOME_LOG}")
    assert sorted(status for task_id, status in logged if task_id == doomed.id) == ["FAILED"]
    for result in others:
        assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.SUCCESSFUL
        assert [s for task_id, s in logged if task_id == result.id] == ["SUCCESSFUL"]


# -- conditions on the claim -----------------------------------------------------------------

PAUSED_QUEUES = ClaimFilter(
    name="paused queues",
    sql={
        vendor: f"NOT EXISTS (SELECT 1 FROM {PAUSED} p WHERE p.queue_name = candidate.queue_name)"
        for vendor in ("postgresql", "sqlite")
    },
)


def test_a_claim_filter_keeps_a_paused_queue_out_of_a_real_worker(feature_tables):
    _execute(f"INSERT INTO {PAUSED} (queue_name) VALUES (%s)", ["emails"])
    skipped_path = ClaimFilter(
        name="not this task",
        sql={v: "candidate.task_path <> %s" for v in ("postgresql", "sqlite")},
        params=(tasks.echo.module_path,),
    )
    runs = [tasks.add.enqueue(n, n) for n in range(5)]
    paused = [tasks.add.using(queue_name="emails").enqueue(n, n) for n in range(3)]
    skipped = tasks.echo.enqueue("later")
    extensions.claim_filters.register(PAUSED_QUEUES)
    extensions.claim_filters.register(skipped_path)
    _burst(concurrency=2)
    status = {str(pk): s for pk, s in TaskRecord.objects.values_list("id", "status")}
    assert {status[r.id] for r in runs} == {TaskResultStatus.SUCCESSFUL}
    assert {status[r.id] for r in paused} == {TaskResultStatus.READY}
    assert status[skipped.id] == TaskResultStatus.READY

    extensions.reset()  # the feature is gone: the same claim takes everything again
    _burst(concurrency=2)
    assert set(TaskRecord.objects.values_list("status", flat=True)) == {TaskResultStatus.SUCCESSFUL}


def test_a_burst_whose_claim_fails_retries_it_rather_than_stopping(feature_tables):
    """A claim that fails (here a claim filter whose SQL errors while a bad row sits in its
    table: a DataError on PostgreSQL, an OperationalError on SQLite) found nothing only
    because it did not look: ``--burst`` claims again rather than exiting with due tasks
    left READY. The row is mended from another session once the worker has logged the
    failure."""
    _execute(f"INSERT INTO {PAUSED} (queue_name) VALUES (%s)", ["not a number"])
    errs_on_a_bad_row = ClaimFilter(
        name="errs while its table holds a bad row",
        sql={
            "postgresql": f"(SELECT count(p.queue_name::int) FROM {PAUSED} p) >= 0",
            "sqlite": f"(SELECT count(json(p.queue_name)) FROM {PAUSED} p) >= 0",
        },
    )
    results = [tasks.add.enqueue(n, n) for n in range(3)]
    extensions.claim_filters.register(errs_on_a_bad_row)
    failures: list[str] = []
    claim_failed = threading.Event()

    class ClaimFailures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "claiming" in record.getMessage().lower():
                failures.append(record.getMessage())
                claim_failed.set()

    def mend_the_row() -> None:
        try:
            if claim_failed.wait(60):
                _execute(f"DELETE FROM {PAUSED}")
        finally:
            connection.close()

    watch = ClaimFailures(logging.WARNING)
    worker_logger = logging.getLogger("django_tasks_plus.worker")
    worker_logger.addHandler(watch)
    mender = threading.Thread(target=mend_the_row)
    mender.start()
    try:
        _burst(concurrency=2)
    finally:
        worker_logger.removeHandler(watch)
        claim_failed.set()
        mender.join()
    assert failures, "the claim never failed: the test did not test anything"
    for result in results:
        assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_claim_filter_without_sql_for_the_database_is_a_clear_error(feature_tables):
    only_mysql = ClaimFilter(name="mysql only", sql={"mysql": "1 = 1"})
    tasks.add.enqueue(1, 1)
    refused = pytest.raises(extensions.UnsupportedClaimFilter, match="'mysql only' has no SQL")
    with extensions.claim_filters.registered(only_mysql), refused:
        _claim_one("unused")
    assert TaskRecord.objects.get().status == TaskResultStatus.READY


@pytest.mark.postgres
def test_the_claim_plan_stays_on_the_claim_index_with_a_filter_registered(feature_tables):
    """The claim with a feature's condition, EXPLAINed over 5,000 READY tasks beside
    50,000 finished ones: still a walk of the partial claim index, no scan of the table."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's planner")
    from django_tasks_plus.db.pgexec import fetch_all
    from django_tasks_plus.db.postgresql import claim_parameters, claim_statement

    tasks.add.enqueue_many([((n, n), {}) for n in range(50_000)])
    TaskRecord.objects.update(status=TaskResultStatus.SUCCESSFUL)
    tasks.add.enqueue_many([((n, n), {}) for n in range(5_000)])
    _execute(f"INSERT INTO {PAUSED} (queue_name) VALUES ('emails')")
    table = TaskRecord._meta.db_table
    _execute(f"ANALYZE {table}")
    _execute(f"ANALYZE {PAUSED}")
    with extensions.claim_filters.registered(PAUSED_QUEUES):
        conditions, filter_params = extensions.claim_conditions("postgresql", fenced=True)
        assert PAUSED in conditions
        params = claim_parameters(
            backend_name="default",
            queues=["default"],
            filter_params=filter_params,
            limit=16,
            lease_token="token",
            visibility_timeout=300.0,
            worker_id="worker",
        )
        plan_rows = fetch_all(connection, "EXPLAIN " + claim_statement(conditions), params)
    plan = "\n".join(row[0] for row in plan_rows)
    assert "dtp_task_claim_idx" in plan, plan
    assert f"Seq Scan on {table}" not in plan, plan
