"""Issue #18's verdict over a set of peer runs: each target row as the median, over the
runs, of that run's ratio against its own peers.

```console
$ python bench/peerset.py                       # the three newest results with peers
$ python bench/peerset.py --last 5
$ python bench/peerset.py bench/results/A.json bench/results/B.json bench/results/C.json
```

Each run's ratio is taken against the peers of the same run, never against another run's,
because the machine's speed moves between runs more than the queues differ: it is the
``ours / theirs`` that ``run.py`` stored beside each peer's results (``peers.compare``). "Best peer"
is the fastest (or, for latency, the lowest) of the peers that ran that row in that run.
A run whose peer failed that row, or did not run it, is left out of the row's median;
the table's last column lists the runs that count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peers import METRICS
from report import ratio

RESULTS = Path(__file__).resolve().parent / "results"

Run = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One row of the issue: how a run's ratio is read, and the bar it must clear."""

    label: str
    ratio: Callable[[Run], tuple[float, str] | None]  # (ratio, against whom), or none
    bar: float
    higher_is_better: bool

    def met(self, value: float) -> bool:
        return value >= self.bar if self.higher_is_better else value <= self.bar


def _label(series: str, key: str) -> str:
    """The comparison ``peers.compare`` stores in a run for our ``series`` and ``key``."""
    return next(label for label, *_, ours, our_key in METRICS if (ours, our_key) == (series, key))


def _peer_ratios(run: Run, label: str) -> dict[str, float]:
    """Ours over each peer's figure for the comparison ``label``, as the run stored them
    (a peer that failed the workload has none), by peer name."""
    found: dict[str, float] = {}
    for peer in run.get("peers") or []:
        for entry in peer.get("compared") or []:
            value = entry.get("ours_vs_peer")
            if entry.get("metric") == label and isinstance(value, int | float):
                found[peer["name"]] = float(value)
    return found


def _against_best(
    series: str, key: str, *, higher_is_better: bool = True
) -> Callable[[Run], tuple[float, str] | None]:
    """Ours over the best peer of the same run: the one we compare worst with (the
    fastest, or the one with the lowest latency)."""
    label = _label(series, key)

    def ratio(run: Run) -> tuple[float, str] | None:
        ratios = _peer_ratios(run, label)
        if not ratios:
            return None
        best = (min if higher_is_better else max)(ratios, key=ratios.__getitem__)
        return ratios[best], best

    return ratio


def _against(peer: str, series: str, key: str) -> Callable[[Run], tuple[float, str] | None]:
    """Ours over one named peer's figure of the same run."""
    label = _label(series, key)

    def ratio(run: Run) -> tuple[float, str] | None:
        value = _peer_ratios(run, label).get(peer)
        return None if value is None else (value, peer)

    return ratio


def _share_of_bare(run: Run) -> tuple[float, str] | None:
    """W2's drain over the bare SKIP LOCKED loop measured in the same run."""
    drain = (run.get("postgresql") or {}).get("W2") or {}
    share = ratio((drain.get("median") or {}).get("rate"), drain.get("baseline_median_rate"))
    return None if share is None else (share, "bare loop")


TARGETS = (
    Target(
        "single enqueue() vs best peer",
        _against_best("W1a", "rate"),
        1.2,
        True,
    ),
    Target(
        "bulk enqueue vs pgqueuer",
        _against("pgqueuer", "W1b", "rate"),
        1.2,
        True,
    ),
    Target("drain vs pgqueuer", _against("pgqueuer", "W2", "rate"), 2.5, True),
    Target("drain / bare loop", _share_of_bare, 0.35, True),
    Target(
        "p50 at 50/s vs best peer",
        _against_best("W3", "p50_ms", higher_is_better=False),
        1.0,
        False,
    ),
    Target(
        "p99 at 50/s vs best peer",
        _against_best("W3", "p99_ms", higher_is_better=False),
        1.0,
        False,
    ),
    Target(
        "summed worker PSS vs pgqueuer",
        _against("pgqueuer", "W2", "peak_pss_mb"),
        1.0,
        False,
    ),
)


@dataclass(frozen=True)
class Verdict:
    label: str
    bar: str
    median: float | None
    met: bool | None
    per_run: tuple[str, ...]  # "2.38 (pgqueuer)" per run that had the row


def verdicts(runs: Sequence[Run]) -> list[Verdict]:
    """Each target's median over ``runs`` of the run's own ratio, and whether it is met."""
    found = []
    for target in TARGETS:
        ratios = [ratio for ratio in map(target.ratio, runs) if ratio is not None]
        median = statistics.median(value for value, _ in ratios) if ratios else None
        found.append(
            Verdict(
                label=target.label,
                bar=("≥ " if target.higher_is_better else "≤ ") + f"{target.bar:g}",
                median=median,
                met=None if median is None else target.met(median),
                per_run=tuple(f"{value:.2f} ({whom})" for value, whom in ratios),
            )
        )
    return found


def table(runs: Sequence[Run], names: Sequence[str]) -> str:
    lines = [
        f"Issue #18 over {len(runs)} run(s): {', '.join(names)}",
        "| row | target | median | verdict | per run |",
        "|---|---|---:|---|---|",
    ]
    for verdict in verdicts(runs):
        median = "-" if verdict.median is None else f"{verdict.median:.2f}"
        mark = {True: "met", False: "not met", None: "no data"}[verdict.met]
        per_run = ", ".join(verdict.per_run) or "-"
        lines.append(f"| {verdict.label} | {verdict.bar} | {median} | {mark} | {per_run} |")
    commits = sorted({str((run.get("meta") or {}).get("commit", "?"))[:10] for run in runs})
    lines.append(f"commits: {', '.join(commits)}")
    return "\n".join(lines)


def newest_with_peers(count: int) -> list[Path]:
    """The ``count`` newest result files of runs that measured peers, oldest first."""
    chosen: list[Path] = []
    for path in sorted(RESULTS.glob("2*.json"), reverse=True):
        if len(chosen) == count:
            break
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if run.get("peers"):
            chosen.append(path)
    return chosen[::-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path, help="result files (default: newest)")
    parser.add_argument("--last", type=int, default=3, help="how many newest runs (default 3)")
    args = parser.parse_args(argv)
    paths = args.results or newest_with_peers(args.last)
    if not paths:
        print(f"No results with peers in {RESULTS}; run `make bench-set` first.", file=sys.stderr)
        return 1
    runs = [json.loads(path.read_text()) for path in paths]
    print(table(runs, [path.name for path in paths]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
