"""``runtasks --processes N`` does once, in the supervisor, the start-up work every forked
worker would repeat (docs/performance.md, "The workers' memory"): the children then
share those pages instead of each writing its own copy. It must hand them no open
session, and a database that is down must still reach the workers, which report it as
before."""

from __future__ import annotations

import pytest
from django.db import connection

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import installed_version, prepare_to_fork
from tests import tasks
from tests.conftest import REFUSED_DATABASE

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_supervisor_prepares_the_start_up_once_and_keeps_no_session():
    installed_version.cache_clear()
    connection.close()
    prepare_to_fork(WorkerConfig.from_settings(worker_id="prepare"))
    assert connection.connection is None  # no driver session for a child to inherit
    assert installed_version.cache_info().currsize == 1  # the children read it, not the disk
    assert installed_version() == installed_version.__wrapped__()


def test_the_supervisor_loads_what_the_workers_outcome_writes_need():
    """On PostgreSQL, msgspec's encoder for outcome batches: loaded before the fork, it
    is one copy shared by every worker rather than one per worker."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's outcome writes only")
    from django_tasks_plus.db import postgresql

    postgresql._fast_records.cache_clear()
    prepare_to_fork(WorkerConfig.from_settings(worker_id="prepare"))
    assert postgresql._fast_records.cache_info().currsize == 1


def test_forked_workers_run_every_task_after_the_preparation(run_worker):
    results = [tasks.add.enqueue(n, n) for n in range(40)]
    proc = run_worker("--burst", "--processes", "2", "--concurrency", "2", "--prefetch", "2")
    assert proc.returncode == 0, proc.stderr
    done = TaskRecord.objects.filter(pk__in=[r.id for r in results])
    assert set(done.values_list("status", flat=True)) == {TaskResultStatus.SUCCESSFUL}
    assert sorted(done.values_list("return_value", flat=True)) == sorted(2 * n for n in range(40))


def test_a_database_down_at_start_is_left_to_the_workers_to_report(run_worker):
    down = {"DATABASE_URL": REFUSED_DATABASE}
    proc = run_worker("--burst", "--processes", "2", "-v", "1", timeout=60, env=down)
    assert proc.returncode == 1
    # Both children started and met the refused connection themselves (one line each,
    # test_bad_input.py): the supervisor's preparation let it pass rather than
    # die before forking.
    assert "Traceback" not in proc.stderr, proc.stderr
    refused = [line for line in proc.stderr.splitlines() if "Connection refused" in line]
    assert sorted(line.split(": Worker ")[0][-16:] for line in refused) == [
        "Worker process 0",
        "Worker process 1",
    ]
