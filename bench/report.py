"""Targets and the printed table.

Figures are medians over runs; each row shows the run spread so a noisy figure is visible
as such. Targets are judged on the medians: PASS when met, GAP when not, "n/a" when the
figure was not measured in this invocation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

Summary = dict[str, Any]


@dataclass
class Series:
    """The runs of one workload (ours, and the paired baseline when there is one)."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    baseline: list[dict[str, Any]] = field(default_factory=list)

    def value(self, key: str) -> float | None:
        values = [run[key] for run in self.runs if run.get(key) is not None]
        return median(values) if values else None

    def base(self, key: str = "rate") -> float | None:
        values = [run[key] for run in self.baseline if run.get(key) is not None]
        return median(values) if values else None

    def spread(self, key: str) -> str:
        """Min-max over runs as a percentage of the median ('' for a single run)."""
        values = [run[key] for run in self.runs if run.get(key) is not None]
        middle = median(values) if values else 0
        if len(values) < 2 or not middle:
            return ""
        return f"±{50 * (max(values) - min(values)) / middle:.0f}%"

    def to_json(self) -> dict[str, Any]:
        keys = sorted({key for run in self.runs for key, v in run.items() if _number(v)})
        return {
            "runs": self.runs,
            "median": {key: self.value(key) for key in keys},
            "baseline_runs": self.baseline,
            "baseline_median_rate": self.base(),
        }


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Row:
    workload: str
    metric: str
    value: str
    baseline: str = ""
    ratio: str = ""
    target: str = ""
    verdict: str = ""
    spread: str = ""


def verdict(ok: bool | None) -> str:
    if ok is None:
        return "n/a"
    return "PASS" if ok else "GAP"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return ours / theirs


def fmt_ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _at_least(value: float | None, floor: float) -> bool | None:
    return None if value is None else value >= floor


def _at_most(value: float | None, ceiling: float) -> bool | None:
    return None if value is None else value <= ceiling


def enqueue_rows(single: Series | None, bulk: Series | None) -> list[Row]:
    rows: list[Row] = []
    if single is not None:
        ours, bare = single.value("rate"), single.base()
        share = ratio(ours, bare)
        rows += [
            Row(
                "W1a",
                "single enqueue, autocommit",
                rate(ours),
                rate(bare),
                fmt_ratio(share),
                ">= 1,600/s",
                verdict(_at_least(ours, 1600)),
                single.spread("rate"),
            ),
            Row(
                "W1a",
                "  share of bare INSERT loop",
                fmt_ratio(share),
                "",
                "",
                ">= 0.75x",
                verdict(_at_least(share, 0.75)),
            ),
        ]
    if bulk is not None:
        ours, bare = bulk.value("rate"), bulk.base()
        rows.append(
            Row(
                "W1b",
                "enqueue_many (COPY)",
                rate(ours),
                rate(bare),
                fmt_ratio(ratio(ours, bare)),
                ">= 50,000/s",
                verdict(_at_least(ours, 50_000)),
                bulk.spread("rate"),
            )
        )
    return rows


def drain_rows(drain: Series, label: str = "W2", judged: bool = True) -> list[Row]:
    steady, bare = drain.value("rate"), drain.base()
    with_start = drain.value("rate_with_start")
    rss, pss = drain.value("peak_rss_mb"), drain.value("peak_pss_mb")
    cpu, busy = drain.value("worker_cpu_ms_per_task"), drain.value("machine_cpu_busy_percent")
    processes = drain.value("peak_processes")
    return [
        Row(
            label,
            "drain, first start -> last finish",
            rate(steady),
            rate(bare) if bare else "",
            fmt_ratio(ratio(steady, bare)),
            ">= 10,000/s" if judged else "",
            verdict(_at_least(steady, 10_000)) if judged else "",
            drain.spread("rate"),
        ),
        Row(
            label,
            "drain, process start included",
            rate(with_start),
            "",
            "",
            "",
            "",
            drain.spread("rate_with_start"),
        ),
        Row(
            label,
            f"peak RSS, sum of {processes or 0:.0f} processes",
            "-" if rss is None else f"{rss:.0f} MB",
            "",
            "",
            "<= 100 MB" if judged else "",
            verdict(_at_most(rss, 100)) if judged else "",
            drain.spread("peak_rss_mb"),
        ),
        Row(
            label,
            "  peak PSS, same processes",
            _unit(pss, "MB", 0),
            spread=drain.spread("peak_pss_mb"),
        ),
        Row(
            label,
            "worker CPU per task",
            _unit(cpu, "ms", 3),
            spread=drain.spread("worker_cpu_ms_per_task"),
        ),
        Row(label, "machine CPU busy during drain", _unit(busy, "%", 0)),
        Row(label, "database commits per task", _unit(drain.value("commits_per_task"), "", 3)),
    ]


def _unit(value: float | None, unit: str, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f} {unit}".rstrip()


def latency_rows(latency: Series, label: str = "W3", judged: bool = True) -> list[Row]:
    p50, p99 = latency.value("p50_ms"), latency.value("p99_ms")
    p95, worst = latency.value("p95_ms"), latency.value("max_ms")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    return [
        Row(
            label,
            "enqueue->start p50",
            ms(p50),
            target="<= 4 ms" if judged else "",
            verdict=verdict(_at_most(p50, 4)) if judged else "",
        ),
        Row(label, "enqueue->start p95", ms(p95)),
        Row(
            label,
            "enqueue->start p99",
            ms(p99),
            target="<= 10 ms" if judged else "",
            verdict=verdict(_at_most(p99, 10)) if judged else "",
        ),
        Row(label, "enqueue->start max", ms(worst)),
        Row(label, "enqueue() call, mean", ms(latency.value("mean_enqueue_ms"))),
    ]


def scale_rows(scale: Series, reference: Series | None) -> list[Row]:
    ours = scale.value("rate")
    theirs = reference.value("rate") if reference else None
    share = ratio(ours, theirs)
    history = scale.value("history_rows") or 0
    plans = [run.get("uses_claim_index") for run in scale.runs]
    uses_index = all(plans) if plans and None not in plans else None
    return [
        Row(
            "W4",
            f"drain over {history:,.0f} finished rows",
            rate(ours),
            rate(theirs) + " (W2)" if theirs else "",
            fmt_ratio(share),
            ">= 0.90x of W2",
            verdict(_at_least(share, 0.90)),
        ),
        Row(
            "W4",
            "claim plan uses dtp_task_claim_idx",
            {True: "yes", False: "no", None: "-"}[uses_index],
            "",
            "",
            "yes",
            verdict(uses_index),
        ),
        Row("W4", "claim SELECT execution (EXPLAIN ANALYZE)", _execution_time(scale)),
    ]


def pruning_rows(pruned: Series, kept: Series) -> list[Row]:
    """W5: the drain while the leader prunes expired rows, against the same drain whose
    leader keeps them."""
    ours = pruned.value("rate")
    theirs = kept.value("rate")
    share = ratio(ours, theirs)
    expired = pruned.value("history_rows") or 0
    deleted = pruned.value("history_pruned") or 0
    return [
        Row(
            "W5",
            f"drain while pruning {expired:,.0f} expired rows",
            rate(ours),
            rate(theirs) + " (pruner off)" if theirs else "",
            fmt_ratio(share),
            ">= 0.90x of pruner off",
            verdict(_at_least(share, 0.90)),
        ),
        Row("W5", "expired rows deleted during the drain", f"{deleted:,.0f}"),
    ]


def backlog_rows(deep: Series, reference: Series | None, drain: Series | None) -> list[Row]:
    """W6: a deep READY backlog drained without a VACUUM, judged against the smaller
    reference backlog drained the same way, or against W2 when there is none."""
    ours = deep.value("rate")
    tasks = _tasks(deep)
    judge, judge_label = (reference, f"{_tasks(reference):,.0f}") if reference else (drain, "W2")
    theirs = judge.value("rate") if judge else None
    share = ratio(ours, theirs)
    rows = [
        Row(
            "W6",
            f"drain of {tasks:,.0f} READY tasks, no VACUUM",
            rate(ours),
            f"{rate(theirs)} ({judge_label})" if theirs else "",
            fmt_ratio(share),
            f">= 0.90x of {judge_label}",
            verdict(_at_least(share, 0.90)),
        )
    ]
    if reference is not None and drain is not None:
        w2 = drain.value("rate")
        rows.append(
            Row(
                "W6",
                "  the same against W2 (VACUUMed)",
                rate(ours),
                f"{rate(w2)} (W2)" if w2 else "",
                fmt_ratio(ratio(ours, w2)),
            )
        )
    if reference is not None:
        # CPU per task moves much less with the machine's load than the rate does.
        cpu, cpu_reference = (
            deep.value("worker_cpu_ms_per_task"),
            reference.value("worker_cpu_ms_per_task"),
        )
        rows.append(
            Row(
                "W6",
                "  worker CPU per task",
                _unit(cpu, "ms", 3),
                f"{_unit(cpu_reference, 'ms', 3)} ({judge_label})",
                fmt_ratio(ratio(cpu, cpu_reference)),
            )
        )
    enqueue = deep.value("enqueue_seconds")
    rows += [
        Row(
            "W6",
            "enqueue_many of the backlog",
            rate(tasks / enqueue if enqueue else None),
        ),
        Row("W6", "drain, process start included", rate(deep.value("rate_with_start"))),
    ]
    for label, series in (("", deep), ("  the reference: ", reference)):
        if series is None:
            continue
        rows.append(
            Row(
                "W6",
                f"{label}autovacuum runs (vacuum, analyze) before the drain · during it",
                f"{_runs(series, 'before_drain')} · {_runs(series, 'during')}",
            )
        )
    return rows


def _runs(series: Series, when: str) -> str:
    """Autovacuum's vacuum and analyze runs of the task table in one phase of a drain."""
    vacuums = series.value(f"autovacuum_count_{when}") or 0
    analyzes = series.value(f"autoanalyze_count_{when}") or 0
    return f"{vacuums:.0f}, {analyzes:.0f}"


def _tasks(series: Series) -> float:
    return series.value("tasks") or 0


def _execution_time(series: Series) -> str:
    for run in series.runs:
        for line in str(run.get("plan", "")).splitlines():
            if line.startswith("Execution Time:"):
                return line.split(":", 1)[1].strip()
    return "-"


COLUMNS: Sequence[tuple[str, Callable[[Row], str]]] = (
    ("workload", lambda row: row.workload),
    ("metric", lambda row: row.metric),
    ("ours", lambda row: row.value),
    ("spread", lambda row: row.spread),
    ("baseline", lambda row: row.baseline),
    ("ratio", lambda row: row.ratio),
    ("target", lambda row: row.target),
    ("verdict", lambda row: row.verdict),
)


def render(rows: Sequence[Row]) -> str:
    """A plain fixed-width table (copy-pastes cleanly into issues and replies)."""
    cells = [[title for title, _ in COLUMNS]]
    cells += [[cell(row) for _, cell in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    numeric = {2, 3, 4, 5}

    def line(values: list[str]) -> str:
        parts = [
            value.rjust(width) if i in numeric else value.ljust(width)
            for i, (value, width) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(cells[0]), rule, *(line(values) for values in cells[1:])])
