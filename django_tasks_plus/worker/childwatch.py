"""The supervisor's watch over its worker processes: forward stop signals, restart a child
that dies unexpectedly, return the worst exit status once all have exited.

Standard library only, on purpose. ``runtasks --processes N`` forks its children from a
process that has loaded Django (so they share those pages), then replaces itself with
this file run as a script (``python -I -S childwatch.py WORKER_ID…``, the rest in
``SUPERVISOR_STATE``): a supervisor that holds no copy of Django. One that stayed Django
kept about 12 MB of pages only it still held (every page its children had written was
copied into them) plus its share of the rest (docs/performance.md, "The workers'
memory"). A child it restarts is therefore started afresh, by running the original
command line again with ``RELAUNCHED_WORKER`` naming the worker it replaces.

Imported by ``supervisor.py`` too, where the Django process watches its children itself
(``call_command``, or when the interpreter cannot be run again).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType

# Small modules only: ``logging`` and ``json`` would add 3.3 MB to the lean supervisor's
# private memory (so its restart line is written by hand, its state as plain text).

RESTART_DELAY_MAX = 30.0
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})

# Set in a restarted child's environment: "<index> <worker id>", the worker it replaces.
RELAUNCHED_WORKER = "DJANGO_TASKS_PLUS_RELAUNCHED_WORKER"
# Set in the environment of a worker started by a supervisor (a restarted child, the
# ``--reload`` child): the supervisor's pid, so that the worker stops when it is gone
# (``WorkerConfig.supervisor_pid``). Forked children are told directly.
SUPERVISOR_PID = "DJANGO_TASKS_PLUS_SUPERVISOR_PID"
# The lean supervisor's state (``relaunch_payload``), handed over in its environment and
# taken out of it at once: its command line names only the workers (what ``ps`` shows).
SUPERVISOR_STATE = "DJANGO_TASKS_PLUS_SUPERVISOR_STATE"


class ChildWatch:
    """The running children (pid -> index) and whether a stop was asked for."""

    def __init__(self, children: dict[int, int] | None = None) -> None:
        self.children: dict[int, int] = dict(children or {})
        self.stopping = False

    def take_stop_signals(self) -> None:
        """Handle SIGTERM/SIGINT with ``forward`` from now on, and let through any held
        (blocked) until now: one that arrived meanwhile is delivered here."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.forward)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def forward(self, signum: int, frame: FrameType | None = None) -> None:
        """A stop signal: pass it on to every child, and restart none from now on."""
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):  # exited: waited for below
                os.kill(pid, signum)

    def run(
        self, spawn: Callable[[int], int], *, restart: bool, report: Callable[[str], None]
    ) -> int:
        """Wait for the children; ``spawn(index)`` starts a replacement and returns its
        pid, ``report`` logs each restart as an error. Returns the worst exit status (a
        signal's number for a child it killed)."""
        worst = 0
        delays: dict[int, float] = {}
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            index = self.children.pop(pid, None)
            if index is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if self.stopping or not restart or code == 0:
                worst = max(worst, abs(code))
                continue
            delay = min(RESTART_DELAY_MAX, delays.get(index, 0.5) * 2)
            delays[index] = delay
            report(
                f"Worker process {index} (pid {pid}) exited with {code}; "
                f"restarting in {delay:.1f} s."
            )
            time.sleep(delay)
            if self.stopping:
                continue
            try:
                self.children[spawn(index)] = index
            except OSError as exc:  # no process to start (fork refused, program gone)
                report(
                    f"Worker process {index} could not be restarted ({exc}); the others "
                    f"go on, and this supervisor will exit with {code}."
                )
                worst = max(worst, abs(code))
        return worst


def relaunch_payload(
    children: dict[int, int], *, restart: bool, command: Sequence[str], worker_ids: Sequence[str]
) -> str:
    """What the Django process hands the lean supervisor (``SUPERVISOR_STATE``), as four
    lines of plain text (``read_payload`` reads them): whether to restart, the children
    as ``pid:index``, then the command line and the worker ids, each string in hex (an
    argument may hold any character an environment variable can)."""
    return "\n".join(
        [
            "restart" if restart else "once",
            " ".join(f"{pid}:{index}" for pid, index in children.items()),
            " ".join(_hex(argument) for argument in command),
            " ".join(_hex(worker_id) for worker_id in worker_ids),
        ]
    )


def read_payload(payload: str) -> tuple[dict[int, int], bool, list[str], list[str]]:
    """``relaunch_payload``'s text back as (children, restart, command, worker ids)."""
    restart, children, command, worker_ids = payload.split("\n")
    pairs = (child.split(":") for child in children.split())
    return (
        {int(pid): int(index) for pid, index in pairs},
        restart == "restart",
        [_unhex(argument) for argument in command.split()],
        [_unhex(worker_id) for worker_id in worker_ids.split()],
    )


def _hex(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").hex()


def _unhex(digits: str) -> str:
    return bytes.fromhex(digits).decode("utf-8", "surrogateescape")


def report_to_stderr(message: str) -> None:
    """An error line in the worker's default log format (runtasks' ``_configure_logging``):
    the lean supervisor has no Django, so the project's ``LOGGING`` does not reach it."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    sys.stderr.write(
        f"{stamp},{int(now % 1 * 1000):03d} ERROR django_tasks_plus.worker "
        f"[pid {os.getpid()}] {message}\n"
    )
    sys.stderr.flush()


def lean_supervisor_runnable() -> bool:
    """Whether this file can be run by path with ``sys.executable``: not in a frozen
    application (whose executable is the application) nor from a zip archive."""
    return not getattr(sys, "frozen", False) and os.path.isfile(__file__)


def lean_supervisor_argv(worker_ids: Sequence[str]) -> list[str]:
    """This file run by the same interpreter, isolated (``-I``: no ``PYTHON*`` variables,
    no user site, nothing of the current directory on the path) and without ``site``
    (``-S``): the standard library alone, whatever the project's path holds. The worker
    ids are there for ``ps`` to show."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *worker_ids]


def main() -> int:
    """The lean supervisor: watch the children the Django process forked before it
    replaced itself with this one. Stop signals were blocked across the exec, so one
    that arrived meanwhile is pending and delivered here, once the handlers are set."""
    children, restart, command, worker_ids = read_payload(os.environ.pop(SUPERVISOR_STATE))
    watch = ChildWatch(children)

    def relaunch(index: int) -> int:
        env = {
            **os.environ,
            RELAUNCHED_WORKER: f"{index} {worker_ids[index]}",
            SUPERVISOR_PID: str(os.getpid()),
        }
        return os.posix_spawn(command[0], command, env)

    watch.take_stop_signals()
    return watch.run(relaunch, restart=restart, report=report_to_stderr)


if __name__ == "__main__":
    sys.exit(main())
