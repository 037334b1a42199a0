"""Only real tasks run, and a forged ``task_path`` never runs module code.

The rule (docs/tasks.md#where-tasks-live): a row's task path is resolved only if its
module is already imported or belongs to an installed app; any other path is refused
with ``TaskNotRegistered`` without importing anything. Whatever module code raises while
a task is resolved, ``SystemExit`` and other ``BaseException`` included, becomes
``TaskNotRegistered``: the worker, its reaper (on the heartbeat thread), ``get_result``
and the admin all see a bad row, never a dying process or thread.

Rows are forged by a raw ``UPDATE`` of ``task_path``, as a hand edit or an attacker with
write access to the table would do.
"""

from __future__ import annotations

import sys
import types
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus import TaskNotRegistered, TaskResultStatus
from django_tasks_plus.compat import task_backends
from django_tasks_plus.definition import resolve_task
from django_tasks_plus.models import TaskRecord, WorkerRecord
from example import tasks as example_tasks
from tests import tasks
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

EXITS = "tests.exits_on_import"
EXITS_MARKER = "exits-on-import-ran"  # the same name as tests.exits_on_import.MARKER
ZEN = "Beautiful is better than ugly"
NOT_REGISTERED = "django_tasks_plus.exceptions.TaskNotRegistered"
NOT_IN_APP = (
    "is not imported and is not part of an installed app; a worker runs only tasks "
    "defined in an installed app or in a module imported at startup"
)
CHANGELIST = "admin:django_tasks_plus_taskrecord_changelist"

# Forged path -> the exact dead-letter reason.
FORGED = {
    "this.x": f"'this.x' cannot be imported: module 'this' {NOT_IN_APP}.",
    f"{EXITS}.boom": f"'{EXITS}.boom' cannot be imported: module '{EXITS}' {NOT_IN_APP}.",
    "os.system": (
        "'os.system' is a builtin_function_or_method, not a task; only functions decorated "
        "with @task are run."
    ),
    "example.no_such_module.run": (
        "'example.no_such_module.run' cannot be imported: importing 'example.no_such_module' "
        "raised ModuleNotFoundError: No module named 'example.no_such_module'"
    ),
}


@pytest.fixture
def no_module_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Fail the test if ``this`` or ``tests.exits_on_import`` got imported by this process."""
    monkeypatch.setenv("DTP_TEST_MARKERS", str(tmp_path))
    this_before = "this" in sys.modules
    yield tmp_path
    assert EXITS not in sys.modules
    assert this_before or "this" not in sys.modules
    assert not (tmp_path / EXITS_MARKER).exists()


def set_task_path(task_id: object, path: str) -> None:
    """Forge a row: overwrite its task path behind the backend's back."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TaskRecord._meta.db_table} SET task_path = %s WHERE id = %s",
            [path, _pk(task_id)],
        )


def _pk(task_id: object) -> object:
    pk = uuid.UUID(str(task_id))
    return pk.hex if connection.vendor == "sqlite" else pk


def forged(path: str) -> str:
    """A READY row of ``tests.tasks.add`` whose task path now says ``path``."""
    result = tasks.add.enqueue(1, 2)
    set_task_path(result.id, path)
    return str(result.id)


def forged_expired_lease(path: str) -> str:
    """A RUNNING row naming ``path`` whose holder ('ghost') let its lease expire long ago.

    Forged in one transaction: a running worker must never see it READY in between (it
    would claim and dead-letter it, and the reaper would then add a second error)."""
    now = timezone.now()
    with transaction.atomic():
        task_id = forged(path)
        TaskRecord.objects.filter(pk=task_id).update(
            status=TaskResultStatus.RUNNING,
            attempt=1,
            lease_token=uuid.uuid4().hex,
            lease_expires_at=now - timedelta(hours=1),
            worker_ids=["ghost"],
            started_at=now - timedelta(hours=1),
            last_attempted_at=now - timedelta(hours=1),
        )
    return task_id


def assert_dead_lettered(task_id: str, reason: str) -> None:
    row = TaskRecord.objects.get(pk=task_id)
    assert row.status == TaskResultStatus.FAILED
    assert row.dead_letter_reason == reason
    assert [e["exception_class_path"] for e in row.errors] == [NOT_REGISTERED]


# -- resolve_task itself ----------------------------------------------------------------


def test_real_tasks_resolve():
    assert resolve_task("tests.tasks.add") is tasks.add
    assert resolve_task("example.tasks.add") is example_tasks.add


@pytest.mark.parametrize("path", sorted(FORGED))
def test_forged_paths_run_no_module_code(path, no_module_code, capsys):
    with pytest.raises(TaskNotRegistered) as info:
        resolve_task(path)
    assert str(info.value) == FORGED[path]
    assert ZEN not in capsys.readouterr().out


@pytest.mark.parametrize(
    "path", ["", "nodots", "tests..add", ".tasks.add", "tests.tasks.add()", "os.system;id", "ö."]
)
def test_paths_that_are_not_dotted_names(path, no_module_code):
    with pytest.raises(TaskNotRegistered) as info:
        resolve_task(path)
    assert str(info.value) == (
        f"{path!r} cannot be imported: a task path is a dotted name 'module.function'."
    )


@pytest.mark.parametrize(
    ("body", "raised"),
    [
        ("import sys\nsys.exit(2)\n", "SystemExit: 2"),
        ("raise KeyboardInterrupt('from module code')\n", "KeyboardInterrupt: from module code"),
        ("raise GeneratorExit\n", "GeneratorExit"),
        ("raise RuntimeError('broken module')\n", "RuntimeError: broken module"),
        (
            "class Loud(Exception):\n    def __str__(self):\n        raise SystemExit(3)\n"
            "raise Loud\n",
            "Loud (its message could not be formatted)",
        ),
    ],
    ids=["sys-exit", "keyboard-interrupt", "generator-exit", "runtime-error", "unprintable"],
)
def test_module_code_raising_anything_is_a_bad_row(body, raised, tmp_path, monkeypatch):
    """Modules of installed apps are imported; whatever their code raises is caught."""
    app = f"dtp_hostile_{uuid.uuid4().hex[:8]}"
    (tmp_path / app).mkdir()
    (tmp_path / app / "__init__.py").write_text("")
    (tmp_path / app / "tasks.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with override_settings(INSTALLED_APPS=[*_installed_apps(), app]):
            with pytest.raises(TaskNotRegistered) as info:
                resolve_task(f"{app}.tasks.run")
            # The same for get_result(), which names the task id too.
            task_id = forged(f"{app}.tasks.run")
            with pytest.raises(TaskNotRegistered, match="not a task in this codebase"):
                task_backends["default"].get_result(task_id)
    finally:
        for name in [name for name in sys.modules if name.startswith(app)]:
            del sys.modules[name]
    assert str(info.value) == (
        f"'{app}.tasks.run' cannot be imported: importing '{app}.tasks' raised {raised}"
    )


def _installed_apps() -> list[str]:
    from django.conf import settings

    return list(settings.INSTALLED_APPS)


def test_module_getattr_is_never_called(monkeypatch):
    """A module's ``__getattr__`` is its own code: resolution reads the module's namespace."""
    module = types.ModuleType("tests.hostile_getattr")

    def __getattr__(name: str) -> object:
        if name.startswith("__"):  # inspect and pytest probe dunders of every module
            raise AttributeError(name)
        raise KeyboardInterrupt(f"__getattr__({name!r}) ran")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "tests.hostile_getattr", module)
    with pytest.raises(TaskNotRegistered) as info:
        resolve_task("tests.hostile_getattr.run")
    assert str(info.value) == (
        "'tests.hostile_getattr.run' cannot be imported: module 'tests.hostile_getattr' "
        "defines no 'run'."
    )


# -- get_result and the admin -------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FORGED))
def test_get_result_raises_task_not_registered(path, no_module_code):
    task_id = forged(path)
    with pytest.raises(TaskNotRegistered) as info:
        task_backends["default"].get_result(task_id)
    assert str(info.value) == (
        f"Task result {task_id} names {path!r}, which is not a task in this codebase: "
        f"{FORGED[path]}"
    )


def test_admin_cancel_and_redrive_forged_rows(admin_client, no_module_code):
    """The admin's web request gets a normal response, not the process's exit."""
    ready = forged(f"{EXITS}.boom")
    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "cancel_tasks", "_selected_action": [ready], "index": "0"},
        follow=True,
    )
    assert response.status_code == 200
    assert "1 task cancelled" in response.content.decode()
    row = TaskRecord.objects.get(pk=ready)
    assert (row.status, row.dead_letter_reason) == (TaskResultStatus.FAILED, "cancelled")

    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "redrive_tasks", "_selected_action": [ready], "index": "0"},
        follow=True,
    )
    assert response.status_code == 200
    assert "1 task redriven" in response.content.decode()
    assert TaskRecord.objects.get(pk=ready).status == TaskResultStatus.READY


# -- real workers -----------------------------------------------------------------------------


def test_worker_dead_letters_forged_rows_and_runs_the_rest(run_worker, markers):
    forged_ids = {path: forged(path) for path in FORGED}
    good = tasks.add.enqueue(20, 22)
    # example.tasks is not imported at worker start: it resolves because `example` is an
    # installed app.
    in_app = example_tasks.add.enqueue(3, 4)
    proc = run_worker("--burst", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    assert ZEN not in proc.stdout + proc.stderr
    assert not (markers / EXITS_MARKER).exists()
    for result, value in ((good, 42), (in_app, 7)):
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, value)
    for path, task_id in forged_ids.items():
        assert_dead_lettered(task_id, FORGED[path])


def test_reaper_on_the_heartbeat_thread_survives_forged_rows(start_worker, markers):
    """Expired leases of forged rows are dead-lettered; the heartbeat keeps beating."""
    worker = start_worker("--concurrency", "1", "--visibility-timeout", "1", "--worker-id", "w1")
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="w1").exists())
    # Forged after the start-up reap, so the heartbeat thread's reaper meets them.
    expired = {path: forged_expired_lease(path) for path in ("this.x", f"{EXITS}.boom")}
    wait_for(
        lambda: not TaskRecord.objects.filter(status=TaskResultStatus.RUNNING).exists(),
        timeout=30,
    )
    for path, task_id in expired.items():
        row = TaskRecord.objects.get(pk=task_id)
        assert row.dead_letter_reason == FORGED[path]
        assert row.status == TaskResultStatus.FAILED
        assert [e["exception_class_path"] for e in row.errors] == [NOT_REGISTERED]
    assert not (markers / EXITS_MARKER).exists()

    beat = WorkerRecord.objects.get(worker_id="w1").last_heartbeat_at
    later = tasks.add.enqueue(2, 3)
    wait_for(lambda: TaskRecord.objects.get(pk=later.id).status == TaskResultStatus.SUCCESSFUL)
    wait_for(lambda: WorkerRecord.objects.get(worker_id="w1").last_heartbeat_at > beat)
    assert worker.poll() is None
