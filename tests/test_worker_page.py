"""One worker's admin page, from real ``runtasks`` processes: the version it runs, the
attempts it processed and failed (counted by the worker, written by its heartbeat), whether
it leads (the election's own state), and its tasks in flight linked to their pages."""

from __future__ import annotations

import importlib.metadata
import signal
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db.leadership import current_leader
from django_tasks_plus.models import TaskRecord, WorkerRecord
from django_tasks_plus.worker.tally import OutcomeTally, counts_of
from tests import tasks
from tests.conftest import heartbeat_of, wait_for, worker_row

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = "admin:django_tasks_plus_workerrecord_"


def _page(client: Client, worker_id: str) -> str:
    response = client.get(reverse(f"{WORKERS}change", args=[worker_id]))
    assert response.status_code == 200
    return response.content.decode()


def _field(page: str, name: str) -> str:
    """The shown value of one read-only field of the page."""
    return page.split(f"field-{name}")[1].split('<div class="readonly">')[1].split("</div>")[0]


def _counts(worker_id: str) -> tuple[int, int]:
    row = WorkerRecord.objects.filter(worker_id=worker_id).first()
    return (-1, -1) if row is None else (row.tasks_processed, row.tasks_failed)


def _finished(results: list) -> bool:
    ids = [result.id for result in results]
    done = TaskRecord.objects.filter(
        pk__in=ids, status__in=(TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    )
    return done.count() == len(ids)


def test_the_counts_leave_out_what_spent_no_attempt():
    from django_tasks_plus.lifecycle import Transition

    succeeded = Transition(TaskResultStatus.SUCCESSFUL)
    retried = Transition(TaskResultStatus.READY, error={"exception_class_path": "x.Boom"})
    dead = Transition(TaskResultStatus.FAILED, error={"exception_class_path": "x.Boom"})
    deferred = Transition(TaskResultStatus.READY, {"run_after": None})
    held = Transition(TaskResultStatus.READY, held_because="breaker open")
    assert [counts_of(t) for t in (succeeded, retried, dead, deferred, held)] == [
        (1, 0),
        (1, 1),
        (1, 1),
        (0, 0),
        (0, 0),
    ]
    tally = OutcomeTally()
    for outcome in (succeeded, retried, dead, deferred):
        tally.add(outcome)
    assert tally.totals() == (3, 2)


def test_a_workers_page_shows_its_counts_version_and_tasks_in_flight(
    admin_client, start_worker, markers
):
    worker_id = "page-worker"
    start_worker(
        "--worker-id", worker_id, "--queue", "default", "--queue", "slow",
        "--concurrency", "2", "--visibility-timeout", "1.5",
    )  # fmt: skip
    wait_for(lambda: WorkerRecord.objects.filter(worker_id=worker_id).exists(), timeout=60)

    # 3 successes, 3 failed attempts (the last dead-lettered), 1 deferral then success.
    results = [tasks.add.enqueue(n, n) for n in range(3)]
    results.append(tasks.always_fails.enqueue("boom"))
    results.append(tasks.defers_once.enqueue())
    wait_for(lambda: _finished(results), timeout=60)
    # The row catches up on the next heartbeat (every half second here).
    wait_for(lambda: _counts(worker_id) == (7, 3), timeout=30, interval=0.1)

    page = _page(admin_client, worker_id)
    assert _field(page, "processed").strip() == "7"
    assert _field(page, "failed").strip() == "3"
    assert _field(page, "version_shown").strip() == importlib.metadata.version("django-tasks-plus")
    assert "ALIVE" in _field(page, "liveness")
    assert "default, slow" in _field(page, "queue_list")
    assert "0 tasks in flight" in page and "None: every slot is free." in page

    slow = tasks.sleep_then_return.enqueue(4.0)
    wait_for((markers / "sleeping-4.0").exists, timeout=60)
    page = _page(admin_client, worker_id)
    task_url = reverse("admin:django_tasks_plus_taskrecord_change", args=[slow.id])
    flight = page.split('class="module dtp-in-flight"')[1].split("</fieldset>")[0]
    assert "1 task in flight" in flight
    assert f'href="{task_url}"' in flight
    assert "tests.tasks.sleep_then_return" in flight
    assert f'title="{slow.id}"' in flight

    wait_for(lambda: slow.refresh() or slow.status == TaskResultStatus.SUCCESSFUL, timeout=60)
    wait_for(lambda: _counts(worker_id) == (8, 3), timeout=30, interval=0.1)
    assert "0 tasks in flight" in _page(admin_client, worker_id)

    # The list links each worker to its page.
    listing = admin_client.get(reverse(f"{WORKERS}changelist")).content.decode()
    assert f'href="{reverse(f"{WORKERS}change", args=[worker_id])}"' in listing


def _leaders() -> set[str]:
    return set(
        WorkerRecord.objects.filter(leader_since__isnull=False).values_list("worker_id", flat=True)
    )


def test_exactly_one_of_two_workers_is_shown_leading_and_the_other_takes_over(
    admin_client, start_worker
):
    procs = {
        "lead-a": start_worker(
            "--worker-id", "lead-a", "--queue", "default", "--visibility-timeout", "1"
        ),
        "lead-b": start_worker(
            "--worker-id", "lead-b", "--queue", "other", "--visibility-timeout", "1"
        ),
    }
    wait_for(lambda: WorkerRecord.objects.count() == 2, timeout=60)
    # Once both rows have beaten since the election settled, they agree with the database.
    wait_for(lambda: _leaders() == {current_leader("default", "default")}, timeout=60, interval=0.1)
    leader = current_leader("default", "default")
    assert leader in procs
    follower = (procs.keys() - {leader}).pop()
    assert "LEADER" in _field(_page(admin_client, leader), "leader")
    assert _field(_page(admin_client, follower), "leader").strip() == "no"

    # The leader stops: the other worker wins the next election, and its row says so.
    procs[leader].send_signal(signal.SIGTERM)
    assert procs[leader].wait(timeout=60) == 0
    wait_for(lambda: _leaders() == {follower}, timeout=60, interval=0.1)
    assert "LEADER" in _field(_page(admin_client, follower), "leader")


def test_a_silent_leader_is_shown_as_of_its_last_heartbeat(admin_client):
    """A state a test cannot wait for cheaply: a leader's row, silent for ten minutes."""
    now = timezone.now()
    worker_row(
        "gone-leader",
        silent_for=timedelta(minutes=10),
        queues=[],
        concurrency=2,
        started_at=now - timedelta(hours=3),
        leader_since=now - timedelta(hours=2),
        tasks_processed=12345,
    )
    page = _page(admin_client, "gone-leader")
    assert "STALE" in _field(page, "liveness")
    leader = _field(page, "leader")
    assert "LEADER" in leader and "as of its last heartbeat" in leader and "2 h ago" in leader
    assert _field(page, "version_shown").strip() == "unknown"
    assert _field(page, "processed").strip() == "12,345"
    assert _field(page, "uptime").strip() == "2 h 50 min (until its last heartbeat)"


def test_the_heartbeat_writes_the_counts_and_leadership_in_its_one_update():
    """No statement of their own: the row's one UPDATE per beat carries them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_tasks_plus.db.store import WorkerStatus

    now = timezone.now()
    worker_row("beating", queues=[])
    heartbeat = heartbeat_of(
        "beating",
        visibility_timeout=30,
        status=lambda: WorkerStatus(tasks_processed=5, tasks_failed=2, leader_since=now),
    )
    with CaptureQueriesContext(connection) as queries:
        heartbeat.beat()
    connection.close()  # the beat bounded this session's statements as a worker's
    table = WorkerRecord._meta.db_table
    writes = [q["sql"] for q in queries if table in q["sql"] and not q["sql"].startswith("SELECT")]
    assert len(writes) == 1 and writes[0].startswith("UPDATE")
    assert all(
        column in writes[0] for column in ("tasks_processed", "tasks_failed", "leader_since")
    )
    row = WorkerRecord.objects.get(worker_id="beating")
    assert (row.tasks_processed, row.tasks_failed, row.leader_since) == (5, 2, now)
