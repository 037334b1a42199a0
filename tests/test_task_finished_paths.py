"""``task_finished`` is sent the same way by the worker and by a cancel (``finished.py``):
for a failed task, while its exception is being handled, as Django documents. The
``django-tasks`` backport's own log receiver calls ``logger.exception``, so a send outside
an ``except`` block printed ``NoneType: None`` after every task ``canceltasks`` cancelled.
"""

from __future__ import annotations

import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from django_tasks_plus import compat
from django_tasks_plus.exceptions import Cancelled
from django_tasks_plus.models import TaskRecord
from tests import tasks
from tests.conftest import MANAGE, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cancel_sends_task_finished_while_its_exception_is_handled():
    seen: list[tuple[str, object]] = []

    def receiver(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((task_result.status, sys.exc_info()[1]))

    task_id = tasks.echo.enqueue("never runs").id
    compat.task_finished.connect(receiver)
    try:
        call_command("canceltasks", task_id, stdout=StringIO())
    finally:
        compat.task_finished.disconnect(receiver)
    [(status, exception)] = seen
    assert status == compat.TaskResultStatus.FAILED
    assert isinstance(exception, Cancelled)
    assert str(exception) == "cancelled before it ran"
    assert sys.exc_info() == (None, None, None)  # nothing left behind for the caller


def test_canceltasks_prints_no_empty_traceback(tmp_path: Path):
    """A real ``manage.py canceltasks`` (with the backport's log receiver on Django 5.2)."""
    ids = [tasks.echo.using(queue_name="emails").enqueue(n).id for n in range(2)]
    done = subprocess.run(
        [sys.executable, str(MANAGE), "canceltasks", "--queue", "emails", "--yes"],
        env=worker_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Cancelled 2 waiting tasks."
    assert "NoneType: None" not in done.stderr
    # Where a receiver prints the exception, it is the cancellation.
    assert "Traceback" not in done.stderr or "Cancelled: cancelled before it ran" in done.stderr
    assert {row.status for row in TaskRecord.objects.filter(pk__in=ids)} == {"FAILED"}
