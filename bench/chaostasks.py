"""The chaos run's tasks, imported as ``chaostasks.chaos_step`` and ``chaostasks.chaos_long``.

Workers import this module at startup (the test project's ``EXTRA_TASK_MODULES``, with
``bench/`` on PYTHONPATH): it is not part of an installed app.

Every execution of the body first commits one row to ``chaos_ledger`` (its own
transaction), so the harness can compare what really ran with what the task row says.
The row's time comes from the database's clock, so a worker whose host clock is skewed
logs comparable times. What the body does next is decided by its ``kind`` argument,
chosen by the harness:

* ``ok``: return at once (after ``sleep``),
* ``flaky``: raise ``PlannedFailure`` on attempt 1, succeed afterwards,
* ``abort``: raise ``Abort`` (dead-lettered at once), designed to die,
* ``doomed``: always raise ``Doomed``; the policy gives up after 2 attempts, designed to die,
* ``surrogate``: return a string holding a lone surrogate (``os.fsdecode(b"\\xff")``),
  which no database can store: designed to die with ``ReturnValueNotSerializable``,
* ``leak``: on attempt 1, enter ``transaction.atomic()`` without leaving it, write a row
  to ``chaos_leak`` inside it and return; the worker must roll that back and fail the
  attempt. Attempt 2 behaves as ``ok``,
* ``long``: as ``ok``, but it sleeps longer than a lease (only heartbeats keep it), so it
  is enqueued as ``chaos_long``, whose policy allows many attempts: a task that is killed
  again and again under chaos must not die of it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from django.db import connection, transaction

from django_tasks_plus import Abort, exponential_backoff, task

LEDGER_TABLE = "chaos_ledger"
LEAK_TABLE = "chaos_leak"
DOOMED_MAX_ATTEMPTS = 2
LONG_MAX_ATTEMPTS = 20


class PlannedFailure(Exception):
    """A failure the harness asked for; the retry policy retries it."""


class Doomed(Exception):
    """Raised on every attempt of a task designed to die through its retry policy."""


_backoff = exponential_backoff(initial_delay=0.1, max_delay=1, max_attempts=6)
_long_backoff = exponential_backoff(initial_delay=0.1, max_delay=1, max_attempts=LONG_MAX_ATTEMPTS)


def chaos_retry(attempt: int, elapsed: timedelta, exc: BaseException) -> timedelta | None:
    """Short exponential backoff; ``Doomed`` tasks get at most two attempts."""
    if isinstance(exc, Doomed) and attempt >= DOOMED_MAX_ATTEMPTS:
        return None
    return _backoff(attempt, elapsed, exc)


def long_retry(attempt: int, elapsed: timedelta, exc: BaseException) -> timedelta | None:
    """The same backoff with more attempts, for tasks that outlive their lease."""
    return _long_backoff(attempt, elapsed, exc)


def _db_epoch() -> str:
    """SQL for the database's current time in seconds since the epoch (not the host's)."""
    if connection.vendor == "postgresql":
        return "EXTRACT(EPOCH FROM clock_timestamp())"
    return "(julianday('now') - 2440587.5) * 86400.0"


@task(takes_context=True, retry=chaos_retry)
def chaos_step(context, n: int, kind: str, sleep: float) -> list | str:  # type: ignore[no-untyped-def]
    """Log this execution, then behave as ``kind`` says; returns [attempt, worker, pid]."""
    return _step(context, n, kind, sleep)


@task(takes_context=True, retry=long_retry)
def chaos_long(context, n: int, kind: str, sleep: float) -> list | str:  # type: ignore[no-untyped-def]
    """``chaos_step`` with ``long_retry``: for the ``long`` kind."""
    return _step(context, n, kind, sleep)


def _step(context, n: int, kind: str, sleep: float) -> list | str:  # type: ignore[no-untyped-def]
    result = context.task_result
    attempt = context.attempt
    worker = result.worker_ids[-1]
    pid = os.getpid()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LEDGER_TABLE} (task_id, attempt, worker, pid, at) "
            f"VALUES (%s, %s, %s, %s, {_db_epoch()})",
            [str(result.id), attempt, worker, pid],
        )
    if sleep:
        time.sleep(sleep)
    if kind == "surrogate":
        return os.fsdecode(b"\xff")  # type: ignore[return-value]
    if kind == "leak" and attempt == 1:
        transaction.atomic().__enter__()  # never exited: the transaction is left open
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {LEAK_TABLE} (task_id, attempt) VALUES (%s, %s)",
                [str(result.id), attempt],
            )
        return [attempt, worker, pid]
    if kind == "abort":
        raise Abort(f"chaos task {n} is designed to die (Abort)")
    if kind == "doomed":
        raise Doomed(f"chaos task {n} is designed to die (attempt {attempt})")
    if kind == "flaky" and attempt == 1:
        raise PlannedFailure(f"chaos task {n} fails its first attempt")
    return [attempt, worker, pid]
