"""Django's own Tasks contract, exactly, and a new user's first contact with the backend.

Where Django defines a behaviour (``get_result(id) == result``, ``run_after=None`` meaning
"as soon as possible", ``InvalidTask`` for a queue the backend does not serve, ``QUEUES: []``
meaning any queue, ``TypeError`` for arguments that cannot be stored), the backend must
behave exactly so. The subprocess tests run ``manage.py`` the way a user does, with the
settings of ``tests/settings_variants.py``.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from django_tasks_plus import InvalidTaskArguments, ReturnValueNotSerializable, TasksPlusError
from django_tasks_plus.compat import InvalidTask, TaskResultStatus, task_backends
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.exceptions import InvalidBackendOptions
from django_tasks_plus.models import TaskRecord
from tests import tasks
from tests.conftest import MANAGE, runtasks_command, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_tasks_plus.backend.DatabaseBackend"


def manage(
    tmp_path: Path, variant: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py ARGS`` with the settings variant ``variant`` on the test database."""
    env = worker_env(tmp_path)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings_variants"
    env["DTP_SETTINGS_VARIANT"] = variant
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _default_backend():  # type: ignore[no-untyped-def]
    return task_backends["default"]


# -- item 12: get_result(id) is the result enqueue() returned --------------------------------


def test_get_result_equals_the_enqueued_result_without_run_after():
    result = tasks.add.enqueue(1, 2)
    assert tasks.add.get_result(result.id) == result
    # None is Django's "as soon as possible", not the enqueue time.
    assert _default_backend().get_result(result.id).task.run_after is None
    # The row itself still holds a concrete time for the claim to compare against.
    assert TaskRecord.objects.get(pk=result.id).run_after == result.enqueued_at


def test_get_result_equals_the_enqueued_result_with_run_after():
    when = timezone.now() + dt.timedelta(minutes=5)
    result = tasks.add.using(run_after=when).enqueue(1, 2)
    fetched = tasks.add.get_result(result.id)
    assert fetched == result
    assert fetched.task.run_after == when


@pytest.mark.parametrize("count", [3, 70])  # 70: the COPY path on PostgreSQL
def test_enqueue_many_keeps_the_requested_run_after(count):
    when = timezone.now() + dt.timedelta(minutes=5)
    calls = [((n, n), {}) for n in range(count)]
    given = tasks.add.using(run_after=when).enqueue_many(calls)
    unset = tasks.add.enqueue_many(calls)
    for result in (given[0], given[-1], unset[0], unset[-1]):
        assert tasks.add.get_result(result.id) == result
    assert _default_backend().get_result(given[-1].id).task.run_after == when
    assert _default_backend().get_result(unset[-1].id).task.run_after is None


def test_run_after_stays_what_the_caller_gave_after_a_retry(run_worker):
    past = timezone.now() - dt.timedelta(seconds=1)
    unset = tasks.fails_first_attempt.enqueue(1)
    given = tasks.fails_first_attempt.using(run_after=past).enqueue(2)
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr
    for result, requested in ((unset, None), (given, past)):
        record = TaskRecord.objects.get(pk=result.id)
        assert (record.status, record.attempt) == (TaskResultStatus.SUCCESSFUL, 2)
        # The retry moved the row's run_after; the result still shows the caller's value.
        assert record.run_after > result.enqueued_at
        fetched = _default_backend().get_result(result.id)
        assert fetched.task.run_after == requested
        assert fetched.task == result.task


# -- item 13: a queue the backend does not serve is InvalidTask, as in Django ---------------


def test_unserved_queue_is_refused_by_default_at_using_and_at_enqueue(settings):
    assert parse_settings("default", {}).queue_resolution == "strict"
    with pytest.raises(InvalidTask) as info:
        tasks.add.using(queue_name="nowhere")
    assert str(info.value) == "Queue 'nowhere' is not valid for backend."

    emails = tasks.add.using(queue_name="emails")  # valid when defined...
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}
    with pytest.raises(InvalidTask) as info:
        emails.enqueue(1, 2)  # ...and checked again at enqueue, as Django's backends do
    assert str(info.value) == "Queue 'emails' is not valid for backend."
    assert not TaskRecord.objects.exists()


def test_fallback_resolution_is_an_opt_in(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "other"],
            "OPTIONS": {"QUEUE_RESOLUTION": "fallback"},
        }
    }
    result = tasks.add.using(queue_name="nowhere").enqueue(1, 2)
    assert TaskRecord.objects.get(pk=result.id).queue_name == "default"
    assert result.task.queue_name == "default"


def test_empty_queues_means_any_queue(settings, tmp_path):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}
    assert _default_backend().settings.queues == frozenset()
    result = tasks.add.using(queue_name="anything").enqueue(2, 3)
    assert TaskRecord.objects.get(pk=result.id).queue_name == "anything"
    assert tasks.add.get_result(result.id) == result
    with pytest.raises(InvalidTask, match="at most 100 characters"):
        tasks.add.using(queue_name="q" * 101)

    # A worker cannot guess "every queue": it is told which ones to serve.
    proc = manage(tmp_path, "any-queue", "runtasks", "--burst")
    assert proc.returncode == 1
    assert "CommandError: TASKS['default']['QUEUES'] is empty" in proc.stderr
    assert "--queue NAME" in proc.stderr
    proc = manage(tmp_path, "any-queue", "runtasks", "--burst", "--queue", "anything")
    assert proc.returncode == 0, proc.stderr
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


# -- item 14: unstorable arguments and return values are TypeErrors too ---------------------


def test_unstorable_arguments_are_a_type_error():
    assert issubclass(InvalidTaskArguments, TypeError)
    assert issubclass(InvalidTaskArguments, InvalidTask)
    assert issubclass(InvalidTaskArguments, TasksPlusError)
    assert issubclass(ReturnValueNotSerializable, TypeError)
    assert issubclass(ReturnValueNotSerializable, TasksPlusError)
    for enqueue in (
        lambda: tasks.add.enqueue(object(), 1),  # not storable
        lambda: tasks.add.enqueue(1),  # does not fit the signature
        lambda: tasks.add.enqueue_many([((object(), 1), {})]),
    ):
        try:
            enqueue()
        except TypeError as exc:  # code written to Django's contract
            assert isinstance(exc, InvalidTaskArguments)
        else:
            pytest.fail("the enqueue was accepted")
    assert not TaskRecord.objects.exists()


def test_unstorable_return_value_is_recorded_under_our_class(run_worker):
    result = tasks.returns_unstorable.enqueue()
    assert run_worker("--burst").returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1  # a TypeError now, still never retried
    assert result.errors[0].exception_class_path == (
        "django_tasks_plus.exceptions.ReturnValueNotSerializable"
    )


# -- item 16: an empty --worker-id ---------------------------------------------------------


@pytest.mark.parametrize("worker_id", ["", "   "])
def test_blank_worker_id_is_refused(tmp_path, worker_id):
    proc = subprocess.run(
        runtasks_command("--burst", "--worker-id", worker_id),
        env=worker_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2  # argparse's status for a bad option value
    assert "argument --worker-id: must not be empty or blank" in proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(CommandError, match="--worker-id must not be empty or blank"):
        call_command("runtasks", burst=True, worker_id=worker_id)


# -- item 18: the app left out of INSTALLED_APPS --------------------------------------------


def test_enqueue_without_the_app_says_to_install_it():
    apps = ["django.contrib.contenttypes", "django.contrib.auth"]
    with override_settings(INSTALLED_APPS=apps), pytest.raises(InvalidBackendOptions) as info:
        tasks.add.enqueue(1, 2)
    assert "add 'django_tasks_plus' to INSTALLED_APPS" in str(info.value)
    assert not TaskRecord.objects.exists()


def test_enqueue_without_the_app_in_a_real_process(tmp_path):
    proc = manage(
        tmp_path,
        "without-app",
        "shell",
        "-c",
        "from example.tasks import add; add.enqueue(1, 2)",
    )
    assert proc.returncode != 0
    assert "InvalidBackendOptions" in proc.stderr
    assert "add 'django_tasks_plus' to INSTALLED_APPS" in proc.stderr
    assert "app_label" not in proc.stderr


def test_check_reports_the_missing_app(tmp_path):
    proc = manage(tmp_path, "without-app-tasks-at-startup", "check")
    assert proc.returncode == 1
    assert "(django_tasks_plus.E001)" in proc.stderr
    assert "'django_tasks_plus' is not in INSTALLED_APPS" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- item 19: a typo in OPTIONS -------------------------------------------------------------


def test_options_typo_is_a_command_error_not_a_traceback(tmp_path):
    proc = manage(tmp_path, "options-typo", "runtasks", "--burst")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("CommandError: Task backend 'default': TASKS['default']['OPTIONS']")
    assert "unknown key 'CONCURENCY'. Did you mean 'CONCURRENCY'?" in lines[0]


def test_the_worker_shows_the_callers_run_after_to_the_task(run_worker):
    """``TaskContext.task_result.task.run_after`` inside the worker is the caller's value
    too: ``None`` without one, the given time with one (not the row's due time)."""
    asap = tasks.reports_run_after.enqueue()
    given = timezone.now() - dt.timedelta(seconds=5)
    timed = tasks.reports_run_after.using(run_after=given).enqueue()
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr
    asap.refresh()
    timed.refresh()
    assert asap.return_value is None
    assert dt.datetime.fromisoformat(timed.return_value) == given
