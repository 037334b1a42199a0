"""End to end: enqueue in the test, run real ``runtasks`` processes, read the outcome."""

from __future__ import annotations

import pytest
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import TaskRecord
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_success_records_return_value_and_timestamps(run_worker):
    result = tasks.add.enqueue(2, 3)
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_failure_keeps_one_error_per_attempt_then_dead_letters(run_worker):
    result = tasks.always_fails.enqueue("boom")
    assert run_worker("--burst").returncode == 0

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 3  # NO_WAIT allows three attempts
    assert all(e.exception_class_path == "builtins.ValueError" for e in result.errors)
    assert "ValueError: boom" in result.errors[-1].traceback
    assert len(result.worker_ids) == 3
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    record = TaskRecord.objects.get(pk=result.id)
    assert record.attempt == 3
    assert record.dead_letter_reason.startswith("gave up after 3 attempt(s)")
    assert [e["attempt"] for e in record.errors] == [1, 2, 3]


def test_context_attempt_counts_across_retries(run_worker):
    result = tasks.succeeds_on_third.enqueue()
    assert run_worker("--burst").returncode == 0

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == [3, 3, 2]  # the context sees the two earlier failures
    assert [e.traceback.strip().splitlines()[-1] for e in result.errors] == [
        "RuntimeError: attempt 1 fails",
        "RuntimeError: attempt 2 fails",
    ]


def test_deferral_does_not_spend_an_attempt(run_worker):
    result = tasks.defers_once.enqueue()
    assert run_worker("--burst").returncode == 0

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 1  # the deferred run did not count
    assert result.errors == []
    assert TaskRecord.objects.get(pk=result.id).attempt == 1


def test_abort_dead_letters_at_once(run_worker):
    result = tasks.aborts.enqueue()
    assert run_worker("--burst").returncode == 0

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1
    assert result.errors[0].exception_class_path == "django_tasks_plus.exceptions.Abort"
    assert TaskRecord.objects.get(pk=result.id).dead_letter_reason.endswith(
        "this payload can never work"
    )


def test_async_task_runs(run_worker):
    result = tasks.async_add.enqueue(20, 22)
    assert run_worker("--burst").returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_signals_are_sent_in_the_worker(run_worker, markers):
    ok = tasks.add.enqueue(1, 2)
    failed = tasks.aborts.enqueue()
    assert run_worker("--burst", "--concurrency", "1").returncode == 0

    lines = (markers / "signals.log").read_text().splitlines()
    assert f"started {ok.id} RUNNING attempt=1" in lines
    assert f"finished {ok.id} SUCCESSFUL in_except=False returned=int" in lines
    assert f"started {failed.id} RUNNING attempt=1" in lines
    # Django documents task_finished as sent from inside the except block on failure.
    assert f"finished {failed.id} FAILED in_except=True" in lines


def test_task_finished_sees_the_decoded_return_value(run_worker, markers):
    result = tasks.today.enqueue()
    assert run_worker("--burst").returncode == 0
    lines = (markers / "signals.log").read_text().splitlines()
    assert f"finished {result.id} SUCCESSFUL in_except=False returned=date" in lines


def test_priority_and_queue_selection(run_worker):
    low = tasks.add.using(priority=-10).enqueue(0, 1)
    high = tasks.add.using(priority=10).enqueue(0, 2)
    other = tasks.echo.enqueue("x")
    proc = run_worker("--burst", "--queue", "default", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr

    low.refresh()
    high.refresh()
    other.refresh()
    assert high.started_at < low.started_at
    assert other.status == TaskResultStatus.READY  # its queue was not served


def test_run_after_in_the_future_is_not_claimed(run_worker):
    later = tasks.add.using(run_after=timezone.now() + timezone.timedelta(hours=1)).enqueue(1, 1)
    assert run_worker("--burst").returncode == 0
    later.refresh()
    assert later.status == TaskResultStatus.READY
    assert later.worker_ids == []


def test_max_tasks_stops_the_worker(run_worker):
    results = [tasks.add.enqueue(i, i) for i in range(5)]
    proc = run_worker("--max-tasks", "2", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    statuses = []
    for result in results:
        result.refresh()
        statuses.append(result.status)
    assert statuses.count(TaskResultStatus.SUCCESSFUL) == 2
    assert statuses.count(TaskResultStatus.READY) == 3
