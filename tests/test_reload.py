"""``runtasks --reload``: a real worker restarted by a real file change."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_tasks_plus.models import WorkerRecord
from tests import tasks
from tests.conftest import MANAGE, wait_for, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

BANNER = re.compile(r"^django-tasks-plus worker (\S+)$", re.MULTILINE)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder standing for the project's code, where the reloader runs and watches."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mytasks.py").write_text("VERSION = 1\n")
    return folder


@pytest.fixture
def reloading(tmp_path: Path, project: Path) -> Iterator[subprocess.Popen[str]]:
    log = open(tmp_path / "reload.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(MANAGE), "runtasks", "--reload", "--queue", "*"],
        cwd=project,
        env=worker_env(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    log.close()


def output(tmp_path: Path) -> str:
    return (tmp_path / "reload.log").read_text()


def test_a_changed_python_file_restarts_the_worker(tmp_path, project, reloading):
    wait_for(lambda: len(BANNER.findall(output(tmp_path))) == 1, timeout=60)
    assert f"watching the Python files under {project}" in output(tmp_path)
    first = BANNER.findall(output(tmp_path))[0]

    # A file that is not Python does not count.
    (project / "notes.txt").write_text("nothing to see\n")
    (project / "mytasks.py").write_text("VERSION = 2\n")
    wait_for(lambda: len(BANNER.findall(output(tmp_path))) == 2, timeout=60)
    log = output(tmp_path)
    assert "Changed: mytasks.py; restarting the worker." in log
    second = BANNER.findall(log)[1]
    assert second != first  # a new process: the default worker id holds the pid
    assert first.split("-")[-2] != second.split("-")[-2]

    # The restarted worker runs tasks.
    result = tasks.add.enqueue(20, 22)
    wait_for(lambda: result.refresh() or result.status == "SUCCESSFUL", timeout=60)

    reloading.send_signal(signal.SIGTERM)
    assert reloading.wait(timeout=60) == 0
    log = output(tmp_path)
    assert "notes.txt" not in log
    # The child stopped too: nothing of the process group is left.
    with pytest.raises(ProcessLookupError):
        os.killpg(reloading.pid, 0)


def test_the_worker_stops_when_the_reloader_is_killed_outright(tmp_path, project, reloading):
    wait_for(lambda: WorkerRecord.objects.exists(), timeout=60)
    child = WorkerRecord.objects.get().pid
    try:
        os.kill(reloading.pid, signal.SIGKILL)  # the reloader only: nothing forwards a stop
        reloading.wait(timeout=10)
        # The worker finished as on SIGTERM: its row is gone with it.
        wait_for(lambda: not WorkerRecord.objects.exists(), timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    assert (
        f"[pid {child}] The supervisor that started this worker (pid {reloading.pid}) is gone"
        in output(tmp_path)
    )


def test_reload_refuses_burst(tmp_path, project):
    done = subprocess.run(
        [sys.executable, str(MANAGE), "runtasks", "--reload", "--burst"],
        cwd=project,
        env=worker_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().startswith("CommandError: --reload and --burst do not mix")


def test_reload_without_watchfiles_says_how_to_install_it(tmp_path, project):
    # A stand-in that fails to import, as when the package is not installed.
    missing = tmp_path / "no-watchfiles"
    (missing / "watchfiles").mkdir(parents=True)
    (missing / "watchfiles" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = worker_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(missing), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, str(MANAGE), "runtasks", "--reload"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "CommandError: runtasks --reload needs the watchfiles package: "
        "pip install 'django-tasks-plus[reload]'"
    )
