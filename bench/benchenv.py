"""Paths, environments and process-tree probes shared by the benchmark scripts.

Everything here is free of Django imports, so the orchestrator (``run.py``) and the
bare-psycopg baselines can use it without configuring settings.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TESTPROJECT = REPO / "testproject"
MANAGE = TESTPROJECT / "manage.py"
RESULTS = BENCH / "results"

PG_SERVER = "postgresql://root@127.0.0.1:5432"
PG_DATABASE = "bench"
PG_URL = f"postgres://root@127.0.0.1:5432/{PG_DATABASE}"
PG_DSN = f"{PG_SERVER}/{PG_DATABASE}"

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def django_env(database_url: str) -> dict[str, str]:
    """Environment for every Django process of the bench (driver and workers).

    DEBUG stays off: with DEBUG on, Django keeps every query in memory and the test
    project logs every task, which would measure logging instead of the queue.
    """
    path = os.pathsep.join([str(REPO), str(TESTPROJECT), str(BENCH)])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": database_url,
        "DEBUG": "false",
        "TASKS_LOG_LEVEL": "WARNING",
    }


def runtasks_command(*options: str) -> list[str]:
    """``manage.py runtasks -v0`` with the given options, run by this interpreter."""
    return [sys.executable, str(MANAGE), "runtasks", "-v", "0", *options]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: an observed value, never an interpolation."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all threads), from /proc; empty once it has exited."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def _pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages split between the processes sharing them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants that are alive right now."""
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(_children(pid))
    return tree


class TreeRssSampler:
    """Samples the summed RSS of a process tree in a background thread.

    The sum over-counts pages that forked children still share with the supervisor
    (copy-on-write), so it is an upper bound on real memory use; the summed PSS, sampled
    less often, splits shared pages and is the figure to read next to it.
    """

    PSS_EVERY = 5  # smaps_rollup walks page tables: read it on every 5th sample only

    def __init__(self, root: int, interval: float = 0.05) -> None:
        self.root = root
        self.interval = interval
        self.peak_total = 0
        self.peak_pss = 0
        self.peak_single = 0
        self.peak_processes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeRssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            tree = process_tree(self.root)
            sizes = [size for size in map(_rss_bytes, tree) if size]
            if sizes:
                if self.samples % self.PSS_EVERY == 0:
                    self.peak_pss = max(self.peak_pss, sum(map(_pss_bytes, tree)))
                self.samples += 1
                self.peak_total = max(self.peak_total, sum(sizes))
                self.peak_single = max(self.peak_single, max(sizes))
                self.peak_processes = max(self.peak_processes, len(sizes))
            self._stop.wait(self.interval)

    def summary(self) -> Mapping[str, float]:
        mib = 1024 * 1024
        return {
            "peak_rss_mb": self.peak_total / mib,
            "peak_single_rss_mb": self.peak_single / mib,
            "peak_pss_mb": self.peak_pss / mib,
            "peak_processes": self.peak_processes,
            "rss_samples": self.samples,
        }


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def paced(count: int, rate: float, action: Callable[[int], None]) -> None:
    """Call ``action(i)`` ``count`` times on a fixed schedule of ``rate`` per second."""
    origin = time.perf_counter()
    for i in range(count):
        delay = origin + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        action(i)


def latency_figures(delays_ms: Iterable[float], enqueue_seconds: list[float]) -> dict[str, Any]:
    """W3's result keys, for our driver and the peers' alike."""
    delays = sorted(delays_ms)
    return {
        "p50_ms": percentile(delays, 0.50),
        "p95_ms": percentile(delays, 0.95),
        "p99_ms": percentile(delays, 0.99),
        "max_ms": delays[-1],
        "mean_enqueue_ms": sum(enqueue_seconds) / len(enqueue_seconds) * 1000,
        "tasks": len(delays),
    }
