"""Helpers shared by the peer drivers; standard library (and ``benchenv``) only.

A peer driver runs inside the peer's own virtualenv, so it cannot import our package or
anything the bench venv has. Each invocation does one measurement and prints one JSON
line, like ``bench/driver.py`` does for django-tasks-plus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from benchenv import TreeRssSampler, wait_until

Workload = Callable[[argparse.Namespace], dict[str, Any]]
T = TypeVar("T")


@dataclass
class Workers:
    """Worker processes of a peer, started together and always stopped together.

    They stay in the driver's process group, so the orchestrator can kill the whole group
    if the driver itself hangs; ``stop`` is the polite path (SIGTERM, then SIGKILL).
    """

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    folder: tempfile.TemporaryDirectory[str] = field(
        default_factory=lambda: tempfile.TemporaryDirectory(prefix="peer-workers-")
    )
    sampler: TreeRssSampler | None = None

    def start(self, command: Sequence[str], count: int) -> None:
        """Start ``count`` copies of ``command`` with this driver's environment.

        The memory of every worker process and its children (a supervisor's forked pool
        included) is sampled from here until ``memory()`` or ``stop``, as for our worker.
        """
        for _ in range(count):
            path = Path(self.folder.name) / f"worker-{len(self.logs)}.log"
            self.logs.append(path)
            with path.open("wb") as log:  # the child keeps its own copy of the descriptor
                self.processes.append(
                    subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
                )
        self._stop_sampling()
        self.sampler = TreeRssSampler([process.pid for process in self.processes]).__enter__()

    def _stop_sampling(self) -> None:
        if self.sampler is not None:
            self.sampler.__exit__(None, None, None)

    def memory(self) -> dict[str, float]:
        """Peak summed RSS and PSS of the workers so far (``peak_rss_mb``, ``peak_pss_mb``)."""
        if self.sampler is None:
            return {}
        self._stop_sampling()
        return dict(self.sampler.summary())

    def check_alive(self) -> None:
        """Fail fast when a worker died instead of waiting for the timeout."""
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a worker exited {process.returncode}: {self.log_tail()}")

    def log_tail(self, size: int = 300) -> str:
        """The workers' stderr, on one line so it survives into the orchestrator's report."""
        text = " ".join(path.read_text(errors="replace") for path in self.logs if path.exists())
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-size:]

    def stop(self, grace: float = 15.0) -> None:
        self._stop_sampling()
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.folder.cleanup()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class Loop:
    """An event loop driven from sync code, for peers whose client API is async.

    ``run(coroutine)`` completes one call at a time on a loop kept open across calls (so
    an async connection or pool stays bound to it), and the sync timing and pacing helpers
    shared by every driver work unchanged.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.loop.close()


def wait_done(
    workers: Workers, done: Callable[[], bool], timeout: float, what: str, interval: float = 0.1
) -> None:
    """Poll ``done()`` until true; raise with the workers' stderr on timeout or death."""

    def ready() -> bool:
        workers.check_alive()
        return done()

    if not wait_until(ready, timeout=timeout, interval=interval):
        raise RuntimeError(f"{what} not done after {timeout:.0f} s: {workers.log_tail()}")


def timed_drain(
    command: Sequence[str], count: int, done: Callable[[], bool], timeout: float
) -> tuple[float, dict[str, float]]:
    """Start ``count`` worker processes of ``command`` over a queue filled beforehand and
    wait for ``done()``: the wall time from their start, and their peak memory."""
    with Workers() as workers:
        started = time.perf_counter()
        workers.start(command, count)
        wait_done(workers, done, timeout, "drain")
        wall = time.perf_counter() - started
        memory = workers.memory()
    return wall, memory


def timed(count: int, action: Callable[[], None]) -> dict[str, float]:
    """Rate of one timed block that handles ``count`` tasks."""
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    return {"rate": count / seconds, "seconds": seconds}


def drain_figures(
    count: int, wall: float, span: float | None, memory: dict[str, float] | None = None
) -> dict[str, Any]:
    """Same keys as our W2: ``rate`` is first start -> last finish, the other includes start;
    ``memory`` is ``Workers.memory()`` (peak RSS and PSS of the worker processes)."""
    result: dict[str, Any] = {
        "rate_with_start": count / wall,
        "wall_seconds": wall,
        **(memory or {}),
    }
    if span and span > 0:
        result.update(rate=count / span, steady_seconds=span)
    return result


def main(workloads: dict[str, Workload], description: str) -> None:
    """Parse the common options, run one workload, print its JSON line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("workload", choices=sorted(workloads))
    parser.add_argument("--tasks", type=int, default=2_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rate", type=float, default=50.0, help="latency enqueues per second")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on waiting for workers")
    args = parser.parse_args()
    try:
        result = workloads[args.workload](args)
    except Exception as error:
        traceback.print_exc()
        # The orchestrator reports the last stderr line: make it the reason, on one line.
        print(f"{type(error).__name__}: {error}".replace("\n", " ")[:400], file=sys.stderr)
        sys.exit(1)
    result["pid"] = os.getpid()
    print(json.dumps(result, default=str))
    sys.stdout.flush()
