"""Lifecycle events (``django_tasks_plus.events``): enqueue-side events in-process, worker
events from real ``runtasks`` processes (a subscriber in ``tests/tasks.py`` writes them to
the file named by ``DTP_EVENT_LOG``), failure isolation and the cost of nobody listening."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction  # noqa: F401 (the postgres_only skipif reads connection)
from django.utils import timezone

from django_tasks_plus import cancel, discard, enqueue_many, events, redrive
from django_tasks_plus.compat import TaskResultStatus, task_backends, task_enqueued
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.reaper import reap_expired
from tests import tasks
from tests.conftest import claim_one, postgres_only, runtasks_command, wait_for, worker_env
from tests.test_leases import _lease_expired

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_metrics(settings):  # type: ignore[no-untyped-def]
    """The metrics aggregator subscribes at startup (docs/metrics.md); these tests count
    every subscriber and every event built, so they run with metrics off."""
    default = settings.TASKS["default"]
    options = {**default.get("OPTIONS", {}), "METRICS": {"ENABLED": False}}
    settings.TASKS = {**settings.TASKS, "default": {**default, "OPTIONS": options}}


class Recorder(list):  # type: ignore[type-arg]
    """A subscriber that keeps what it receives."""

    def __call__(self, event: events.Event) -> None:
        self.append(event)

    def names(self) -> list[str]:
        return [event.name for event in self]


# -- subscribing ------------------------------------------------------------------------------


def test_unknown_event_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"'task.enqueud'.*task\.enqueued"):
        events.subscribe(Recorder(), "task.enqueud")
    assert not events.listened("task.enqueud")


def test_subscribe_unsubscribe_and_the_context_manager():
    recorder = Recorder()
    assert not events.listened(events.TASK_ENQUEUED)
    with events.subscribed(recorder, events.TASK_ENQUEUED):
        events.subscribe(recorder, events.TASK_ENQUEUED)  # twice: still one delivery
        assert events.listened(events.TASK_ENQUEUED)
        assert not events.listened(events.TASK_STARTED)
        tasks.add.enqueue(1, 2)
    assert not events.listened(events.TASK_ENQUEUED)
    tasks.add.enqueue(3, 4)
    assert recorder.names() == [events.TASK_ENQUEUED]

    everything = events.subscribe(Recorder())  # no names: every event, reserved ones too
    try:
        assert all(events.listened(name) for name in events.NAMES)
    finally:
        events.unsubscribe(everything)
    assert not any(events.listened(name) for name in events.NAMES)


def test_handlers_are_told_apart_by_identity_and_bound_methods_by_their_object():
    first, second = Recorder(), Recorder()  # equal (two empty lists), yet two handlers
    other: list[events.Event] = []
    with events.subscribed(first, events.TASK_ENQUEUED):
        events.subscribe(second, events.TASK_ENQUEUED)
        events.subscribe(other.append, events.TASK_ENQUEUED)
        events.unsubscribe(other.extend, events.TASK_ENQUEUED)  # not subscribed: no effect
        events.unsubscribe(second, events.TASK_ENQUEUED)
        tasks.add.enqueue(1, 2)
        events.unsubscribe(other.append, events.TASK_ENQUEUED)  # a new bound object, same method
        tasks.add.enqueue(3, 4)
    assert len(first) == 2
    assert second == []
    assert len(other) == 1


# -- enqueue side ---------------------------------------------------------------------------


def test_enqueue_emits_once_per_call_after_commit_and_never_on_rollback():
    recorder = Recorder()
    with events.subscribed(recorder, events.TASK_ENQUEUED):
        with transaction.atomic():
            single = tasks.add.enqueue(1, 2)
            assert recorder == []  # not before the row exists for everyone else
        many = enqueue_many(tasks.echo, [((n,), {}) for n in range(3)])
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(5, 6)
            raise RuntimeError("roll back")

    assert recorder.names() == [events.TASK_ENQUEUED] * 2
    first, batch = recorder
    assert first.measurements == {"count": 1}
    assert first.labels["task_ids"] == (single.id,)
    assert first.labels["task_path"] == tasks.add.module_path
    assert first.labels["queue"] == "default"
    assert first.labels["backend"] == "default"
    assert batch.measurements == {"count": 3}
    assert batch.labels["task_ids"] == tuple(result.id for result in many)
    assert batch.labels["queue"] == "other"
    assert batch.labels["priority"] == 5


def test_a_held_dedup_key_emits_deduplicated_and_not_enqueued():
    recorder = Recorder()
    with events.subscribed(recorder, events.TASK_ENQUEUED, events.TASK_DEDUPLICATED):
        first = tasks.add.using(dedup_key="digest:7").enqueue(1, 2)
        second = tasks.add.using(dedup_key="digest:7").enqueue(3, 4)

    assert second.id == first.id
    assert TaskRecord.objects.count() == 1
    assert recorder.names() == [events.TASK_ENQUEUED, events.TASK_DEDUPLICATED]
    assert recorder[0].labels["dedup_key"] == "digest:7"
    dedup = recorder[1]
    assert dedup.measurements == {"count": 1}
    assert dedup.labels["dedup_key"] == "digest:7"
    assert dedup.labels["held_by"] == (first.id,)


def test_cancel_redrive_and_discard_emit_their_events():
    ready = tasks.add.enqueue(1, 2)
    running = tasks.add.enqueue(3, 4)
    TaskRecord.objects.filter(pk=running.id).update(status=TaskResultStatus.RUNNING)
    blocked = tasks.add.enqueue(5, 6)
    TaskRecord.objects.filter(pk=blocked.id).update(
        status=TaskResultStatus.FAILED, ordering_blocked=True, finished_at=timezone.now()
    )
    recorder = Recorder()
    with events.subscribed(recorder):
        assert cancel(ready).outcome == "cancelled"
        assert cancel(running).outcome == "cancel_requested"
        assert discard(blocked) is True
        assert discard(blocked) is False  # nothing left to release: no event
        assert redrive(ready) is True  # the cancelled task is FAILED: it can run again
        assert redrive(ready) is False  # READY now: no event

    assert [(event.name, event.labels["task_id"]) for event in recorder] == [
        (events.TASK_CANCELLED, ready.id),
        (events.TASK_CANCEL_REQUESTED, running.id),
        (events.TASK_DISCARDED, blocked.id),
        (events.TASK_REDRIVEN, ready.id),
    ]
    assert {event.labels["task_path"] for event in recorder} == {tasks.add.module_path}


def test_an_operation_rolled_back_emits_nothing():
    ready = tasks.add.enqueue(1, 2)
    recorder = Recorder()
    with events.subscribed(recorder), pytest.raises(RuntimeError), transaction.atomic():
        cancel(ready)
        raise RuntimeError("roll back")
    assert recorder == []
    assert TaskRecord.objects.get(pk=ready.id).status == TaskResultStatus.READY


def test_a_raising_subscriber_is_logged_and_changes_nothing(caplog):
    def explode(event: events.Event) -> None:
        raise RuntimeError("subscriber bug")

    after = Recorder()
    sent: list[str] = []

    def on_enqueued(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(task_result.id)

    task_enqueued.connect(on_enqueued)
    try:
        with (
            caplog.at_level(logging.ERROR, logger="django_tasks_plus.events"),
            events.subscribed(explode),
            events.subscribed(after),
        ):
            result = tasks.add.enqueue(1, 2)
            duplicate = tasks.add.using(dedup_key="k").enqueue(1, 2)
            assert cancel(duplicate).outcome == "cancelled"
    finally:
        task_enqueued.disconnect(on_enqueued)

    assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.READY
    assert TaskRecord.objects.get(pk=duplicate.id).status == TaskResultStatus.FAILED
    assert sent == [result.id, duplicate.id]  # Django's signal, exactly as without events
    assert after.names() == [events.TASK_ENQUEUED, events.TASK_ENQUEUED, events.TASK_CANCELLED]
    failures = [r for r in caplog.records if r.name == "django_tasks_plus.events"]
    assert [r.getMessage().split(" failed on ")[1] for r in failures] == [
        "task.enqueued; ignored.",
        "task.enqueued; ignored.",
        "task.cancelled; ignored.",
    ]
    assert all(r.exc_info and "subscriber bug" in str(r.exc_info[1]) for r in failures)


def test_nothing_is_built_when_nobody_listens(monkeypatch):
    built: list[str] = []
    real_event = events.Event

    def counting_event(name: str, *args: Any) -> events.Event:
        built.append(name)
        return real_event(name, *args)

    monkeypatch.setattr(events, "Event", counting_event)
    unrelated = Recorder()
    # A subscriber to one name must not make the others build anything either.
    with events.subscribed(unrelated, events.TASK_RELEASED):  # emitted by nothing yet
        results = [
            tasks.add.enqueue(1, 2),
            tasks.add.using(dedup_key="d").enqueue(1, 2),
            tasks.add.using(dedup_key="d").enqueue(1, 2),
            tasks.always_fails.enqueue("boom"),
            tasks.defers_once.enqueue(),
        ]
        cancel(results[1])
        redrive(results[1])
        call_command("runtasks", burst=True, concurrency=2, verbosity=0)
    assert built == []
    assert unrelated == []
    assert TaskRecord.objects.get(pk=results[0].id).status == TaskResultStatus.SUCCESSFUL

    # The same run with a subscriber does build them (so the count above can fail).
    with events.subscribed(Recorder(), events.TASK_ENQUEUED, events.TASK_SUCCEEDED):
        tasks.add.enqueue(2, 2)
        call_command("runtasks", burst=True, concurrency=2, verbosity=0)
    assert built == [events.TASK_ENQUEUED, events.TASK_SUCCEEDED]


def test_the_reaper_emits_reaped_then_the_attempts_outcome():
    result = tasks.add.enqueue(1, 2)
    claim_one("gone", visibility_timeout=-1)  # a lease that has already expired
    recorder = Recorder()
    with events.subscribed(recorder):
        assert reap_expired(task_backends["default"], timezone.now) == 1

    assert recorder.names() == [
        events.TASK_REAPED,
        events.TASK_ATTEMPT_FAILED,
        events.TASK_RETRY_SCHEDULED,
    ]
    reaped, failed, retry = recorder
    assert reaped.labels["task_id"] == result.id
    assert reaped.labels["worker_id"] == "gone"  # the worker that stopped renewing
    assert reaped.labels["status"] == TaskResultStatus.READY
    assert failed.labels["exception"] == "django_tasks_plus.exceptions.LeaseExpired"
    assert "run_time" not in failed.measurements  # the reaper cannot know it
    assert retry.measurements["attempt"] == 1
    assert retry.measurements["delay"] >= 0


# -- worker side, from real runtasks processes ----------------------------------------------


def _run_worker(tmp_path: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = worker_env(tmp_path)
    env["DTP_EVENT_LOG"] = str(tmp_path / "events.jsonl")
    env.update(extra_env)
    return subprocess.run(
        runtasks_command(*args),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _start_worker(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = worker_env(tmp_path)
    env["DTP_EVENT_LOG"] = str(tmp_path / "events.jsonl")
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        runtasks_command(*args),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _logged_events(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _by_task(logged: list[dict[str, Any]], task_id: str) -> list[str]:
    return [event["name"] for event in logged if event["metadata"].get("task_id") == task_id]


def test_a_worker_emits_each_step_with_its_measurements(tmp_path):
    ok = tasks.add.enqueue(2, 3)
    dead = tasks.always_fails.enqueue("boom")  # three attempts, no wait between them
    deferred = tasks.defers_once.enqueue()

    proc = _run_worker(tmp_path, "--burst", "--worker-id", "events-1", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    logged = _logged_events(tmp_path)

    assert logged[0]["name"] == events.WORKER_STARTED
    assert logged[0]["metadata"]["worker_id"] == "events-1"
    assert logged[0]["measurements"] == {"concurrency": 2}
    assert logged[-1]["name"] == events.WORKER_STOPPED
    assert logged[-1]["measurements"]["claimed"] == 1 + 3 + 2
    assert logged[-1]["measurements"]["abandoned"] == 0
    claimed = [event for event in logged if event["name"] == events.TASKS_CLAIMED]
    assert sum(event["measurements"]["count"] for event in claimed) == 6
    assert all(event["measurements"]["duration"] >= 0 for event in claimed)
    assert not any(event["name"] == events.TASK_ENQUEUED for event in logged)  # other process

    assert _by_task(logged, ok.id) == [events.TASK_STARTED, events.TASK_SUCCEEDED]
    # A retried task can be claimed and started again as soon as the outcome commits,
    # which may be before the outcome writer emits that outcome: order by attempt.
    dead_events = [e for e in logged if e["metadata"].get("task_id") == dead.id]
    dead_events.sort(key=lambda e: e["measurements"]["attempt"])
    assert [e["name"] for e in dead_events] == [
        events.TASK_STARTED,
        events.TASK_ATTEMPT_FAILED,
        events.TASK_RETRY_SCHEDULED,
        events.TASK_STARTED,
        events.TASK_ATTEMPT_FAILED,
        events.TASK_RETRY_SCHEDULED,
        events.TASK_STARTED,
        events.TASK_ATTEMPT_FAILED,
        events.TASK_DEAD_LETTERED,
    ]
    # A deferral does not spend an attempt, so both runs are attempt 1.
    deferred_names = _by_task(logged, deferred.id)
    assert deferred_names[0] == events.TASK_STARTED
    assert deferred_names.count(events.TASK_STARTED) == 2
    assert [n for n in deferred_names if n != events.TASK_STARTED] == [
        events.TASK_DEFERRED,
        events.TASK_SUCCEEDED,
    ]

    def only(task_id: str, name: str) -> list[dict[str, Any]]:
        return [e for e in logged if e["name"] == name and e["metadata"].get("task_id") == task_id]

    [started] = only(ok.id, events.TASK_STARTED)
    assert started["measurements"]["attempt"] == 1
    assert started["measurements"]["queue_time"] >= 0
    assert started["metadata"]["worker_id"] == "events-1"
    assert started["metadata"]["task_path"] == tasks.add.module_path
    [succeeded] = only(ok.id, events.TASK_SUCCEEDED)
    assert succeeded["measurements"]["run_time"] > 0
    assert [e["measurements"]["attempt"] for e in only(dead.id, events.TASK_ATTEMPT_FAILED)] == [
        1,
        2,
        3,
    ]
    [dead_lettered] = only(dead.id, events.TASK_DEAD_LETTERED)
    assert dead_lettered["metadata"]["exception"] == "builtins.ValueError"
    assert dead_lettered["metadata"]["reason"].startswith("gave up after 3 attempt(s)")

    # The documented threads: claims and the worker's own events on the main loop,
    # task.started on the task's thread, outcomes on the outcome writer.
    threads = {
        name: {e["thread"] for e in logged if e["name"] == name}
        for name in (events.WORKER_STARTED, events.TASKS_CLAIMED, events.WORKER_STOPPED)
    }
    assert threads == {name: {"MainThread"} for name in threads}
    assert all(
        e["thread"].startswith("tasks-slot") for e in logged if e["name"] == events.TASK_STARTED
    )
    outcome_names = {events.TASK_SUCCEEDED, events.TASK_DEAD_LETTERED, events.TASK_DEFERRED}
    assert {e["thread"] for e in logged if e["name"] in outcome_names} == {"tasks-reporter"}


def test_a_raising_subscriber_in_the_worker_is_logged_and_changes_nothing(tmp_path):
    ok = tasks.add.enqueue(2, 3)
    dead = tasks.always_fails.enqueue("boom")

    proc = _run_worker(tmp_path, "--burst", DTP_EVENT_RAISE="1")
    assert proc.returncode == 0, proc.stderr

    ok.refresh()
    dead.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL
    assert ok.return_value == 5
    assert dead.status == TaskResultStatus.FAILED
    assert len(dead.errors) == 3
    # The subscriber after the raising one still heard everything.
    names = Counter(event["name"] for event in _logged_events(tmp_path))
    assert names[events.TASK_STARTED] == 4
    assert names[events.TASK_SUCCEEDED] == 1
    assert names[events.TASK_DEAD_LETTERED] == 1
    assert names[events.WORKER_STOPPED] == 1
    for name in (events.TASK_STARTED, events.TASK_SUCCEEDED, events.WORKER_STOPPED):
        assert f"failed on {name}; ignored." in proc.stderr
    assert "RuntimeError: subscriber exploded on task.started" in proc.stderr


# SIGSTOP can land while the paused worker is inside one of SQLite's file locks (a write,
# a WAL checkpoint): every other process then waits on the file for ever, so on SQLite the
# result depended on where the pause landed (1 run in 3-7 failed in the new owner's first
# query). PostgreSQL's row locks and fencing are what this test is about.
@postgres_only
def test_a_paused_worker_hears_that_its_lease_was_lost(tmp_path, run_worker, markers):
    result = tasks.slow_first_attempt.enqueue(30)
    paused = _start_worker(tmp_path, "--worker-id", "paused", "--visibility-timeout", "1")
    try:
        wait_for(lambda: (markers / f"started-{result.id}").exists())
        os.killpg(paused.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _lease_expired(result), timeout=10)
            proc = run_worker("--burst", "--worker-id", "new-owner", "--visibility-timeout", "1")
            assert proc.returncode == 0, proc.stderr
        finally:
            os.killpg(paused.pid, signal.SIGCONT)

        def lease_lost() -> list[dict[str, Any]]:
            logged = _logged_events(tmp_path)
            return [e for e in logged if e["name"] == events.TASK_LEASE_LOST]

        wait_for(lambda: bool(lease_lost()), timeout=15)
        [lost] = lease_lost()
    finally:
        os.killpg(paused.pid, signal.SIGKILL)
        paused.wait(timeout=10)
    assert lost["metadata"]["task_id"] == result.id
    assert lost["metadata"]["worker_id"] == "paused"
    assert lost["measurements"] == {"attempt": 1}
    assert lost["thread"] != "MainThread"  # the heartbeat's
    result.refresh()
    assert result.worker_ids == ["paused", "new-owner"]
    assert result.return_value == 2


def test_a_held_outcome_is_emitted_as_task_held_not_deferred():
    import datetime as dt
    import uuid

    from django_tasks_plus.lifecycle import ClaimedTask, Postponed, transition
    from django_tasks_plus.retry import no_retry

    now = timezone.now()
    claimed = ClaimedTask(
        id=str(uuid.uuid4()),
        task_path="tests.tasks.add",
        queue_name="default",
        priority=0,
        args=[1, 2],
        kwargs={},
        attempt=1,
        worker_ids=("w",),
        errors=(),
        enqueued_at=now,
        run_after=now,
        started_at=now,
        lease_token="t",
        claimed_at=now,
    )
    until = now + dt.timedelta(minutes=5)
    outcome = transition(claimed, Postponed(until, reason="breaker open"), policy=no_retry, now=now)
    seen: list[events.Event] = []
    with events.subscribed(seen.append, events.TASK_HELD, events.TASK_DEFERRED):
        events.emit_outcome(claimed, outcome, 0.01, timezone.now)
    assert [event.name for event in seen] == [events.TASK_HELD]
    assert seen[0].labels["reason"] == "breaker open"
    assert seen[0].labels["run_after"] == until


def test_an_in_process_worker_emits_its_leadership():
    from django_tasks_plus.worker.engine import Worker, WorkerConfig

    seen: list[str] = []
    with events.subscribed(
        lambda event: seen.append(event.name), events.LEADER_ELECTED, events.LEADER_LOST
    ):
        tasks.sleep_then_return.enqueue(1.0)  # keeps the burst run long enough to elect
        config = WorkerConfig.from_settings("default", burst=True, queues=("slow",))
        assert Worker(config).run() == 0
    assert seen == [events.LEADER_ELECTED, events.LEADER_LOST]
