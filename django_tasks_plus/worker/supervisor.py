"""``runtasks --processes P``: fork P worker processes and keep them running.

The supervisor forwards SIGTERM/SIGINT to its children (a second signal makes them exit
at once), restarts a child that dies unexpectedly, and exits when all children have.
Database connections are closed before forking so no child inherits a shared socket.
Objects that exist before the fork are frozen out of the garbage collector's reach: a busy
child's collections would otherwise write to every one of them and turn the pages it
shares with the supervisor into private copies (measured: a third more memory).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType

from django.db import connections

logger = logging.getLogger("django_tasks_plus.worker")

RESTART_DELAY_MAX = 30.0


def supervise(processes: int, run_child: Callable[[int], int], *, restart: bool) -> int:
    """Run ``run_child(index)`` in ``processes`` forked children; return the worst exit code."""
    stopping = False
    children: dict[int, int] = {}  # pid -> index
    worst = 0

    def spawn(index: int) -> None:
        connections.close_all()
        pid = os.fork()
        if pid == 0:  # child
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 1
            try:
                code = run_child(index)
            except BaseException:
                logger.exception("Worker process %d crashed", index)
            finally:
                os._exit(code)
        children[pid] = index

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    gc.collect()
    gc.freeze()
    for slot in range(processes):
        spawn(slot)
    restarts: dict[int, float] = {}
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        index = children.pop(pid, None)
        if index is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if stopping or not restart or code == 0:
            worst = max(worst, abs(code))
            continue
        delay = min(RESTART_DELAY_MAX, restarts.get(index, 0.5) * 2)
        restarts[index] = delay
        logger.error(
            "Worker process %d (pid %d) exited with %d; restarting in %.1f s.",
            index,
            pid,
            code,
            delay,
        )
        time.sleep(delay)
        if not stopping:
            spawn(index)
    return worst
