"""Paths, environments and process-tree probes shared by the benchmark scripts.

Everything here is free of Django imports, so the orchestrator (``run.py``) and the
bare-psycopg baselines can use it without configuring settings.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TESTPROJECT = REPO / "testproject"
MANAGE = TESTPROJECT / "manage.py"
RESULTS = BENCH / "results"

PG_SERVER = "postgresql://root@127.0.0.1:5432"
PG_DATABASE = os.environ.get("BENCH_DATABASE", "bench")  # another name: runs side by side
PG_URL = f"postgres://root@127.0.0.1:5432/{PG_DATABASE}"
PG_DSN = f"{PG_SERVER}/{PG_DATABASE}"
REDIS_SERVER = "redis://127.0.0.1:6379"  # the Celery peer's broker and result backend


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


def run_for_json(
    command: Sequence[str],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run one measuring process; return the last JSON object line of its output (tools
    such as py-spy print lines of their own). A failure raises ``RuntimeError`` naming
    ``what`` with the end of its stderr; a timeout, ``subprocess.TimeoutExpired``."""
    import json

    done = subprocess.run(
        list(command),
        env=None if env is None else dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{what} printed no JSON result:\n{done.stdout[-3000:]}")
    return dict(json.loads(lines[-1]))


def recreate_database(name: str) -> None:
    """Drop the PostgreSQL database ``name`` (ending its sessions) and create it empty."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def migrated_database(name: str) -> dict[str, str]:
    """A new, migrated database ``name`` for this checkout (bytecode written first), and
    the environment of a Django process that uses it."""
    recreate_database(name)
    precompile(REPO)
    env = django_env(f"postgres://root@127.0.0.1:5432/{name}")
    manage = [sys.executable, str(TESTPROJECT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True)
    return env


def precompile(checkout: Path = REPO) -> None:
    """Write the bytecode of a checkout's package and test project before timing anything.

    With ``PYTHONDONTWRITEBYTECODE`` set (as in some shells and CI images) every process
    would compile the package from source at start: about a second of CPU per worker
    process on this machine, which no installed deployment pays.
    """
    import compileall

    for folder in ("django_tasks_plus", "testproject", "bench"):
        compileall.compile_dir(str(checkout / folder), quiet=1)


def runtasks_command(*options: str) -> list[str]:
    """``manage.py runtasks -v0`` with the given options, run by this interpreter."""
    return [sys.executable, str(MANAGE), "runtasks", "-v", "0", *options]


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: an observed value, never an interpolation.

    (``statistics.quantiles`` interpolates between neighbours, so a p99 could be a latency
    that no task had.)
    """
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# -- process probes (psutil is imported here only: the peers' venvs import this module too,
# for the helpers above and below, and do not have it)


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of all CPUs since boot; busy is all but idle and iowait."""
    import psutil

    times = psutil.cpu_times()
    total = sum(times)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class BackgroundSampler:
    """A daemon thread that runs ``_loop`` from ``with`` entry to exit (every sampler of
    the bench): ``_loop`` samples until ``self._stop`` is set."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        raise NotImplementedError


class TreeRssSampler(BackgroundSampler):
    """Samples the summed RSS of a process tree in a background thread.

    The sum over-counts pages that forked children still share with the supervisor
    (copy-on-write), so it is an upper bound on real memory use; the summed PSS, sampled
    less often, splits shared pages and is the figure to read next to it.
    """

    PSS_EVERY = 5  # PSS walks the page tables: read it on every 5th sample only

    def __init__(self, root: int | Sequence[int], interval: float = 0.05) -> None:
        import psutil

        self.roots = [psutil.Process(pid) for pid in ([root] if isinstance(root, int) else root)]
        self.interval = interval
        self.peak_total = 0
        self.peak_pss = 0
        self.peak_single = 0
        self.peak_processes = 0
        self.samples = 0
        super().__init__()

    def _tree(self) -> list[Any]:
        """The roots and all their descendants alive right now (none of a root that exited)."""
        import psutil

        tree = []
        for root in self.roots:
            try:
                tree += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return tree

    def _loop(self) -> None:
        import psutil

        while not self._stop.is_set():
            with_pss = self.samples % self.PSS_EVERY == 0
            sizes, pss = [], 0
            for process in self._tree():
                try:
                    if with_pss:
                        memory = process.memory_full_info()
                        pss += memory.pss
                    else:
                        memory = process.memory_info()
                except psutil.Error:  # exited meanwhile, or not ours to read
                    continue
                sizes.append(memory.rss)
            if sizes:
                if with_pss:
                    self.peak_pss = max(self.peak_pss, pss)
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
        "mean_enqueue_ms": statistics.fmean(enqueue_seconds) * 1000,
        "tasks": len(delays),
    }


def phase_gaps(
    stamps: Sequence[float], phases: Mapping[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Per phase (name: (start, end)), the events' rate and the longest gap between two
    consecutive events (sorted ``stamps``) that overlaps it.

    A gap that spans a phase's edge counts in both phases, so a writer blocked for the
    whole of a short phase still shows that phase's stall even if no event ends in it.
    """
    figures = {}
    for name, (start, end) in phases.items():
        count = sum(1 for stamp in stamps if start < stamp <= end)
        gaps = [
            later - earlier
            for earlier, later in itertools.pairwise(stamps)
            if earlier < end and later > start
        ]
        figures[name] = {
            "seconds": end - start,
            "enqueues": count,
            "rate": count / (end - start) if end > start else 0.0,
            "longest_gap_ms": 1000 * max(gaps, default=0.0),
        }
    return figures
