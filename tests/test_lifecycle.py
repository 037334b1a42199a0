"""The pure state machine behind every write after a claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_tasks_plus import Abort, exponential_backoff, no_retry
from django_tasks_plus.lifecycle import (
    Aborted,
    ClaimedTask,
    Deferred,
    Failed,
    Released,
    Succeeded,
    deferred_until,
    transition,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STEADY = exponential_backoff(initial_delay=10, max_attempts=3, jitter=False)


def claimed(attempt: int = 1, **changes) -> ClaimedTask:
    values = {
        "id": "00000000-0000-0000-0000-000000000001",
        "task_path": "tests.tasks.add",
        "queue_name": "default",
        "priority": 0,
        "args": [1, 2],
        "kwargs": {},
        "attempt": attempt,
        "worker_ids": tuple(f"w{i}" for i in range(1, attempt + 1)),
        "errors": (),
        "enqueued_at": NOW - timedelta(minutes=1),
        "run_after": NOW - timedelta(minutes=1),
        "started_at": NOW - timedelta(seconds=5),
        "lease_token": "token",
        **changes,
    }
    return ClaimedTask(**values)


def test_success_is_final_with_the_value():
    outcome = transition(claimed(), Succeeded({"ok": 1}), policy=STEADY, now=NOW)
    assert outcome.status == "SUCCESSFUL"
    assert outcome.is_final
    assert outcome.values == {"return_value": {"ok": 1}, "finished_at": NOW}


def test_failure_with_attempts_left_goes_back_to_ready_later():
    outcome = transition(claimed(attempt=1), Failed(ValueError("bad")), policy=STEADY, now=NOW)
    assert outcome.status == "READY"
    assert not outcome.is_final
    assert outcome.values["run_after"] == NOW + timedelta(seconds=10)
    [error] = outcome.values["errors"]
    assert error["exception_class_path"] == "builtins.ValueError"
    assert error["attempt"] == 1
    assert error["worker_id"] == "w1"
    assert error["at"] == NOW.isoformat()
    assert "ValueError: bad" in error["traceback"]


def test_failure_keeps_earlier_errors():
    earlier = ({"exception_class_path": "builtins.KeyError", "traceback": "t"},)
    outcome = transition(
        claimed(attempt=2, errors=earlier), Failed(ValueError("2")), policy=STEADY, now=NOW
    )
    assert [e["exception_class_path"] for e in outcome.values["errors"]] == [
        "builtins.KeyError",
        "builtins.ValueError",
    ]
    assert outcome.values["run_after"] == NOW + timedelta(seconds=20)


def test_failure_on_the_last_attempt_dead_letters():
    outcome = transition(claimed(attempt=3), Failed(ValueError("bad")), policy=STEADY, now=NOW)
    assert outcome.status == "FAILED"
    assert outcome.values["finished_at"] == NOW
    assert outcome.values["dead_letter_reason"] == (
        "gave up after 3 attempt(s); last error builtins.ValueError: bad"
    )


def test_no_retry_policy_dead_letters_at_once():
    outcome = transition(claimed(), Failed(ValueError("x")), policy=no_retry, now=NOW)
    assert outcome.status == "FAILED"


def test_abort_ignores_the_policy():
    outcome = transition(claimed(), Aborted(Abort("never")), policy=STEADY, now=NOW)
    assert outcome.status == "FAILED"
    assert outcome.values["dead_letter_reason"] == "django_tasks_plus.exceptions.Abort: never"


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (lambda a, e, x: timedelta(seconds=-5), "retry policy failed: .*negative delay"),
        (lambda a, e, x: 1 / 0, "retry policy raised builtins.ZeroDivisionError"),
    ],
)
def test_broken_policy_dead_letters_with_the_reason(policy, reason):
    import re

    outcome = transition(claimed(), Failed(ValueError("x")), policy=policy, now=NOW)
    assert outcome.status == "FAILED"
    assert re.match(reason, outcome.values["dead_letter_reason"])


def test_deferral_gives_the_attempt_back():
    when = NOW + timedelta(hours=1)
    outcome = transition(claimed(attempt=2), Deferred(when), policy=STEADY, now=NOW)
    assert outcome.status == "READY"
    assert outcome.values == {"attempt": 1, "worker_ids": ["w1"], "run_after": when}


def test_release_undoes_the_claim():
    outcome = transition(claimed(attempt=1), Released(), policy=STEADY, now=NOW)
    assert outcome.status == "READY"
    assert outcome.values == {
        "attempt": 0,
        "worker_ids": [],
        "started_at": None,
        "last_attempted_at": None,
    }
    again = transition(claimed(attempt=2), Released(), policy=STEADY, now=NOW)
    assert again.values == {"attempt": 1, "worker_ids": ["w1"]}


def test_deferred_until():
    assert deferred_until(NOW, timedelta(seconds=5), None) == NOW + timedelta(seconds=5)
    later = NOW + timedelta(days=1)
    assert deferred_until(NOW, None, later) == later


@pytest.mark.parametrize(
    "event", [Failed(ValueError("bad")), Aborted(Abort("stop"))], ids=["failed", "aborted"]
)
def test_an_attempts_error_record_keeps_when_its_code_started(event):
    began = NOW - timedelta(seconds=3)
    outcome = transition(claimed(), event, policy=STEADY, now=NOW, started=began)
    [error] = outcome.values["errors"]
    assert error["started_at"] == began.isoformat()
    assert error["at"] == NOW.isoformat()


def test_an_error_record_without_a_start_has_no_started_at():
    # The reaper settles an attempt it did not watch start.
    outcome = transition(claimed(), Failed(ValueError("bad")), policy=STEADY, now=NOW)
    [error] = outcome.values["errors"]
    assert "started_at" not in error
