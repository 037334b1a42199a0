"""Reading ``py-spy record --format raw`` output: where did the worker spend its samples?

Each raw line is ``frame;frame;...;leaf COUNT`` (outermost first). With
``--subprocesses`` the first frames name the processes (``process PID:"cmdline"``); they
are dropped, so samples from the two forked workers add up per function.
"""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_MARK = "django_tasks_plus/"

# Own samples are grouped by the first of these fragments found in the leaf frame. py-spy
# counts a thread blocked in a lock or a socket read as active, so waits come first: they
# say what a thread was waiting for, not what burnt CPU.
LAYERS = (
    ("wait: thread handoff", "Condition.wait (threading.py)"),
    ("wait: thread handoff", "_worker (concurrent/futures/thread.py)"),
    ("wait: thread handoff", "Event.wait (threading.py)"),
    ("wait: thread handoff", "Thread.join (threading.py)"),
    ("wait: database reply", "Connection.wait (psycopg/connection.py)"),
    ("wait: child processes", "run (django_tasks_plus/worker/childwatch.py)"),
    ("django_tasks_plus", "django_tasks_plus/"),
    ("psycopg", "psycopg"),
    ("django", "django/"),
    ("logging", "logging/"),
    ("threading/queue", "threading.py"),
    ("threading/queue", "queue.py"),
    ("threading/queue", "concurrent/futures"),
    ("json", "json/"),
)


@dataclass
class Profile:
    """Sample counts: own (leaf) per frame, inclusive per package frame, own per layer."""

    total: int = 0
    own: Counter[str] = field(default_factory=Counter)
    busy: Counter[str] = field(default_factory=Counter)
    package_inclusive: Counter[str] = field(default_factory=Counter)
    layers: Counter[str] = field(default_factory=Counter)

    def add(self, frames: list[str], count: int) -> None:
        if not frames:
            return
        self.total += count
        leaf = frames[-1]
        self.own[leaf] += count
        layer = layer_of(leaf)
        self.layers[layer] += count
        if not layer.startswith("wait:"):
            self.busy[leaf] += count
        for frame in set(frames):  # recursion must not count a sample twice
            if PACKAGE_MARK in frame:
                self.package_inclusive[frame] += count


def layer_of(frame: str) -> str:
    for name, fragment in LAYERS:
        if fragment in frame:
            return name
    return "other"


def find_pyspy() -> str | None:
    """py-spy on PATH, else next to this interpreter (inside a venv)."""
    found = shutil.which("py-spy")
    if found:
        return found
    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else None


def parse(path: Path) -> Profile:
    profile = Profile()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame for frame in stack.split(";") if not frame.startswith("process ")]
        profile.add(frames, int(count))
    return profile


def top(counter: Counter[str], total: int, limit: int) -> list[dict[str, object]]:
    return [
        {"frame": frame, "samples": samples, "percent": 100 * samples / total}
        for frame, samples in counter.most_common(limit)
    ]


def summary(profile: Profile, limit: int = 15) -> dict[str, object]:
    total = max(profile.total, 1)
    return {
        "samples": profile.total,
        "top_own": top(profile.own, total, limit),
        "top_own_busy": top(profile.busy, total, limit),
        "top_package_inclusive": top(profile.package_inclusive, total, limit),
        "own_by_layer": top(profile.layers, total, len(LAYERS)),
    }


def render(report: dict[str, object]) -> str:
    """Three short tables for the terminal."""
    lines = [f"py-spy: {report['samples']:,} samples of the drain worker (all its processes)"]
    sections = (
        ("top frames by own samples", "top_own"),
        ("top frames by own samples, waits left out (% of all samples)", "top_own_busy"),
        ("django_tasks_plus frames, inclusive", "top_package_inclusive"),
        ("own samples by layer", "own_by_layer"),
    )
    for title, key in sections:
        lines.append(f"\n  {title}:")
        for row in report[key]:  # type: ignore[attr-defined]
            lines.append(f"    {row['percent']:5.1f}%  {row['samples']:6,}  {row['frame']}")
    return "\n".join(lines)
