"""PostgreSQL-only guarantees: many processes, NOTIFY wake-ups, reconnection."""

from __future__ import annotations

import pytest
from django.db import connection

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import TaskRecord, WorkerRecord
from tests import tasks
from tests.conftest import idle_claim_parameters, wait_for, worker_log

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def test_four_processes_run_every_task_exactly_once(run_worker, ledger):
    count = 2000
    for n in range(count):
        tasks.record.enqueue(n)
    # A small fixed prefetch makes all four processes take part (see the last assert).
    proc = run_worker(
        "--burst", "--processes", "4", "--concurrency", "4", "--prefetch", "4", timeout=300
    )
    assert proc.returncode == 0, proc.stderr

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*), count(DISTINCT n), count(DISTINCT pid) FROM {ledger}")
        executions, distinct_tasks, processes = cursor.fetchone()
    assert executions == count  # no task ran twice
    assert distinct_tasks == count  # no task was skipped
    assert processes > 1  # the work really was shared
    assert TaskRecord.objects.filter(status=TaskResultStatus.SUCCESSFUL, attempt=1).count() == count
    workers = set()
    for ids in TaskRecord.objects.values_list("worker_ids", flat=True):
        workers.update(ids)
    assert len(workers) == 4


def test_notify_wakes_an_idle_worker(start_worker, tmp_path):
    # With a 60 s poll interval only NOTIFY can make the worker start the task quickly.
    worker = start_worker("--worker-id", "listener", "--poll-interval", "60", "--max-tasks", "1")
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="listener").exists())
    wait_for(lambda: "LISTEN" in _listeners(), timeout=10)
    result = tasks.add.enqueue(20, 1)
    assert worker.wait(timeout=20) == 0, worker_log(tmp_path)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def _listeners() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(string_agg(query, ';'), '') FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
        )
        return cursor.fetchone()[0]


def test_worker_survives_dropped_connections(start_worker, tmp_path):
    worker = start_worker("--worker-id", "survivor", "--poll-interval", "0.2")
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="survivor").exists())
    first = tasks.add.enqueue(1, 1)
    wait_for(lambda: TaskRecord.objects.get(pk=first.id).status == TaskResultStatus.SUCCESSFUL)

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1

    results = [tasks.add.enqueue(i, i) for i in range(5)]
    wait_for(
        lambda: (
            TaskRecord.objects.filter(
                pk__in=[r.id for r in results], status=TaskResultStatus.SUCCESSFUL
            ).count()
            == 5
        ),
        timeout=60,
    )
    assert worker.poll() is None, worker_log(tmp_path)


def test_claim_plan_uses_the_partial_claim_index():
    """The worker's real claim statement, EXPLAINed over a backlog of 5,000 READY tasks
    beside 50,000 finished ones (as in the benchmark's W4, scaled down): it must walk the
    partial claim index (dtp_task_claim_idx), not scan or sort the table."""
    from django_tasks_plus.db.pgexec import fetch_all
    from django_tasks_plus.db.postgresql import CLAIM

    tasks.add.enqueue_many([((n, n), {}) for n in range(50_000)])
    TaskRecord.objects.update(status=TaskResultStatus.SUCCESSFUL)
    tasks.add.enqueue_many([((n, n), {}) for n in range(5_000)])
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
    plan_rows = fetch_all(connection, "EXPLAIN " + CLAIM, idle_claim_parameters())
    plan = "\n".join(row[0] for row in plan_rows)
    assert "dtp_task_claim_idx" in plan, plan
    assert f"Seq Scan on {table} candidate" not in plan, plan
    assert TaskRecord.objects.filter(status=TaskResultStatus.READY).count() == 5_000


def test_operator_actions_wake_an_idle_worker(start_worker, tmp_path):
    """Run now, redrive and discard make a task due now: NOTIFY starts it at once, not
    at the next poll (60 s here)."""
    from django.utils import timezone

    from django_tasks_plus import operations

    worker = start_worker("--worker-id", "woken", "--poll-interval", "60", "--max-tasks", "3")
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="woken").exists())
    wait_for(lambda: "LISTEN" in _listeners(), timeout=10)

    def succeeded(task_id: str) -> bool:
        return TaskRecord.objects.get(pk=task_id).status == TaskResultStatus.SUCCESSFUL

    hour = timezone.now() + timezone.timedelta(hours=1)
    later = tasks.add.using(run_after=hour).enqueue(1, 2)
    assert operations.run_now(later)
    wait_for(lambda: succeeded(later.id), timeout=15)

    # Dead without having run (a worker must not take them before they are made so).
    dead = tasks.add.using(run_after=hour).enqueue(3, 4)
    blocker = tasks.add.using(run_after=hour, ordering_key="acct").enqueue(0, 0)
    TaskRecord.objects.filter(pk__in=[dead.id, blocker.id]).update(
        status=TaskResultStatus.FAILED, ordering_blocked=True
    )
    follower = tasks.add.using(ordering_key="acct").enqueue(5, 6)

    assert operations.redrive(dead)
    wait_for(lambda: succeeded(dead.id), timeout=15)
    assert operations.discard(blocker)
    wait_for(lambda: succeeded(follower.id), timeout=15)
    assert worker.wait(timeout=20) == 0, worker_log(tmp_path)
