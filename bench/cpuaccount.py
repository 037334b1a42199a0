"""CPU clocks of a process and of its PostgreSQL backend, read from /proc (standard library).

``account.py`` splits one enqueue between the client and the server, which run on the
same host: the client's own CPU comes from ``time.process_time`` and its backend's from
``/proc/<pid>/schedstat`` (nanoseconds on CPU; a backend is one thread), so a few
thousand calls give figures good to well under a microsecond each. Both our driver and
the peer's (``peer_drivers/pgqueuer_account.py``) import this, so both sides are timed
by the same loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> float:
    """CPU seconds of a single-threaded process (a PostgreSQL backend), to the nanosecond.

    ``schedstat`` counts the main thread only; ``stat`` (below) counts every thread but
    in clock ticks of 10 ms.
    """
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return process_cpu(pid)


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid``, in clock ticks."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def accounted_loop(call: Callable[[int], object], count: int, backend_pid: int) -> dict[str, Any]:
    """Call ``call(i)`` ``count`` times; wall, client CPU and backend CPU per call, in µs.

    The profiler keeps only the samples under this frame, so the process's start-up and
    warm-up stay out of the breakdown.
    """
    wall0, cpu0, server0 = time.perf_counter(), time.process_time(), thread_cpu(backend_pid)
    for i in range(count):
        call(i)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    server = thread_cpu(backend_pid) - server0
    return {
        "calls": count,
        "wall_us": wall * 1e6 / count,
        "client_cpu_us": cpu * 1e6 / count,
        "server_cpu_us": server * 1e6 / count,
        "backend_pid": backend_pid,
    }


def single_enqueues(
    call: Callable[[int], object], count: int, backend_pid: int, warmup: int = 200
) -> dict[str, Any]:
    """Warm caches and the connection up (untimed), then ``accounted_loop``."""
    for i in range(warmup):
        call(-1 - i)
    return accounted_loop(call, count, backend_pid)
