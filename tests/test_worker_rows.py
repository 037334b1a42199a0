"""Worker rows: each judged by its own worker's visibility timeout (alive/stale, pruning),
and a worker whose row was deleted while it was paused registers again and is seen."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from django_tasks_plus import metrics
from django_tasks_plus.compat import TaskResultStatus, task_backends
from django_tasks_plus.db.leadership import current_leader
from django_tasks_plus.models import TaskRecord, WorkerRecord
from django_tasks_plus.worker.pruner import Pruner
from tests import tasks
from tests.conftest import wait_for, worker_log, worker_row

pytestmark = pytest.mark.django_db(transaction=True)


def _row(worker_id: str, *, silent_for: float, visibility_timeout: float) -> WorkerRecord:
    return worker_row(
        worker_id, silent_for=timedelta(seconds=silent_for), visibility_timeout=visibility_timeout
    )


def _alive() -> dict[str, bool]:
    return {worker.worker_id: worker.alive for worker in metrics.workers("default")}


def test_each_row_is_judged_by_its_own_workers_visibility_timeout(admin_client: Client):
    """The backend says 60 s; the rows' workers said otherwise."""
    _row("patient", silent_for=400, visibility_timeout=600)  # beats every 200 s
    _row("hasty", silent_for=5, visibility_timeout=1)  # missed 15 beats
    _row("hasty-dead", silent_for=11, visibility_timeout=1)
    _row("old-style", silent_for=3600, visibility_timeout=60)
    assert _alive() == {"patient": True, "hasty": False, "hasty-dead": False, "old-style": False}
    page = admin_client.get("/admin/django_tasks_plus/workerrecord/").content.decode()
    assert "ALIVE" in page.split("patient</a>")[1].split("</tr>")[0]
    assert "STALE" in page.split("hasty</a>")[1].split("</tr>")[0]

    # A leader with a 30 s timeout forgets rows silent for 10 of *their* timeouts.
    settings = task_backends["default"].settings
    Pruner(settings, clock=timezone.now, bound_seconds=30, sweeps=[]).tick()
    connection.close()  # the pruner bounded this session's statements as a worker's
    assert set(WorkerRecord.objects.values_list("worker_id", flat=True)) == {"patient", "hasty"}


def _start_leader(start_worker, worker_id: str, timeout: str) -> None:
    start_worker("--worker-id", worker_id, "--visibility-timeout", timeout, "--queue", "default")
    wait_for(lambda: current_leader("default", "default") == worker_id, timeout=60)


def test_a_worker_pruned_while_paused_registers_again_and_keeps_working(start_worker, tmp_path):
    _start_leader(start_worker, "rows-leader", "0.5")
    paused = start_worker(
        "--worker-id", "rows-paused", "--visibility-timeout", "0.5", "--queue", "other"
    )
    before = tasks.echo.enqueue("before")  # queue "other": only the paused worker serves it
    wait_for(lambda: before.refresh() or before.status == TaskResultStatus.SUCCESSFUL, timeout=60)
    started_at = WorkerRecord.objects.get(worker_id="rows-paused").started_at

    os.killpg(paused.pid, signal.SIGSTOP)
    try:
        # The leader forgets it after 10 of its timeouts (5 s) of silence.
        wait_for(lambda: not WorkerRecord.objects.filter(worker_id="rows-paused").exists(), 60)
    finally:
        os.killpg(paused.pid, signal.SIGCONT)
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="rows-paused").exists(), timeout=30)
    row = WorkerRecord.objects.get(worker_id="rows-paused")
    assert (row.pid, row.started_at, row.visibility_timeout) == (paused.pid, started_at, 0.5)
    # The heartbeat writes the row, then logs: the line may land a moment after the row.
    wait_for(
        lambda: "found its row gone" in worker_log(tmp_path, 1),
        timeout=30,
        seen=lambda: worker_log(tmp_path, 1)[-2000:],
    )
    wait_for(lambda: _alive().get("rows-paused") is True, timeout=30)

    after = [tasks.echo.enqueue(n) for n in range(3)]
    wait_for(
        lambda: (
            TaskRecord.objects.filter(
                pk__in=[r.id for r in after], status=TaskResultStatus.SUCCESSFUL
            ).count()
            == 3
        ),
        timeout=60,
    )
    for result in after:
        result.refresh()
        assert result.worker_ids == ["rows-paused"]
    assert paused.poll() is None


def test_a_leader_with_a_short_timeout_keeps_the_row_of_a_worker_with_a_long_one(
    start_worker, tmp_path
):
    """A --visibility-timeout 60 worker beats every 20 s: a leader with 0.3 s (forgetting
    rows silent for 3 s by its own measure) must not take it for dead in between."""
    _start_leader(start_worker, "mixed-leader", "0.3")
    start_worker("--worker-id", "mixed-patient", "--visibility-timeout", "60", "--queue", "other")
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="mixed-patient").exists(), timeout=60)
    beat = WorkerRecord.objects.get(worker_id="mixed-patient").last_heartbeat_at
    wait_for(lambda: timezone.now() - beat > timedelta(seconds=4), timeout=30, interval=0.2)
    # A round of the leader's pruner after that: it forgets a row that is really dead.
    _row("really-dead", silent_for=3600, visibility_timeout=0.3)
    wait_for(lambda: not WorkerRecord.objects.filter(worker_id="really-dead").exists(), 30)
    assert WorkerRecord.objects.filter(worker_id="mixed-patient").exists()
    assert "found its row gone" not in worker_log(tmp_path, 1)  # never deleted
    assert _alive()["mixed-patient"] is True
