"""Leases, heartbeats, the reaper, fencing and graceful shutdown, with real processes."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus, task_backends
from django_tasks_plus.db.store import apply_transition, renew_leases
from django_tasks_plus.lifecycle import Succeeded, transition
from django_tasks_plus.models import TaskRecord, WorkerRecord
from django_tasks_plus.worker.heartbeat import Heartbeat
from django_tasks_plus.worker.reaper import reap_expired
from tests import tasks
from tests.conftest import claim_one, heartbeat_of, postgres_only, wait_for, worker_log, worker_row

pytestmark = pytest.mark.django_db(transaction=True)


def _row(result) -> TaskRecord:  # type: ignore[no-untyped-def]
    return TaskRecord.objects.get(pk=result.id)


def _lease_expired(result) -> bool:  # type: ignore[no-untyped-def]
    row = _row(result)
    return row.lease_expires_at is not None and row.lease_expires_at < timezone.now()


def test_killed_worker_task_is_finished_by_another(start_worker, run_worker, markers):
    result = tasks.slow_first_attempt.enqueue(60)
    victim = start_worker(
        "--worker-id", "victim", "--visibility-timeout", "1", "--concurrency", "1"
    )
    wait_for(lambda: (markers / f"started-{result.id}").exists())
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)

    wait_for(lambda: _lease_expired(result), timeout=10)
    proc = run_worker("--burst", "--worker-id", "rescuer", "--visibility-timeout", "1")
    assert proc.returncode == 0, proc.stderr

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2
    assert result.worker_ids == ["victim", "rescuer"]
    assert result.errors[0].exception_class_path == "django_tasks_plus.exceptions.LeaseExpired"
    assert "worker victim stopped renewing its lease" in result.errors[0].traceback


def test_heartbeat_keeps_a_long_task_leased(start_worker, run_worker, markers):
    result = tasks.slow_first_attempt.enqueue(3)
    owner = start_worker("--worker-id", "owner", "--visibility-timeout", "1", "--max-tasks", "1")
    wait_for(lambda: (markers / f"started-{result.id}").exists())
    # Three lease lengths pass while the task runs; other workers must keep their hands off.
    for _ in range(3):
        proc = run_worker("--burst", "--worker-id", "intruder", "--visibility-timeout", "1")
        assert proc.returncode == 0, proc.stderr
    owner.wait(timeout=30)
    assert owner.returncode == 0

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.worker_ids == ["owner"]
    assert result.errors == []


# SIGSTOP can land while the paused worker is inside one of SQLite's file locks (a write,
# a WAL checkpoint): every other process then waits on the file for ever, so on SQLite the
# result depended on where the pause landed (1 run in 3-7 failed in the new owner's first
# query). PostgreSQL's row locks and fencing are what this test is about.
@postgres_only
def test_paused_worker_cannot_overwrite_the_new_owner(start_worker, run_worker, markers, tmp_path):
    result = tasks.slow_first_attempt.enqueue(2)
    paused = start_worker("--worker-id", "paused", "--visibility-timeout", "1")
    wait_for(lambda: (markers / f"started-{result.id}").exists())
    os.killpg(paused.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _lease_expired(result), timeout=10)
        proc = run_worker("--burst", "--worker-id", "new-owner", "--visibility-timeout", "1")
        assert proc.returncode == 0, proc.stderr
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 2
    finally:
        os.killpg(paused.pid, signal.SIGCONT)
    # The paused worker wakes up, finishes attempt 1 and tries to report it.
    wait_for(lambda: "lease lost" in worker_log(tmp_path), timeout=15)
    paused.send_signal(signal.SIGTERM)
    paused.wait(timeout=30)

    result.refresh()
    assert result.return_value == 2  # still the new owner's outcome
    assert result.worker_ids == ["paused", "new-owner"]


def _due_now(result) -> None:  # type: ignore[no-untyped-def]
    """Skip a retry's backoff: make the task due at once."""
    TaskRecord.objects.filter(pk=result.id).update(run_after=timezone.now() - timedelta(minutes=1))


def test_fenced_writes_in_process():
    """A lease holder that was reaped loses every write; the new holder's outcome stays."""
    backend = task_backends["default"]
    result = tasks.add.enqueue(1, 2)

    first = claim_one("A", visibility_timeout=-1)  # lease already expired
    assert reap_expired(backend, timezone.now) == 1
    _due_now(result)
    second = claim_one("B")
    assert second.id == first.id
    assert second.attempt == 2
    now = timezone.now()

    lost = renew_leases("default", [(first.id, first.lease_token)], 300)
    assert lost == {(first.id, first.lease_token)}
    stale = transition(first, Succeeded(999), policy=backend.settings.retry, now=now)
    assert apply_transition("default", first, stale) is False
    assert _row(result).status == TaskResultStatus.RUNNING

    fresh = transition(second, Succeeded(3), policy=backend.settings.retry, now=now)
    assert apply_transition("default", second, fresh) is True
    assert apply_transition("default", first, stale) is False
    row = _row(result)
    assert (row.status, row.return_value, row.worker_ids) == ("SUCCESSFUL", 3, ["A", "B"])


def test_reaper_dead_letters_when_attempts_are_spent():
    backend = task_backends["default"]
    result = tasks.always_fails.enqueue("x")  # NO_WAIT: three attempts
    for attempt in (1, 2, 3):
        claimed = claim_one(f"w{attempt}", visibility_timeout=-1)
        assert claimed.attempt == attempt
        assert reap_expired(backend, timezone.now) == 1
    row = _row(result)
    assert row.status == TaskResultStatus.FAILED
    assert len(row.errors) == 3
    assert "gave up after 3 attempt(s)" in row.dead_letter_reason


def test_sigterm_finishes_running_task_and_releases_the_rest(start_worker, markers, tmp_path):
    results = [tasks.sleep_then_return.enqueue(1.5 + i / 100) for i in range(4)]
    worker = start_worker(
        "--worker-id", "graceful", "--queue", "slow", "--concurrency", "1", "--prefetch", "3"
    )
    wait_for(lambda: any(markers.glob("sleeping-*")))
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker_log(tmp_path)

    rows = [_row(r) for r in results]
    done = [r for r in rows if r.status == TaskResultStatus.SUCCESSFUL]
    released = [r for r in rows if r.status == TaskResultStatus.READY]
    assert len(done) == 1, worker_log(tmp_path)
    assert done[0].return_value == 1.5
    assert len(released) == 3
    for row in released:
        assert row.attempt == 0
        assert row.worker_ids == []
        assert row.lease_token is None
        assert row.started_at is None  # the claim was handed back before it ran
    assert not WorkerRecord.objects.filter(worker_id="graceful").exists()


def test_second_signal_exits_at_once(start_worker, markers):
    result = tasks.sleep_then_return.enqueue(30.0)
    worker = start_worker("--worker-id", "impatient", "--queue", "slow")
    wait_for(lambda: (markers / "sleeping-30.0").exists())
    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: "finishing running tasks" in worker_log(markers), timeout=10)
    time.sleep(0.6)  # signals closer together count as one delivery
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 1
    # The lease is left to expire; the reaper will hand the task to another worker.
    assert _row(result).status == TaskResultStatus.RUNNING


def test_the_reaper_spares_the_leases_its_own_worker_holds():
    """A worker's own leases, expired in a stall but still running or with their outcome
    being written, are not its reaper's to return; and the spared ones do not take the
    places of the others under the round's limit."""
    backend = task_backends["default"]
    mine_result, other_result = tasks.add.enqueue(1, 2), tasks.add.enqueue(3, 4)
    mine = claim_one("me", visibility_timeout=-1)
    other = claim_one("dead", visibility_timeout=-1)
    assert {mine.id, other.id} == {mine_result.id, other_result.id}
    assert reap_expired(backend, timezone.now, limit=1, spare={mine.lease}) == 1
    assert TaskRecord.objects.get(pk=mine.id).status == TaskResultStatus.RUNNING
    assert TaskRecord.objects.get(pk=other.id).status == TaskResultStatus.READY
    # The outcome the stall held up lands, fenced by its token as ever.
    outcome = transition(mine, Succeeded(3), policy=backend.settings.retry, now=timezone.now())
    assert apply_transition("default", mine, outcome) is True
    assert TaskRecord.objects.get(pk=mine.id).status == TaskResultStatus.SUCCESSFUL


def _heartbeat(worker_id: str) -> Heartbeat:
    """A new worker row ``worker_id`` and its heartbeat, with a three-second lease: a
    round a second, and half a second of slack."""
    worker_row(worker_id, queues=[], visibility_timeout=3)
    return heartbeat_of(worker_id, visibility_timeout=3)


def test_a_slow_start_returns_no_lease_and_defers_the_heartbeats_reaping():
    """The worker's start took longer than the slack (its registration waited on a
    stall): the reap before its first claim returns nothing, and its heartbeat's first
    rounds leave the expired leases alone too, for a lease's time."""
    result = tasks.add.enqueue(1, 2)
    claim_one("holder", visibility_timeout=-1)
    heartbeat = _heartbeat("slow-start")
    try:
        heartbeat.reap_at_start(time.monotonic() - 2.0)
        assert heartbeat.gate.deferring
        heartbeat.beat()
        assert _row(result).status == TaskResultStatus.RUNNING
        heartbeat.reap_at_start(time.monotonic())  # a prompt start does return it
        assert _row(result).status == TaskResultStatus.READY
    finally:
        connection.close()  # the beat bounded this session's statements as a worker's


def test_a_heartbeat_whose_first_round_waited_through_a_stall_defers_reaping():
    """The heartbeat's first round waits for its turn on the session the worker's periodic
    services share, held meanwhile (by a service stuck behind a stall, in the chaos run
    the election on SQLite), for longer than an interval and its slack. That round was
    held up like any later one: it leaves an expired lease alone, since its holder's
    renewal waited on the same stall, and returns it only a lease's time later (before:
    a first round had no time to be late against, and it took the live task)."""
    from django_tasks_plus.worker.sessions import SharedSession

    result = tasks.add.enqueue(1, 2)
    claim_one("holder", visibility_timeout=-1)  # expired: the holder's renewal is held up
    heartbeat = _heartbeat("late")
    heartbeat.session = session = SharedSession("default", "periodic services")
    try:
        with session.turn():  # another service's turn, stuck behind the stall
            heartbeat.start()
            time.sleep(heartbeat.interval + heartbeat.gate.slack + 1.0)
        wait_for(lambda: heartbeat.gate.deferring, timeout=5)
        assert _row(result).status == TaskResultStatus.RUNNING
        wait_for(lambda: _row(result).status == TaskResultStatus.READY, timeout=10)
    finally:
        heartbeat.stop()
        heartbeat.join(10)
        session.close()
