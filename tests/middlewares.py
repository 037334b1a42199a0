"""Execution middlewares for tests/test_middleware.py.

Worker subprocesses load them by dotted path: the backend-wide ones through the
``middleware`` settings variant (tests/settings_variants.py), the per-task ones through
``@task(middleware=[...])`` in tests/tasks.py. Each writes what it saw to
``$DTP_TEST_MARKERS/middleware.log``, one line per event, for the test to read back.
This module must not import tests.tasks: the backend imports it while that module loads.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

from django.utils import timezone

from django_tasks_plus import Hold
from django_tasks_plus.middleware import Attempt, Handler, Middleware

LOG_NAME = "middleware.log"
HOLD_UNTIL_NAME = "hold-until"
HOLD_REASON = "test hold: breaker open"


def _marker(name: str) -> Path | None:
    folder = os.environ.get("DTP_TEST_MARKERS")
    return Path(folder) / name if folder else None


def log_line(line: str) -> None:
    path = _marker(LOG_NAME)
    if path is not None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def recording(label: str) -> Middleware:
    """Logs entering and leaving the chain, with the arguments it saw and how it ended."""

    def factory(call_next: Handler) -> Handler:
        def middleware(attempt: Attempt) -> Any:
            log_line(
                f"{label} enter {attempt.task_path} attempt={attempt.number} "
                f"args={list(attempt.args)} queue={attempt.queue_name}"
            )
            try:
                value = call_next(attempt)
            except BaseException as exc:
                log_line(f"{label} exit {attempt.task_path} raised={type(exc).__name__}")
                raise
            log_line(f"{label} exit {attempt.task_path} value={value!r}")
            return value

        return middleware

    return factory


backend_outer = recording("backend-outer")
backend_inner = recording("backend-inner")
task_own = recording("task")


def tenfold_second_argument(call_next: Handler) -> Handler:
    """Replaces the arguments: ``(a, b)`` becomes ``(a, 10 * b)``."""

    def middleware(attempt: Attempt) -> Any:
        a, b = attempt.args
        return call_next(dataclasses.replace(attempt, args=(a, 10 * b)))

    return middleware


def slow_start(call_next: Handler) -> Handler:
    """Takes longer than the task's timeout before calling it: the timeout must not count it."""

    def middleware(attempt: Attempt) -> Any:
        time.sleep(0.6)
        return call_next(attempt)

    return middleware


def hold_until_file(call_next: Handler) -> Handler:
    """Holds the task while the time written in ``hold-until`` lies in the future."""

    def middleware(attempt: Attempt) -> Any:
        path = _marker(HOLD_UNTIL_NAME)
        if path is not None and path.exists():
            until = dt.datetime.fromisoformat(path.read_text().strip())
            if timezone.now() < until:
                log_line(f"hold {attempt.task_path} attempt={attempt.number}")
                return Hold(until=until, reason=HOLD_REASON)
        return call_next(attempt)

    return middleware


def refuses(call_next: Handler) -> Handler:
    """Fails every attempt before the task runs."""

    def middleware(attempt: Attempt) -> Any:
        raise RuntimeError(f"middleware refused attempt {attempt.number}")

    return middleware


def holds_past_the_horizon(call_next: Handler) -> Handler:
    """Holds its task further ahead than any database can give back: ``until`` in year
    10000 by UTC (late 9999-12-31 at UTC-5), or a ``delay`` reaching 9999-12-31."""

    def middleware(attempt: Attempt) -> Any:
        (how,) = attempt.args
        if how == "until":
            late = dt.datetime(9999, 12, 31, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
            return Hold(until=late, reason="far ahead")
        last = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
        return Hold(delay=last - timezone.now(), reason="for ever")

    return middleware
