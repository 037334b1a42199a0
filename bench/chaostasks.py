"""The chaos run's task, imported by workers as ``chaostasks.chaos_step`` (bench/ on PYTHONPATH).

Every execution of the body first commits one row to ``chaos_ledger`` (its own
transaction), so the harness can compare what really ran with what the task row says.
What the body does next is decided by its ``kind`` argument, chosen by the harness:

* ``ok``: return at once (after ``sleep``),
* ``flaky``: raise ``PlannedFailure`` on attempt 1, succeed afterwards,
* ``abort``: raise ``Abort`` (dead-lettered at once), designed to die,
* ``doomed``: always raise ``Doomed``; the policy gives up after 2 attempts, designed to die.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from django.db import connection, transaction

from django_tasks_plus import Abort, exponential_backoff, task

LEDGER_TABLE = "chaos_ledger"
DOOMED_MAX_ATTEMPTS = 2


class PlannedFailure(Exception):
    """A failure the harness asked for; the retry policy retries it."""


class Doomed(Exception):
    """Raised on every attempt of a task designed to die through its retry policy."""


_backoff = exponential_backoff(initial_delay=0.1, max_delay=1, max_attempts=6)


def chaos_retry(attempt: int, elapsed: timedelta, exc: BaseException) -> timedelta | None:
    """Short exponential backoff; ``Doomed`` tasks get at most two attempts."""
    if isinstance(exc, Doomed) and attempt >= DOOMED_MAX_ATTEMPTS:
        return None
    return _backoff(attempt, elapsed, exc)


@task(takes_context=True, retry=chaos_retry)
def chaos_step(context, n: int, kind: str, sleep: float) -> list:  # type: ignore[no-untyped-def]
    """Log this execution, then behave as ``kind`` says; returns [attempt, worker, pid]."""
    result = context.task_result
    attempt = context.attempt
    worker = result.worker_ids[-1]
    pid = os.getpid()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LEDGER_TABLE} (task_id, attempt, worker, pid, at) "
            "VALUES (%s, %s, %s, %s, %s)",
            [str(result.id), attempt, worker, pid, time.time()],
        )
    if sleep:
        time.sleep(sleep)
    if kind == "abort":
        raise Abort(f"chaos task {n} is designed to die (Abort)")
    if kind == "doomed":
        raise Doomed(f"chaos task {n} is designed to die (attempt {attempt})")
    if kind == "flaky" and attempt == 1:
        raise PlannedFailure(f"chaos task {n} fails its first attempt")
    return [attempt, worker, pid]
