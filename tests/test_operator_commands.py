"""Operator commands (``redrivetasks``, ``canceltasks``, ``runnow``) and the worker's
per-outcome log.

Dead letters come from real ``runtasks --burst`` runs; the commands run in-process with
``call_command`` (the prompt, through a real pseudo-terminal, in a subprocess).
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_tasks_plus.models import TaskRecord
from django_tasks_plus.selection import BadFilter, parse_moment
from tests import tasks
from tests.conftest import MANAGE, wait_for, worker_env, worker_log

pytestmark = pytest.mark.django_db(transaction=True)


def command(name: str, *args: str, **options: object) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


def row(task_id: str) -> TaskRecord:
    return TaskRecord.objects.get(pk=task_id)


@pytest.fixture
def dead(run_worker) -> dict[str, list[str]]:
    """Dead letters from a real worker: three ValueErrors, one RuntimeError; plus a success."""
    made = {
        "value": [tasks.always_fails.enqueue(f"bad input {n}").id for n in range(3)],
        "runtime": [tasks.dies_and_continues.enqueue(7).id],
        "ok": [tasks.add.enqueue(1, 2).id],
    }
    done = run_worker("--burst", "--queue", "*", "-v", "0")
    assert done.returncode == 0, done.stderr
    assert {row(i).status for i in made["value"] + made["runtime"]} == {"FAILED"}
    return made


# -- the worker's log at -v 1 ------------------------------------------------------------


def test_default_verbosity_logs_one_line_per_outcome(run_worker):
    ok = tasks.add.enqueue(2, 3)
    retried = tasks.succeeds_on_third.enqueue()
    doomed = tasks.always_fails.enqueue("no such user 42")
    aborted = tasks.aborts.enqueue()
    deferred = tasks.defers_once.enqueue()

    done = run_worker("--burst", "--queue", "*", "--concurrency", "1")
    assert done.returncode == 0, done.stderr
    log = done.stderr

    assert re.search(rf"Task {ok.id} tests.tasks.add succeeded in [\d.]+ ms \(attempt 1\)", log)
    retry = rf"Task {retried.id} tests.tasks.succeeds_on_third failed in [\d.]+ ms \(attempt %d\)"
    when = r", retry in [\d.]+ m?s at \d\d:\d\d:\d\d: RuntimeError: attempt %d fails"
    for attempt in (1, 2):
        assert re.search(retry % attempt + when % attempt, log), log
    assert re.search(rf"Task {retried.id} \S+ succeeded in [\d.]+ ms \(attempt 3\)", log)
    assert re.search(
        rf"Task {doomed.id} tests.tasks.always_fails dead-lettered after [\d.]+ ms "
        r"\(attempt 3\): gave up after 3 attempt\(s\); last error builtins.ValueError: "
        "no such user 42",
        log,
    ), log
    assert re.search(
        rf"Task {aborted.id} tests.tasks.aborts dead-lettered .*this payload can never work", log
    )
    assert re.search(
        rf"Task {deferred.id} tests.tasks.defers_once deferred in [\d.]+ m?s at "
        r"\d\d:\d\d:\d\d \(no attempt spent\)",
        log,
    ), log
    assert "READY in" not in log  # the old, uninformative retry line


def test_verbosity_zero_logs_no_outcomes(run_worker):
    tasks.add.enqueue(2, 3)
    tasks.always_fails.enqueue("x")
    done = run_worker("--burst", "--queue", "*", "-v", "0")
    assert done.returncode == 0, done.stderr
    assert "succeeded" not in done.stderr
    assert "dead-lettered" not in done.stderr


# -- redrivetasks ------------------------------------------------------------------------


def test_dry_run_counts_and_samples_without_changing_anything(dead):
    out = command("redrivetasks", "--task", "tests.tasks.always_fails", dry_run=True)
    assert out.startswith("Would redrive 3 tasks (dry run: nothing changed).")
    for task_id in dead["value"]:
        assert task_id in out
    assert "gave up after 3 attempt(s)" in out
    assert dead["runtime"][0] not in out
    assert {row(i).status for i in dead["value"]} == {"FAILED"}


def test_redrive_by_id_gives_a_fresh_budget_and_keeps_history(dead):
    task_id = dead["value"][0]
    before = row(task_id)
    out = command("redrivetasks", task_id)
    assert out.strip() == "Redriven 1 task."
    after = row(task_id)
    assert (after.status, after.attempt, after.dead_letter_reason) == ("READY", 0, "")
    assert after.finished_at is None
    assert after.errors == before.errors and len(after.errors) == 3
    assert after.worker_ids == before.worker_ids
    # The others were not touched.
    assert {row(i).status for i in dead["value"][1:] + dead["runtime"]} == {"FAILED"}


def test_redriven_task_runs_again(dead, run_worker):
    task_id = dead["runtime"][0]
    command("redrivetasks", task_id)
    done = run_worker("--burst", "--queue", "*")
    assert done.returncode == 0, done.stderr
    again = row(task_id)
    assert again.status == "FAILED" and again.attempt == 1  # one fresh attempt, not two
    assert len(again.errors) == 2  # the first run's error kept, the new one added
    assert f"Task {task_id} tests.tasks.dies_and_continues dead-lettered" in done.stderr


def test_redrive_by_filter_needs_confirmation_when_not_interactive(dead):
    with pytest.raises(CommandError, match=r"Redrive 3 tasks matching .*Pass --yes"):
        command("redrivetasks", "--queue", "default", "--error", "ValueError")
    assert {row(i).status for i in dead["value"]} == {"FAILED"}
    out = command("redrivetasks", "--queue", "default", "--error", "ValueError", yes=True)
    assert out.strip() == "Redriven 3 tasks."
    assert {row(i).status for i in dead["value"]} == {"READY"}
    assert row(dead["runtime"][0]).status == "FAILED"


def test_filters_select_exactly_the_matching_rows(dead):
    runtime = dead["runtime"][0]
    # One match needs no confirmation.
    out = command("redrivetasks", "--error", "builtins.RuntimeError")
    assert out.strip() == "Redriven 1 task."
    assert row(runtime).status == "READY"
    with pytest.raises(CommandError, match=r"No FAILED task matches .*--error KeyError"):
        command("redrivetasks", "--error", "KeyError")
    out = command(
        "redrivetasks", "--reason-contains", "BAD INPUT 1", "--finished-after", "1h", yes=True
    )
    assert out.strip() == "Redriven 1 task."
    assert row(dead["value"][1]).status == "READY"
    with pytest.raises(CommandError, match="No FAILED task matches"):
        command("redrivetasks", "--finished-before", "2000-01-01")
    out = command("redrivetasks", all=True, yes=True)
    assert out.strip() == "Redriven 2 tasks."


def test_redrive_reports_tasks_that_are_not_dead(dead):
    ok = dead["ok"][0]
    with pytest.raises(CommandError, match=rf"Redriven 0 tasks\. Skipped 1 not FAILED: {ok} "):
        command("redrivetasks", ok)
    out = command("redrivetasks", ok, dead["value"][0])
    assert out.strip() == f"Redriven 1 task. Skipped 1 not FAILED: {ok} (SUCCESSFUL)."


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        ((), {}, "Which tasks? Give task ids, filters"),
        (("nope",), {}, "'nope' is not a task id"),
        (("0b5f8a3e-1111-4222-8333-944455556666",), {}, "No task with id 0b5f8a3e-1111"),
        (("0b5f8a3e-1111-4222-8333-944455556666",), {"queues": ["default"]}, "not both"),
        ((), {"all": True, "queues": ["default"]}, "leave the other filters out"),
        ((), {"finished_before": "yesterday-ish"}, "is not a time: give an ISO date"),
        ((), {"all": True, "backend": "nope"}, "Unknown task backend 'nope'"),
    ],
)
def test_mistakes_are_clear_command_errors(args, options, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        command("redrivetasks", *args, **options)


def test_moments_parse_as_dates_times_and_ages():
    now = timezone.now()
    assert parse_moment("2h", now=now) == now - timedelta(hours=2)
    assert parse_moment("30min", now=now) == now - timedelta(minutes=30)
    assert parse_moment("2026-05-01").isoformat().startswith("2026-05-01T00:00:00")
    assert parse_moment("2026-05-01T12:30+02:00").utcoffset() == timedelta(hours=2)
    with pytest.raises(BadFilter):
        parse_moment("soon")


def test_command_line_exit_status_and_prompt(dead, tmp_path: Path):
    """A real ``manage.py redrivetasks``: an error exits 1 on one line; at a terminal, a
    filter matching several tasks asks first and acts on "y"."""
    env = worker_env(tmp_path)
    failed = subprocess.run(
        [sys.executable, str(MANAGE), "redrivetasks", "not-an-id"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        "CommandError: 'not-an-id' is not a task id (a UUID such as the admin shows)."
    )

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(MANAGE), "redrivetasks", "--task", "tests.tasks.always_fails"],
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        if select.select([leader], [], [], 0.5)[0]:
            seen += os.read(leader, 4096)
    assert b"Redrive 3 tasks matching --backend default --task tests.tasks.always_fails?" in seen
    os.write(leader, b"y\n")
    assert proc.wait(timeout=60) == 0
    while select.select([leader], [], [], 0.5)[0]:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert b"Redriven 3 tasks." in seen
    assert {row(i).status for i in dead["value"]} == {"READY"}


# -- canceltasks -------------------------------------------------------------------------


def test_cancel_waiting_tasks_by_filter():
    emails = [tasks.echo.using(queue_name="emails").enqueue(n).id for n in range(3)]
    other = tasks.echo.enqueue("stays").id
    out = command("canceltasks", "--queue", "emails", dry_run=True)
    assert out.startswith("Would cancel 3 tasks")
    out = command("canceltasks", "--queue", "emails", yes=True)
    assert out.strip() == "Cancelled 3 waiting tasks."
    for task_id in emails:
        cancelled = row(task_id)
        assert (cancelled.status, cancelled.dead_letter_reason) == ("FAILED", "cancelled")
    assert row(other).status == "READY"
    with pytest.raises(CommandError, match="No READY or RUNNING task matches"):
        command("canceltasks", "--queue", "emails", yes=True)
    with pytest.raises(CommandError, match=rf"Skipped 1 already finished: {emails[0]} \(FAILED\)"):
        command("canceltasks", emails[0])


def test_cancel_asks_a_running_task_to_stop(start_worker, tmp_path: Path):
    running = tasks.waits_for_cancel.enqueue()
    start_worker("--queue", "slow", "--concurrency", "1")
    wait_for(lambda: (tmp_path / f"waiting-{running.id}").exists(), timeout=60)
    out = command("canceltasks", "--queue", "slow", "--status", "RUNNING")
    assert out.strip() == "Cancelled 0 waiting tasks; asked 1 running task to stop."
    wait_for(lambda: row(running.id).status == "FAILED", timeout=60)
    assert "stopped on request" in row(running.id).dead_letter_reason
    wait_for(
        lambda: (
            f"Task {running.id} tests.tasks.waits_for_cancel dead-lettered" in worker_log(tmp_path)
        )
    )


# -- runnow -------------------------------------------------------------------------------


def test_run_now_makes_waiting_tasks_due_and_the_worker_runs_them(run_worker):
    """A retry an hour away and a scheduled task run now; a due task and one a worker
    claimed are skipped, saying why."""
    later = timezone.now() + timedelta(hours=1)
    retrying = tasks.add.enqueue(1, 2).id
    TaskRecord.objects.filter(pk=retrying).update(attempt=1, run_after=later)
    scheduled = tasks.add.using(run_after=later).enqueue(3, 4).id
    due = tasks.add.enqueue(5, 6).id
    out = command("runnow", "--queue", "default", dry_run=True)
    assert out.startswith("Would run now 3 tasks")
    assert row(retrying).run_after == later  # a dry run changes nothing
    out = command("runnow", retrying, scheduled, due)
    assert out.strip() == (
        f"Made 2 waiting tasks due now. Skipped 1 not waiting for their time: {due} (not waiting)."
    )
    assert all(row(i).run_after <= timezone.now() for i in (retrying, scheduled))
    assert run_worker("--burst", "-v", "0").returncode == 0
    assert {row(i).status for i in (retrying, scheduled, due)} == {"SUCCESSFUL"}
    claimed = tasks.add.using(run_after=later).enqueue(7, 8).id
    TaskRecord.objects.filter(pk=claimed).update(status="RUNNING")
    with pytest.raises(CommandError, match=rf"Skipped 1 .*: {claimed} \(RUNNING\)"):
        command("runnow", claimed)


def test_durations_read_naturally():
    from django_tasks_plus.durations import duration

    assert [duration(s) for s in (0.42, 9.96, 30, 59.6, 250, 3600, 7500, 90061)] == [
        "420 ms",
        "10.0 s",
        "30 s",
        "1 min",
        "4 min 10 s",
        "1 h",
        "2 h 5 min",
        "1 d 1 h",
    ]
