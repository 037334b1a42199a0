"""Execution middleware: the chain's contract, its settings, and real workers running it.

The middlewares the workers load live in tests/middlewares.py; the backend-wide ones are
switched on only by the ``middleware`` settings variant, so other tests never see them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_tasks_plus import Hold, InvalidTaskOptions, exponential_backoff
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.exceptions import InvalidBackendOptions
from django_tasks_plus.lifecycle import (
    Aborted,
    ClaimedTask,
    Deferred,
    Failed,
    Postponed,
    Released,
    Succeeded,
    transition,
)
from django_tasks_plus.middleware import Attempt, build_chain, load_middleware, log_slow_attempts
from django_tasks_plus.models import TaskRecord
from tests import middlewares, tasks
from tests.conftest import runtasks_command, worker_env

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def _attempt(*args: Any, **kwargs: Any) -> Attempt:
    """An Attempt for the pure chain tests; the chain never looks at task or result."""
    return Attempt(
        id="t1",
        task=tasks.add,
        task_path="tests.tasks.add",
        queue_name="default",
        priority=0,
        number=1,
        args=args,
        kwargs=kwargs,
        result=None,  # type: ignore[arg-type]
        backend="default",
    )


def _tracer(label: str, seen: list[str]):  # type: ignore[no-untyped-def]
    def factory(call_next):  # type: ignore[no-untyped-def]
        def middleware(attempt):  # type: ignore[no-untyped-def]
            seen.append(f"{label} in")
            try:
                value = call_next(attempt)
            except Exception as exc:
                seen.append(f"{label} saw {exc}")
                raise
            seen.append(f"{label} out {value!r}")
            return value

        return middleware

    return factory


# -- the chain (pure) ------------------------------------------------------------------------


def test_chain_runs_the_first_middleware_outermost():
    seen: list[str] = []

    def innermost(attempt: Attempt) -> int:
        seen.append("task")
        return sum(attempt.args)

    chain = build_chain([_tracer("a", seen), _tracer("b", seen)], innermost)
    assert chain(_attempt(1, 2)) == 3
    assert seen == ["a in", "b in", "task", "b out 3", "a out 3"]


def test_middlewares_see_what_call_next_raises():
    seen: list[str] = []

    def innermost(attempt: Attempt) -> None:
        raise ValueError("task broke")

    chain = build_chain([_tracer("a", seen), _tracer("b", seen)], innermost)
    with pytest.raises(ValueError, match="task broke"):
        chain(_attempt())
    assert seen == ["a in", "b in", "b saw task broke", "a saw task broke"]


def test_a_middleware_can_short_circuit_with_a_hold():
    seen: list[str] = []
    hold = Hold(delay=30, reason="breaker open")

    def holds(call_next):  # type: ignore[no-untyped-def]
        return lambda attempt: hold

    def innermost(attempt: Attempt) -> None:
        raise AssertionError("the task must not run")

    chain = build_chain([_tracer("outer", seen), holds], innermost)
    assert chain(_attempt()) is hold
    assert seen == ["outer in", f"outer out {hold!r}"]


def test_a_middleware_can_replace_the_arguments():
    def innermost(attempt: Attempt) -> Any:
        return attempt.args, dict(attempt.kwargs)

    chain = build_chain([middlewares.tenfold_second_argument], innermost)
    assert chain(_attempt(1, 2, flag=True)) == ((1, 20), {"flag": True})


class _Doubling:
    """A class-based middleware, Django style: __init__(call_next), __call__(attempt)."""

    def __init__(self, call_next):  # type: ignore[no-untyped-def]
        self.call_next = call_next

    def __call__(self, attempt: Attempt) -> Any:
        return 2 * self.call_next(attempt)


def test_a_class_is_a_middleware_too():
    [factory] = load_middleware([_Doubling], "x")
    assert build_chain([factory], lambda attempt: sum(attempt.args))(_attempt(1, 2)) == 6


def test_a_factory_that_returns_no_callable_is_named():
    def broken(call_next):  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(TypeError, match=r"middleware .*broken returned None, not a callable"):
        build_chain([broken], lambda attempt: None)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, TypeError, "exactly one of until= or delay="),
        ({"until": NOW, "delay": 5}, TypeError, "exactly one of until= or delay="),
        ({"until": NOW.replace(tzinfo=None)}, ValueError, "aware datetime"),
        ({"delay": -1}, ValueError, "must not be negative"),
        ({"delay": "soon"}, TypeError, "timedelta or seconds"),
        ({"delay": 1, "reason": 3}, TypeError, "reason must be a string"),
    ],
)
def test_hold_refuses_bad_values(kwargs, error, message):
    with pytest.raises(error, match=message):
        Hold(**kwargs)


def test_hold_takes_seconds_as_a_delay():
    assert Hold(delay=1.5).delay == dt.timedelta(seconds=1.5)
    assert Hold(NOW, reason="x") == Hold(until=NOW, reason="x")


# -- the Postponed transition (pure) --------------------------------------------------------------


def _claimed(attempt: int) -> ClaimedTask:
    started = NOW - dt.timedelta(minutes=5) if attempt > 1 else NOW
    return ClaimedTask(
        id="t1",
        task_path="tests.tasks.add",
        queue_name="default",
        priority=0,
        args=[],
        kwargs={},
        attempt=attempt,
        worker_ids=tuple(f"w{i}" for i in range(1, attempt + 1)),
        errors=(),
        enqueued_at=NOW - dt.timedelta(minutes=10),
        run_after=NOW - dt.timedelta(minutes=10),
        started_at=started,
        lease_token="token",
        claimed_at=NOW,
    )


def test_a_held_first_attempt_is_undone_entirely():
    until = NOW + dt.timedelta(minutes=2)
    outcome = transition(
        _claimed(1),
        Postponed(until, reason="x"),
        policy=exponential_backoff(),
        now=NOW,
        started=NOW,
    )
    assert outcome.status == "READY"
    assert outcome.values == {
        "attempt": 0,
        "worker_ids": [],
        "run_after": until,
        "started_at": None,
        "last_attempted_at": None,
        "held_since": NOW,
    }


def test_a_held_retry_keeps_its_attempts_and_start():
    until = NOW + dt.timedelta(minutes=2)
    outcome = transition(
        _claimed(3),
        Postponed(until, reason="x"),
        policy=exponential_backoff(),
        now=NOW,
        started=NOW,
    )
    assert outcome.values == {
        "attempt": 2,
        "worker_ids": ["w1", "w2"],
        "run_after": until,
        "held_since": NOW,
    }
    assert outcome.error is None


def test_a_task_held_again_keeps_the_time_of_its_first_hold():
    first = NOW - dt.timedelta(hours=3)
    claimed = _claimed(1)._replace(held_since=first)
    outcome = transition(claimed, Postponed(NOW, reason="x"), policy=exponential_backoff(), now=NOW)
    assert outcome.values["held_since"] == first


@pytest.mark.parametrize(
    "event",
    [
        Succeeded(None),
        Failed(RuntimeError("x")),
        Aborted(RuntimeError("x")),
        Deferred(NOW + dt.timedelta(seconds=5)),
    ],
    ids=["succeeded", "failed", "aborted", "deferred"],
)
def test_a_held_task_that_then_runs_forgets_its_hold(event):
    claimed = _claimed(1)._replace(held_since=NOW - dt.timedelta(hours=1))
    outcome = transition(claimed, event, policy=exponential_backoff(), now=NOW, started=NOW)
    assert outcome.values["held_since"] is None


def test_a_task_never_held_writes_no_held_since():
    outcome = transition(_claimed(1), Succeeded(None), policy=exponential_backoff(), now=NOW)
    assert "held_since" not in outcome.values


def test_a_held_task_released_at_shutdown_stays_held():
    claimed = _claimed(1)._replace(held_since=NOW - dt.timedelta(hours=1))
    outcome = transition(claimed, Released(), policy=exponential_backoff(), now=NOW)
    assert "held_since" not in outcome.values


# -- log_slow_attempts -----------------------------------------------------------------------


def test_log_slow_attempts_warns_only_above_its_threshold(caplog):
    caplog.set_level(logging.WARNING, logger="django_tasks_plus.middleware")

    def slow(attempt: Attempt) -> str:
        time.sleep(0.05)
        return "ok"

    assert build_chain([log_slow_attempts(10)], slow)(_attempt()) == "ok"
    assert caplog.records == []

    assert build_chain([log_slow_attempts(0.01)], slow)(_attempt()) == "ok"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "Task t1 (tests.tasks.add) attempt 1 returned after" in record.getMessage()


def test_log_slow_attempts_reports_exceptions_and_holds(caplog):
    caplog.set_level(logging.WARNING, logger="django_tasks_plus.middleware")

    def raises(attempt: Attempt) -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        build_chain([log_slow_attempts(0)], raises)(_attempt())
    build_chain([log_slow_attempts(0)], lambda attempt: Hold(delay=1))(_attempt())
    messages = [record.getMessage() for record in caplog.records]
    assert "attempt 1 raised KeyError after" in messages[0]
    assert "attempt 1 was held after" in messages[1]


def test_log_slow_attempts_refuses_being_configured_uncalled():
    with pytest.raises(TypeError, match=r"configure log_slow_attempts\(2.0\)"):
        build_chain([log_slow_attempts], lambda attempt: None)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="number of seconds >= 0"):
        log_slow_attempts(-1)


# -- settings and task options ---------------------------------------------------------------

WHERE = r"TASKS\['default'\]\['OPTIONS'\]\['MIDDLEWARE'\]"


def _parse(middleware: Any):  # type: ignore[no-untyped-def]
    return parse_settings("default", {"OPTIONS": {"MIDDLEWARE": middleware}})


def test_settings_accept_dotted_paths_and_factories_in_order():
    slow = log_slow_attempts(2.0)
    settings = _parse(["tests.middlewares.backend_outer", slow])
    assert settings.middleware == (middlewares.backend_outer, slow)
    assert parse_settings("default", {}).middleware == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tests.middlewares.backend_outer", WHERE + " must be a list of middleware factories"),
        (["tests.middlewares.missing"], WHERE + r"\[0\] names 'tests.middlewares.missing', which"),
        (["nowhere_at_all.mw"], WHERE + r"\[0\] names 'nowhere_at_all.mw', which cannot be"),
        ([middlewares.task_own, 42], WHERE + r"\[1\] is 42, not a callable"),
        ([lambda: None], WHERE + r"\[0\] \(.*<lambda>\(\)\) cannot be called with one argument"),
        (
            ["django_tasks_plus.middleware.log_slow_attempts"],
            WHERE + r"\[0\] is django_tasks_plus.middleware.log_slow_attempts, which builds a "
            r"middleware from its own settings: list what it returns, "
            r"e.g. log_slow_attempts\(2.0\)",
        ),
        ([middlewares.recording], None),  # a factory of factories binds one argument: allowed
    ],
)
def test_settings_refuse_bad_middleware(value, message):
    if message is None:
        assert _parse(value).middleware == (middlewares.recording,)
        return
    with pytest.raises(InvalidBackendOptions, match=message):
        _parse(value)


def test_a_misspelt_middleware_key_gets_a_suggestion():
    with pytest.raises(InvalidBackendOptions, match="Did you mean 'MIDDLEWARE'"):
        parse_settings("default", {"OPTIONS": {"MIDDLEWARES": []}})


def test_task_middleware_is_validated_at_definition():
    with pytest.raises(InvalidTaskOptions, match=r"tests.tasks.add: middleware must be a list"):
        dataclasses.replace(tasks.add, middleware="tests.middlewares.task_own")
    with pytest.raises(InvalidTaskOptions, match=r"middleware\[0\] names 'tests.nope.mw'"):
        dataclasses.replace(tasks.add, middleware=["tests.nope.mw"])
    # A list is kept as a tuple, so the definition stays hashable.
    defined = dataclasses.replace(tasks.add, middleware=[middlewares.task_own])
    assert defined.middleware == (middlewares.task_own,)
    assert tasks.add_through_middleware.middleware == (
        "tests.middlewares.task_own",
        "tests.middlewares.tenfold_second_argument",
    )
    assert load_middleware(tasks.add_through_middleware.middleware, "x") == (
        middlewares.task_own,
        middlewares.tenfold_second_argument,
    )


# -- real workers ----------------------------------------------------------------------------


def _run_worker_with_backend_middleware(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = worker_env(tmp_path)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings_variants"
    env["DTP_SETTINGS_VARIANT"] = "middleware"
    return subprocess.run(
        runtasks_command("--burst"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _log(markers: Path, *, containing: tuple[str, ...]) -> list[str]:
    """The lines of the middleware log that mention any of ``containing``, in order."""
    path = markers / middlewares.LOG_NAME
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if any(text in line for text in containing)]


@pytest.mark.django_db(transaction=True)
def test_backend_middleware_wraps_the_task_middleware_in_a_worker(tmp_path, markers):
    added = tasks.add_through_middleware.enqueue(1, 2)
    quick = tasks.quick_behind_slow_middleware.enqueue()
    failing = tasks.always_fails.enqueue("boom")
    proc = _run_worker_with_backend_middleware(tmp_path)
    assert proc.returncode == 0, proc.stderr

    added.refresh()
    assert added.status == TaskResultStatus.SUCCESSFUL
    assert added.return_value == 21  # the task's own middleware made b ten times larger
    path = "tests.tasks.add_through_middleware"
    seen = "attempt=1 args=[1, 2] queue=default"
    assert _log(markers, containing=(path, "task body")) == [
        f"backend-outer enter {path} {seen}",
        f"backend-inner enter {path} {seen}",
        f"task enter {path} {seen}",
        "task body a=1 b=20",
        f"task exit {path} value=21",
        f"backend-inner exit {path} value=21",
        f"backend-outer exit {path} value=21",
    ]

    # The task's 0.3 s timeout covers the task alone, not the 0.6 s middleware before it.
    quick.refresh()
    assert quick.status == TaskResultStatus.SUCCESSFUL, quick.errors
    assert quick.return_value == "done"

    # Middlewares see the task's exception on every attempt; it still fails as before.
    failing.refresh()
    assert failing.status == TaskResultStatus.FAILED
    assert len(failing.errors) == 3
    assert _log(markers, containing=("exit tests.tasks.always_fails",)) == [
        f"backend-{which} exit tests.tasks.always_fails raised=ValueError"
        for _ in range(3)
        for which in ("inner", "outer")
    ]


@pytest.mark.django_db(transaction=True)
def test_without_backend_middleware_only_the_tasks_own_runs(run_worker, markers):
    added = tasks.add_through_middleware.enqueue(4, 5)
    plain = tasks.add.enqueue(4, 5)
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr

    added.refresh()
    plain.refresh()
    assert (added.return_value, plain.return_value) == (54, 9)
    lines = (markers / middlewares.LOG_NAME).read_text().splitlines()
    assert [line.split(" ")[0] for line in lines] == ["task", "task", "task"]  # enter, body, exit


@pytest.mark.django_db(transaction=True)
def test_a_hold_returns_the_task_to_ready_without_spending_an_attempt(run_worker, markers):
    # An hour away: however slowly the worker starts, the hold is still in force when the
    # middleware sees the task (a few seconds were flaky on a loaded machine).
    until = (timezone.now() + dt.timedelta(hours=1)).replace(microsecond=123456)
    (markers / middlewares.HOLD_UNTIL_NAME).write_text(until.isoformat())
    result = tasks.held_by_middleware.enqueue(7)
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr
    assert _log(markers, containing=("hold ",)) == ["hold tests.tasks.held_by_middleware attempt=1"]

    record = TaskRecord.objects.get(pk=result.id)
    assert record.status == TaskResultStatus.READY
    assert record.run_after == until
    assert record.attempt == 0
    assert record.worker_ids == []
    assert record.errors == []
    assert (record.started_at, record.last_attempted_at) == (None, None)
    assert not (markers / "held-ran-7").exists()
    output = proc.stdout + proc.stderr
    assert f"Task {result.id} (tests.tasks.held_by_middleware) held until" in output
    assert middlewares.HOLD_REASON in output

    # Once `until` has passed, the next worker runs it: its first attempt. Rather than
    # wait an hour, let the hour pass for the task and the middleware alike.
    until = timezone.now()
    (markers / middlewares.HOLD_UNTIL_NAME).write_text(until.isoformat())
    TaskRecord.objects.filter(pk=result.id).update(run_after=until)
    assert run_worker("--burst").returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 7
    assert (markers / "held-ran-7").exists()
    assert TaskRecord.objects.get(pk=result.id).attempt == 1
    assert result.started_at >= until


@pytest.mark.django_db(transaction=True)
def test_an_exception_in_a_middleware_fails_the_attempt_under_the_retry_policy(run_worker, markers):
    result = tasks.refused_by_middleware.enqueue()
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == ["builtins.RuntimeError"] * 3
    for number, error in enumerate(result.errors, start=1):
        assert f"RuntimeError: middleware refused attempt {number}" in error.traceback
    record = TaskRecord.objects.get(pk=result.id)
    assert record.attempt == 3  # NO_WAIT's three attempts
    assert record.dead_letter_reason.startswith("gave up after 3 attempt(s)")
    assert not (markers / "refused-ran").exists()
