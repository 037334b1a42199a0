"""Times from user code past the horizon, and the worker's bookkeeping under hostile values.

One bound (``timebounds.HORIZON``) is checked where each time is created: enqueue's
``run_after``, ``TaskDeferred``, a middleware's ``Hold``, a retry policy's delay, the
backoff's and a breaker's durations, ``dedup_ttl``, ``timeout``; all raise
``TimeOutOfRange``. Real workers then meet such times (and a time that cannot even be
formatted) next to ordinary tasks: the bad task fails alone, the others run exactly
once, the worker keeps running and every result can be read back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.db import DataError
from django.utils import timezone as django_timezone

from django_tasks_plus import (
    HORIZON,
    Breaker,
    Hold,
    InvalidBackendOptions,
    InvalidTaskOptions,
    TaskDeferred,
    TimeOutOfRange,
    exponential_backoff,
)
from django_tasks_plus.breaker import MAX_DURATION
from django_tasks_plus.compat import TaskResultStatus, task_backends
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.db.completions import apply_outcome as completions_apply_outcome
from django_tasks_plus.definition import validate_task_options
from django_tasks_plus.lifecycle import (
    ClaimedTask,
    Failed,
    Succeeded,
    Transition,
    deferred_until,
    transition,
)
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.retry import next_delay
from django_tasks_plus.worker import execution, reaper
from django_tasks_plus.worker.execution import TaskRunner
from django_tasks_plus.worker.reporter import Reporter
from django_tasks_plus.worker.tasklog import describe_outcome
from tests import tasks
from tests.conftest import claim_tasks, runtasks_command, worker_env

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _claimed(task_id: str) -> ClaimedTask:
    """A first attempt of ``tests.tasks.add``, claimed at ``NOW`` by worker w1."""
    return ClaimedTask(
        id=task_id,
        task_path="tests.tasks.add",
        queue_name="default",
        priority=0,
        args=[],
        kwargs={},
        attempt=1,
        worker_ids=("w1",),
        errors=(),
        enqueued_at=NOW,
        run_after=NOW,
        started_at=NOW,
        lease_token="token",
    )


SECOND = timedelta(seconds=1)
TIME_OUT_OF_RANGE = "django_tasks_plus.exceptions.TimeOutOfRange"
# Late on 9999-12-31 at UTC-5: year 10000 by UTC, which psycopg cannot read back.
YEAR_10000_IN_UTC = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))


def _breaker(**options: Any) -> Breaker:
    return Breaker(key=lambda *args, **kwargs: "host", **options)


def _failing_policy(delay: Any) -> Callable[..., Any]:
    def policy(attempt: int, elapsed: timedelta, exc: BaseException) -> Any:
        return delay

    return policy


# -- every source of a time refuses one past the horizon (pure) ----------------------------

SOURCES: dict[str, tuple[Callable[[], object], str]] = {
    "TaskDeferred run_after 9999": (
        lambda: TaskDeferred(run_after=tasks.LAST_MOMENT),
        "TaskDeferred run_after",
    ),
    "TaskDeferred delay timedelta.max": (
        lambda: TaskDeferred(delay=timedelta.max),
        "TaskDeferred delay",
    ),
    "TaskDeferred delay 1e300 s": (lambda: TaskDeferred(delay=1e300), "TaskDeferred delay"),
    "TaskDeferred delay inf": (lambda: TaskDeferred(delay=math.inf), "TaskDeferred delay"),
    "TaskDeferred delay past horizon": (
        lambda: TaskDeferred(delay=HORIZON + SECOND),
        "TaskDeferred delay",
    ),
    "Hold until 9999": (lambda: Hold(until=tasks.LAST_MOMENT), "Hold until"),
    "Hold until year 10000 by UTC": (lambda: Hold(until=YEAR_10000_IN_UTC), "Hold until"),
    "Hold delay timedelta.max": (lambda: Hold(delay=timedelta.max), "Hold delay"),
    "Hold delay nan": (lambda: Hold(delay=math.nan), "Hold delay"),
    "enqueue run_after": (
        lambda: validate_task_options(tasks.add.using(run_after=tasks.LAST_MOMENT)),
        "tests.tasks.add: run_after",
    ),
    "using dedup_ttl": (
        lambda: validate_task_options(tasks.add.using(dedup_key="k", dedup_ttl=HORIZON * 2)),
        "tests.tasks.add: dedup_ttl",
    ),
    "task timeout": (
        lambda: validate_task_options(dataclasses.replace(tasks.add, timeout=1e12)),
        "tests.tasks.add: timeout",
    ),
    "backoff max_delay": (
        lambda: exponential_backoff(max_delay=HORIZON + SECOND),
        "max_delay",
    ),
    "backoff initial_delay": (lambda: exponential_backoff(initial_delay=1e12), "initial_delay"),
    "breaker recovery_delay": (
        lambda: _breaker(recovery_delay=HORIZON + SECOND),
        "Breaker recovery_delay",
    ),
    "breaker held_ttl": (lambda: _breaker(held_ttl=1e20), "Breaker held_ttl"),
    "retry policy answer": (
        lambda: next_delay(
            _failing_policy(timedelta(days=999_999_999)), 1, timedelta(0), ValueError()
        ),
        "the delay returned by retry policy",
    ),
}


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_of_a_time_refuses_one_past_the_horizon(source):
    make, field = SOURCES[source]
    with pytest.raises(TimeOutOfRange) as info:
        make()
    refused = info.value
    # One error family: a bad task option (InvalidTask) and a bad value (ValueError).
    assert isinstance(refused, InvalidTaskOptions)
    assert isinstance(refused, ValueError)
    assert refused.field.startswith(field)
    assert "3650 days" in str(refused)


def test_every_source_accepts_the_horizon_itself():
    assert TaskDeferred(delay=HORIZON).delay == HORIZON
    assert Hold(delay=HORIZON).delay == HORIZON
    assert exponential_backoff(max_delay=HORIZON).max_delay == HORIZON
    assert _breaker(recovery_delay=HORIZON).recovery == HORIZON
    assert next_delay(_failing_policy(HORIZON), 1, timedelta(0), ValueError()) == HORIZON
    assert MAX_DURATION is HORIZON  # the breaker's bound is the same one
    soon = django_timezone.now() + HORIZON - timedelta(days=1)
    assert TaskDeferred(run_after=soon).run_after == soon
    assert Hold(until=soon).until == soon


def test_settings_durations_are_held_to_the_same_horizon():
    entry = {"BACKEND": "django_tasks_plus.backend.DatabaseBackend", "OPTIONS": {"DEDUP_TTL": 1e12}}
    with pytest.raises(InvalidBackendOptions, match=r"\['DEDUP_TTL'\] must be at most 3650 days"):
        parse_settings("default", entry)


def test_a_retry_policy_answering_past_the_horizon_dead_letters_the_task():
    """Today's main adds the answer to "now" outside the policy's guard: OverflowError on
    the worker's thread, and the task's lease runs out to run it again and again."""
    task = _claimed(str(uuid.uuid4()))
    policy = _failing_policy(timedelta(days=999_999_999))
    outcome = transition(task, Failed(ValueError("boom")), policy=policy, now=NOW)
    assert outcome.status == TaskResultStatus.FAILED
    assert outcome.values["dead_letter_reason"].startswith(
        "retry policy failed: the delay returned by retry policy"
    )
    assert outcome.values["errors"][-1]["exception_class_path"] == "builtins.ValueError"


def test_the_worker_checks_a_deferral_again_by_its_own_clock():
    """Created by the host's clock, written by the database's: a time near the horizon
    that the database's (slower) clock puts past it is refused, typed, instead of landing."""
    host_now = django_timezone.now()
    edge = host_now + HORIZON - timedelta(minutes=1)
    deferral = TaskDeferred(run_after=edge)  # fine by the host's clock
    database_now = host_now - timedelta(hours=1)  # the database's clock is behind
    with pytest.raises(TimeOutOfRange):
        deferred_until(database_now, deferral.delay, deferral.run_after)
    with pytest.raises(TimeOutOfRange, match="Hold delay"):
        deferred_until(database_now, HORIZON * 2, None, source=("Hold delay", "Hold until"))
    assert deferred_until(host_now, None, edge) == edge


OUTCOME_TIMES = {
    "now": datetime(2026, 12, 5, 1, 2, 3, 456789, tzinfo=UTC),
    "the last moment": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "just before the epoch": datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "year 1": datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    "another offset": datetime(2026, 6, 1, 9, 30, 0, 7, tzinfo=timezone(timedelta(hours=5))),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("moment", list(OUTCOME_TIMES.values()), ids=list(OUTCOME_TIMES))
def test_an_outcome_writes_its_times_to_the_microsecond(moment: datetime) -> None:
    """The outcome writer sends times compactly (PostgreSQL: microseconds since the
    epoch, rebuilt in SQL): each reads back exactly, at both ends of the range and on
    either side of the epoch, whatever its offset."""
    from django.db import connection

    from django_tasks_plus.db import dialect_for

    result = tasks.add.enqueue(1, 2)
    [claimed] = claim_tasks(1)
    values = {"return_value": 3, "finished_at": moment, "last_attempted_at": moment}
    outcome = Transition(TaskResultStatus.SUCCESSFUL, values)
    assert dialect_for(connection).write_outcomes(connection, [(claimed, outcome)]) == [True]
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.finished_at, row.last_attempted_at) == ("SUCCESSFUL", moment, moment)


def test_times_and_reasons_from_user_code_are_kept_as_plain_values():
    """What reaches the worker's bookkeeping threads is a plain UTC datetime and a plain
    str, whatever subclass task code handed over."""

    class Loud(str):
        def __str__(self) -> str:
            raise RuntimeError("no")

    late = tasks.UnprintableTime.fromtimestamp(NOW.timestamp() + 3600, UTC)
    deferral = TaskDeferred(run_after=late)
    assert type(deferral.run_after) is datetime
    assert deferral.run_after.tzinfo is UTC
    assert deferral.run_after == late
    hold = Hold(until=late, reason=Loud("breaker open"))
    assert type(hold.until) is datetime
    assert type(hold.reason) is str
    assert hold.reason == "breaker open"


def test_the_outcome_line_shows_a_time_the_local_zone_cannot(settings):
    """9999-12-31 23:59 UTC is year 10000 in a time zone east of UTC: the -v 1 line
    shows it as stored rather than raise on the outcome writer's thread."""
    settings.TIME_ZONE = "Pacific/Kiritimati"
    task = _claimed("t1")
    outcome = Transition(TaskResultStatus.READY, {"run_after": tasks.LAST_MOMENT})
    line = describe_outcome(task, outcome, 0.01, NOW)
    assert "deferred" in line
    assert "9999-12-31T23:59:59.999999+00:00" in line


# -- the outcome writer under follow-ups that raise (in process, real database) ------------


def _claim(limit: int) -> list[ClaimedTask]:
    return claim_tasks(limit)


@pytest.mark.django_db(transaction=True)
def test_the_outcome_writer_survives_follow_ups_that_raise():
    """One task's follow-up (its log line, its events) raising, even ``SystemExit``, is
    logged with its id: the rows of its batch all land, the others' follow-ups run, and
    the thread goes on to write the next batch."""
    backend = task_backends["default"]
    for n in range(6):
        tasks.add.enqueue(n, n)
    claimed = _claim(6)
    reporter = Reporter("default", persist_deadline=5.0, clock=django_timezone.now)
    reporter.start()
    told: dict[str, bool] = {}

    def submit(batch: list[ClaimedTask], hostile: dict[int, BaseException]) -> threading.Event:
        done = threading.Event()
        for index, task in enumerate(batch):
            outcome = transition(task, Succeeded(index), policy=backend.settings.retry, now=NOW)

            def written(ok: bool, task_id: str = task.id, index: int = index) -> None:
                told[task_id] = ok
                if all(other.id in told for other in batch):
                    done.set()
                if index in hostile:
                    raise hostile[index]

            reporter.submit(task, outcome, written)
        return done

    try:
        first = submit(claimed[:3], {0: RuntimeError("log line"), 1: SystemExit(3)})
        assert first.wait(30)
        second = submit(claimed[3:], {2: KeyError("event")})
        assert second.wait(30)
        assert reporter.is_alive()
    finally:
        reporter.stop()
        reporter.join(10)
    assert told == {task.id: True for task in claimed}
    for task in claimed:
        assert TaskRecord.objects.get(pk=task.id).status == TaskResultStatus.SUCCESSFUL


def test_an_outcome_that_cannot_be_described_is_logged_plainly_and_ends_its_lease(
    monkeypatch, caplog
):
    """The -v 1 line failing (a value in the outcome that cannot be formatted) costs that
    line only: a plainer one is logged and the lease is released all the same."""

    def cannot_describe(*args: Any) -> str:
        raise RuntimeError("no text for this outcome")

    monkeypatch.setattr(execution, "describe_outcome", cannot_describe)
    released: list[str] = []
    reporter = Reporter("default", persist_deadline=5.0, clock=django_timezone.now)
    runner = TaskRunner(
        task_backends["default"],
        clock=django_timezone.now,
        reporter=reporter,
        on_written=lambda task: released.append(task.id),
        schedule=lambda job: job(),
        log_each_task=True,
    )
    task = _claimed("t-hostile")
    outcome = Transition(TaskResultStatus.SUCCESSFUL, {"return_value": 1, "finished_at": NOW})
    with caplog.at_level(logging.INFO, logger="django_tasks_plus.worker"):
        runner._after_write(task, outcome, 0.01, None, True)
    assert released == ["t-hostile"]
    messages = [record.getMessage() for record in caplog.records]
    assert any("t-hostile: its outcome could not be described" in m for m in messages)
    assert "Task t-hostile tests.tasks.add SUCCESSFUL (attempt 1)" in messages


@pytest.mark.django_db(transaction=True)
def test_the_reaper_settles_alone_a_row_whose_outcome_the_database_refuses(monkeypatch):
    """An expired lease whose outcome the database refuses (injected here: no value the
    library builds is refused any more) is dead-lettered alone with OutcomeNotStorable;
    today's main re-raises, so that row fails every reaper round and the expired leases
    behind it are never returned."""
    backend = task_backends["default"]
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    expired = claim_tasks(2, worker_id="dead-worker", visibility_timeout=-1)  # expired
    assert {task.id for task in expired} == {first.id, second.id}
    refused_once: list[str] = []

    def apply_outcome(database: str, task: ClaimedTask, outcome: Transition, **kw: Any):  # type: ignore[no-untyped-def]
        if task.id == first.id and not refused_once:
            refused_once.append(task.id)
            raise DataError("value out of range for this column")
        return completions_apply_outcome(database, task, outcome, **kw)

    monkeypatch.setattr(reaper, "apply_outcome", apply_outcome)
    assert reaper.reap_expired(backend, django_timezone.now) == 2

    refused = TaskRecord.objects.get(pk=first.id)
    assert refused.status == TaskResultStatus.FAILED
    assert refused.errors[-1]["exception_class_path"] == (
        "django_tasks_plus.exceptions.OutcomeNotStorable"
    )
    returned = TaskRecord.objects.get(pk=second.id)
    assert returned.status == TaskResultStatus.READY  # LeaseExpired: retried by its policy
    assert returned.errors[-1]["exception_class_path"] == (
        "django_tasks_plus.exceptions.LeaseExpired"
    )


# -- real workers meet such times next to ordinary tasks -----------------------------------

GOOD = 8


def _runs(markers: Path, name: str) -> int:
    path = markers / f"runs-{name}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _run_worker(tmp_path: Path, *, variant: str = "") -> subprocess.CompletedProcess[str]:
    env = worker_env(tmp_path)
    if variant:
        env["DJANGO_SETTINGS_MODULE"] = "tests.settings_variants"
        env["DTP_SETTINGS_VARIANT"] = variant
    return subprocess.run(
        runtasks_command("--burst", "--concurrency", "2", "-v", "1"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _enqueue_good() -> list[Any]:
    return [tasks.counts_runs.enqueue(f"good-{n}", 0.01) for n in range(GOOD)]


def _assert_good_ran_once(good: list[Any], markers: Path) -> None:
    for n, result in enumerate(good):
        read = tasks.counts_runs.get_result(result.id)
        assert read.status == TaskResultStatus.SUCCESSFUL, (n, read.status)
        assert _runs(markers, f"good-{n}") == 1


@pytest.mark.django_db(transaction=True)
def test_times_past_the_horizon_fail_their_task_alone_and_the_worker_goes_on(markers, tmp_path):
    """The issue's run: a task deferring to 9999-12-31 23:59:59.999999 UTC next to others,
    in a project east of UTC, logging each outcome (-v 1). Today's main loses its
    outcome writer (OverflowError formatting the line), exits 1 and leaves tasks RUNNING;
    a middleware's far ``Hold`` is stored and ``get_result()`` cannot read it back."""
    bad = {
        "defers-to-the-last-moment": tasks.defers_to_the_last_moment.enqueue(),
        "defers-for-ever": tasks.defers_for_ever.enqueue(),
        "held-past-the-horizon-until": tasks.held_past_the_horizon.enqueue("until"),
        "held-past-the-horizon-delay": tasks.held_past_the_horizon.enqueue("delay"),
    }
    good = _enqueue_good()

    proc = _run_worker(tmp_path, variant="east-of-utc")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "died" not in proc.stderr

    for name, result in bad.items():
        read = result.task.get_result(result.id)  # it reads back: no DataError
        assert read.status == TaskResultStatus.FAILED, (name, read.status)
        [error] = read.errors
        assert error.exception_class_path == TIME_OUT_OF_RANGE, name
        assert "3650 days" in TaskRecord.objects.get(pk=result.id).dead_letter_reason
        # The task body ran once (ONCE: one attempt); a held task's body never ran.
        assert _runs(markers, name) == (0 if name.startswith("held") else 1), name
    _assert_good_ran_once(good, markers)


@pytest.mark.django_db(transaction=True)
def test_a_time_that_cannot_be_formatted_does_not_stop_the_worker(markers, tmp_path):
    """A deferral to a datetime subclass whose text cannot be made (``strftime``,
    ``isoformat`` and ``format`` raise): today's main dies formatting its -v 1 line on
    the outcome writer. The time is kept as a plain datetime, so the deferral stands."""
    deferring = tasks.defers_to_an_unprintable_time.enqueue()
    good = _enqueue_good()

    proc = _run_worker(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    read = tasks.defers_to_an_unprintable_time.get_result(deferring.id)
    assert read.status == TaskResultStatus.READY
    row = TaskRecord.objects.get(pk=deferring.id)
    assert row.run_after > django_timezone.now() + timedelta(minutes=30)
    assert row.attempt == 0  # a deferral spends no attempt
    assert _runs(markers, "defers-to-an-unprintable-time") == 1
    _assert_good_ran_once(good, markers)


def test_a_naive_outcome_time_is_read_in_the_sessions_zone():
    """``USE_TZ = False`` hands naive datetimes to the outcome writer: they are read in
    the database session's time zone, as PostgreSQL read them when they travelled as
    text, and an aware one ignores the zone."""
    from zoneinfo import ZoneInfo

    from django_tasks_plus.db.postgresql import _micros

    wall = datetime(2026, 7, 1, 12, 0, 0, 250)
    paris = wall.replace(tzinfo=ZoneInfo("Europe/Paris"))
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert _micros(wall, "Europe/Paris") == (paris - epoch) // timedelta(microseconds=1)
    assert _micros(wall, "UTC") - _micros(wall, "Europe/Paris") == 2 * 3600 * 10**6  # CEST
    assert _micros(paris, "UTC") == _micros(wall, "Europe/Paris")
