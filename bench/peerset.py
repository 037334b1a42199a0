"""Issue #18's verdict over a set of peer runs: each target row as the median, over the
runs, of that run's ratio against its own peers.

```console
$ python bench/peerset.py                       # the three newest results with peers
$ python bench/peerset.py --last 5
$ python bench/peerset.py bench/results/A.json bench/results/B.json bench/results/C.json
```

Each run's ratio is taken against the peers of the same run, never against another run's,
because the machine's speed moves between runs more than the queues differ. "Best peer"
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


def _peer_results(run: Run, workload: str) -> dict[str, dict[str, Any]]:
    """Each peer's figures for ``workload`` in this run, by peer name (failed ones left out)."""
    found: dict[str, dict[str, Any]] = {}
    for peer in run.get("peers") or []:
        figures = (peer.get("results") or {}).get(workload)
        if isinstance(figures, dict) and workload not in (peer.get("errors") or {}):
            found[peer["name"]] = figures
    return found


def _ours(run: Run, series: str, key: str) -> float | None:
    median = (run.get("postgresql") or {}).get(series, {}).get("median") or {}
    value = median.get(key)
    return float(value) if isinstance(value, int | float) else None


def _against_best(
    series: str, workload: str, ours_key: str, theirs_key: str, *, lowest: bool = False
) -> Callable[[Run], tuple[float, str] | None]:
    """Ours over the best peer's figure of the same run (lowest for latency)."""

    def ratio(run: Run) -> tuple[float, str] | None:
        ours = _ours(run, series, ours_key)
        theirs = {
            name: float(figures[theirs_key])
            for name, figures in _peer_results(run, workload).items()
            if isinstance(figures.get(theirs_key), int | float) and figures[theirs_key] > 0
        }
        if ours is None or not theirs:
            return None
        pick = min if lowest else max
        best = pick(theirs, key=theirs.__getitem__)
        return ours / theirs[best], best

    return ratio


def _against(
    peer: str, series: str, workload: str, ours_key: str, theirs_key: str
) -> Callable[[Run], tuple[float, str] | None]:
    """Ours over one named peer's figure of the same run."""

    def ratio(run: Run) -> tuple[float, str] | None:
        ours = _ours(run, series, ours_key)
        figures = _peer_results(run, workload).get(peer) or {}
        theirs = figures.get(theirs_key)
        if ours is None or not isinstance(theirs, int | float) or theirs <= 0:
            return None
        return ours / float(theirs), peer

    return ratio


def _share_of_bare(run: Run) -> tuple[float, str] | None:
    """W2's drain over the bare SKIP LOCKED loop measured in the same run."""
    ours = _ours(run, "W2", "rate")
    bare = (run.get("postgresql") or {}).get("W2", {}).get("baseline_median_rate")
    if ours is None or not isinstance(bare, int | float) or bare <= 0:
        return None
    return ours / float(bare), "bare loop"


TARGETS = (
    Target(
        "single enqueue() vs best peer",
        _against_best("W1a", "enqueue-single", "rate", "rate"),
        1.2,
        True,
    ),
    Target(
        "bulk enqueue vs pgqueuer",
        _against("pgqueuer", "W1b", "enqueue-bulk", "rate", "rate"),
        1.2,
        True,
    ),
    Target("drain vs pgqueuer", _against("pgqueuer", "W2", "drain", "rate", "rate"), 2.5, True),
    Target("drain / bare loop", _share_of_bare, 0.35, True),
    Target(
        "p50 at 50/s vs best peer",
        _against_best("W3", "latency", "p50_ms", "p50_ms", lowest=True),
        1.0,
        False,
    ),
    Target(
        "p99 at 50/s vs best peer",
        _against_best("W3", "latency", "p99_ms", "p99_ms", lowest=True),
        1.0,
        False,
    ),
    Target(
        "summed worker PSS vs pgqueuer",
        _against("pgqueuer", "W2", "drain", "peak_pss_mb", "peak_pss_mb"),
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
