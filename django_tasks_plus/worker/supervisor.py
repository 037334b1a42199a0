"""``runtasks --processes P``: fork P worker processes and keep them running.

The supervisor forwards SIGTERM/SIGINT to its children (a second signal makes them exit
at once), restarts a child that dies unexpectedly, and exits when all children have
(``childwatch.py``). Database connections are closed before forking so no child inherits
a shared socket. Objects that exist before the fork are frozen out of the garbage
collector's reach: a busy child's collections would otherwise write to every one of them
and turn the pages it shares with the supervisor into private copies (measured: a third
more memory).

Once the children are forked, the supervisor replaces itself with the lean one
(``childwatch.py`` run as a script, no Django) when it was given a command to restart
children with (``relaunch``); otherwise (``call_command``, or an interpreter that cannot
be run again) it watches them itself.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import connections

from .childwatch import (
    STOP_SIGNALS,
    SUPERVISOR_STATE,
    ChildWatch,
    lean_supervisor_argv,
    relaunch_payload,
)

logger = logging.getLogger("django_tasks_plus.worker")


@dataclass(frozen=True)
class Relaunch:
    """How the lean supervisor starts a replacement child: the command line that started
    this one (``command``) and each child's worker id, by index."""

    command: Sequence[str]
    worker_ids: Sequence[str]


def supervise(
    processes: int,
    run_child: Callable[[int], int],
    *,
    restart: bool,
    relaunch: Relaunch | None = None,
) -> int:
    """Run ``run_child(index)`` in ``processes`` forked children; return the worst exit
    code. With ``relaunch``, this process becomes the lean supervisor and never returns."""
    watch = ChildWatch()
    if relaunch is None:
        watch.take_stop_signals()
    else:
        # Held until the lean supervisor sets its handlers: a stop asked for in between
        # waits for it instead of killing this process and orphaning the children.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def spawn(index: int) -> int:
        connections.close_all()
        pid = os.fork()
        if pid == 0:  # child
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            code = 1
            try:
                code = run_child(index)
            except BaseException:
                logger.exception("Worker process %d crashed", index)
            finally:
                os._exit(code)
        return pid

    gc.collect()
    gc.freeze()
    for index in range(processes):
        watch.children[spawn(index)] = index
    if relaunch is not None:
        _become_lean(watch, relaunch, restart=restart)
        # Still here: the interpreter could not be run again. Watch from this process.
        watch.take_stop_signals()
    return watch.run(spawn, restart=restart, report=logger.error)


def _become_lean(watch: ChildWatch, relaunch: Relaunch, *, restart: bool) -> None:
    """Replace this process with the lean supervisor (same pid, so the children stay
    its own); returns only if that failed, having logged why."""
    payload = relaunch_payload(
        watch.children,
        restart=restart,
        command=relaunch.command,
        worker_ids=relaunch.worker_ids,
    )
    argv = lean_supervisor_argv(relaunch.worker_ids)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], argv, {**os.environ, SUPERVISOR_STATE: payload})
    except OSError as exc:
        logger.warning(
            "Could not start the lean supervisor (%s: %s); this process supervises the "
            "workers itself, holding its copy of Django.",
            type(exc).__name__,
            exc,
        )
