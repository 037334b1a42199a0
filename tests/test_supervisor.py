"""``runtasks --processes N``: the Django process forks the workers, then becomes the lean
supervisor (``worker/childwatch.py``, standard library only), which forwards stop signals
and restarts a worker that dies by running the command line again. Real processes and
real signals; the in-process watch (``call_command``, or when the interpreter cannot be
run again) with real forks."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import TaskRecord, WorkerRecord
from django_tasks_plus.worker.childwatch import (
    RELAUNCHED_WORKER,
    SUPERVISOR_PID,
    ChildWatch,
    read_payload,
    relaunch_payload,
)
from django_tasks_plus.worker.supervisor import Relaunch, supervise
from tests import tasks
from tests.conftest import wait_for, worker_log

pytestmark = pytest.mark.django_db(transaction=True)

# Forking a test process that has threads (the suite's) makes Python warn; the children
# forked here only sleep or return a number, touching no lock.
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"


def _pids(prefix: str) -> dict[str, int]:
    rows = WorkerRecord.objects.filter(worker_id__startswith=prefix)
    return dict(rows.values_list("worker_id", "pid"))


def _stat(pid: int) -> list[str]:
    # /proc/PID/stat: "pid (comm) state ppid …"; comm may hold spaces, so split after it.
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _parent_of(pid: int) -> int:
    return int(_stat(pid)[1])


def _resident_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def _start_two(start_worker, worker_id: str):  # type: ignore[no-untyped-def]
    proc = start_worker("--processes", "2", "--worker-id", worker_id, "--concurrency", "2")
    wait_for(lambda: len(_pids(worker_id)) == 2, timeout=60, seen=lambda: _pids(worker_id))
    return proc


def test_the_workers_run_under_a_supervisor_that_holds_no_django(start_worker):
    proc = _start_two(start_worker, "lean")

    def cmdline() -> list[str]:
        return Path(f"/proc/{proc.pid}/cmdline").read_text().split("\0")

    wait_for(lambda: "-I" in cmdline(), timeout=30, seen=cmdline)  # the exec is done
    command = cmdline()
    assert command[1:3] == ["-I", "-S"] and command[3].endswith("worker/childwatch.py")
    assert command[4:6] == ["lean-0", "lean-1"]  # what ps shows: the workers it watches
    workers = _pids("lean")
    assert {_parent_of(pid) for pid in workers.values()} == {proc.pid}  # the same process
    # A bare interpreter beside two that loaded Django, the project and the worker.
    assert all(_resident_kb(proc.pid) * 2 < _resident_kb(pid) for pid in workers.values())

    results = [tasks.add.enqueue(n, n) for n in range(10)]
    wait_for(
        lambda: TaskRecord.objects.filter(status=TaskResultStatus.SUCCESSFUL).count() == 10, 60
    )
    assert sorted(TaskRecord.objects.get(pk=r.id).return_value for r in results) == [
        2 * n for n in range(10)
    ]


def test_a_worker_that_dies_is_started_again_under_its_own_worker_id(start_worker, tmp_path):
    proc = _start_two(start_worker, "again")
    dead = _pids("again")["again-1"]
    os.kill(dead, signal.SIGKILL)
    wait_for(
        lambda: _pids("again").get("again-1") not in (None, dead),
        timeout=60,
        seen=lambda: _pids("again"),
    )
    reborn = _pids("again")["again-1"]
    assert _parent_of(reborn) == proc.pid
    log = worker_log(tmp_path)
    assert f"Worker process 1 (pid {dead}) exited with -9; restarting in 1.0 s." in log
    assert log.count("django-tasks-plus worker again") == 1  # no second banner
    # It works: with the other worker stopped, it runs what is enqueued now.
    os.kill(_pids("again")["again-0"], signal.SIGTERM)
    wait_for(lambda: "again-0" not in _pids("again"), timeout=60)
    result = tasks.add.enqueue(20, 22)
    wait_for(lambda: result.refresh() or result.status == TaskResultStatus.SUCCESSFUL, 60)
    assert result.worker_ids == ["again-1"]
    assert proc.poll() is None  # a worker that exited 0 is not restarted; the other runs


def test_a_stop_signal_to_the_supervisor_alone_stops_every_worker_gracefully(
    start_worker, tmp_path
):
    proc = _start_two(start_worker, "stop")
    workers = _pids("stop")
    os.kill(proc.pid, signal.SIGTERM)  # the supervisor only, not its process group
    assert proc.wait(timeout=60) == 0
    assert _pids("stop") == {}  # each worker removed its row on its way out
    log = worker_log(tmp_path)
    for pid in workers.values():
        assert f"[pid {pid}] Received SIGTERM: finishing running tasks" in log


def _exited(pid: int) -> bool:
    """Gone, or a zombie: the orphan's new parent (whatever this machine's init is) may
    not reap it at once."""
    try:
        return _stat(pid)[0] == "Z"
    except FileNotFoundError:
        return True


def test_workers_whose_supervisor_is_killed_outright_finish_their_tasks_and_stop(
    start_worker, tmp_path
):
    proc = _start_two(start_worker, "orphan")
    # One worker restarted by the lean supervisor (told its pid in its environment) and
    # one forked before the exec (told directly).
    dead = _pids("orphan")["orphan-1"]
    os.kill(dead, signal.SIGKILL)
    wait_for(lambda: _pids("orphan").get("orphan-1") not in (None, dead), 60)
    workers = _pids("orphan")
    try:
        running = tasks.sleep_then_return.enqueue(2.0)
        wait_for(lambda: running.refresh() or running.status == TaskResultStatus.RUNNING, 60)
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor only: nothing forwards a stop
        proc.wait(timeout=10)
        wait_for(
            lambda: all(_exited(pid) for pid in workers.values()),
            timeout=60,
            seen=lambda: {pid: _exited(pid) for pid in workers.values()},
        )
    finally:
        for pid in workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # As on SIGTERM: the running task finished and was recorded, each row removed.
    running.refresh()
    assert running.status == TaskResultStatus.SUCCESSFUL
    assert running.return_value == 2.0
    assert _pids("orphan") == {}
    log = worker_log(tmp_path)
    for pid in workers.values():
        assert (
            f"[pid {pid}] The supervisor that started this worker (pid {proc.pid}) is gone: "
            "finishing running tasks" in log
        )


def test_a_supervisor_pid_that_is_not_runtasks_own_is_a_clear_error(run_worker):
    proc = run_worker("--burst", env={SUPERVISOR_PID: "me"})
    assert proc.returncode == 1
    assert f"{SUPERVISOR_PID}='me' is not a process id" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_worker_told_its_supervisor_is_init_accepts_it_and_stops_when_its_parent_is_not(
    run_worker,
):
    """A supervisor that is a container's init has pid 1: a worker it restarts is told so.
    This one's parent is the test process, as if pid 1 had died: it stops at once."""
    tasks.add.enqueue(1, 1)
    proc = run_worker("--worker-id", "told-1", env={SUPERVISOR_PID: "1"})
    assert proc.returncode == 0, proc.stderr
    assert "The supervisor that started this worker (pid 1) is gone" in proc.stderr
    assert TaskRecord.objects.get().status == TaskResultStatus.READY  # it claimed nothing


def test_the_state_handed_to_the_lean_supervisor_reads_back_as_it_was_written():
    command = [sys.executable, "manage.py", "runtasks", "--queue", "a b", "--worker-id", "é\t"]
    payload = relaunch_payload({41: 0, 42: 1}, restart=True, command=command, worker_ids=["x-0"])
    assert read_payload(payload) == ({41: 0, 42: 1}, True, command, ["x-0"])
    assert read_payload(relaunch_payload({}, restart=False, command=[], worker_ids=[])) == (
        {},
        False,
        [],
        [],
    )


@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_worker_that_cannot_be_restarted_leaves_the_watch_running_for_the_others():
    failing = os.fork()
    if failing == 0:
        os._exit(3)
    lasting = os.fork()
    if lasting == 0:
        time.sleep(1.0)
        os._exit(0)
    reports: list[str] = []

    def program_gone(index: int) -> int:
        raise FileNotFoundError(2, "No such file or directory", "/gone/python")

    watch = ChildWatch({failing: 0, lasting: 1})
    assert watch.run(program_gone, restart=True, report=reports.append) == 3
    assert watch.children == {}  # it waited for the lasting one too
    assert reports[1] == (
        "Worker process 0 could not be restarted ([Errno 2] No such file or directory: "
        "'/gone/python'); the others go on, and this supervisor will exit with 3."
    )


def test_a_relaunch_marker_that_is_not_runtasks_own_is_a_clear_error(run_worker):
    proc = run_worker("--burst", env={RELAUNCHED_WORKER: "not a worker"})
    assert proc.returncode == 1
    assert f"{RELAUNCHED_WORKER}='not a worker' is not '<index> <worker id>'" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the watch in the Django process (real forks of this test process) --------------------


@pytest.fixture
def forking_here() -> Iterator[None]:
    """supervise() sets stop-signal handlers and freezes the garbage collector's objects
    in this process: put both back."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    gc.unfreeze()
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@pytest.mark.filterwarnings(FORK_WARNING)
def test_without_a_command_to_relaunch_the_django_process_watches_its_children(forking_here):
    assert supervise(3, lambda index: index + 4, restart=False) == 6  # the worst status


@pytest.mark.filterwarnings(FORK_WARNING)
def test_the_watch_in_this_process_restarts_a_failed_child_by_forking_again(forking_here, tmp_path):
    def fails_once(index: int) -> int:
        marker = tmp_path / f"ran-{index}"
        if marker.exists():
            return 0
        marker.touch()
        return 3

    assert supervise(2, fails_once, restart=True) == 0  # each ran twice, then exited 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ran-0", "ran-1"]


@pytest.mark.filterwarnings(FORK_WARNING)
def test_an_interpreter_that_cannot_be_run_again_leaves_the_watch_in_this_process(
    forking_here, monkeypatch, caplog
):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    relaunch = Relaunch(command=["/nonexistent/python"], worker_ids=["a-0", "a-1"])
    assert supervise(2, lambda index: 3, restart=False, relaunch=relaunch) == 3
    assert "Could not start the lean supervisor (FileNotFoundError" in caplog.text
    # The stop signals it held across the attempt are delivered again.
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
