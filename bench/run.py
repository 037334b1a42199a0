"""django-tasks-plus benchmark suite: one command, a table on stdout, JSON in bench/results/.

    python bench/run.py                   # full run, about 2-4 minutes
    python bench/run.py --quick           # smaller sizes, one run each, under 90 s
    python bench/run.py --workloads W1,W2 --runs 5 --tasks 50000
    python bench/run.py --sqlite          # also drain and latency on a SQLite file
    python bench/run.py --profile         # also a py-spy profile of the W2 drain
    python bench/run.py --peers           # also five other queues (peers.py)

Workloads: W1 enqueue (single and bulk), W2 drain, W3 latency, W4 drain over a large
finished history, W5 drain while the leader prunes expired rows (against pruner off);
W6, a deep READY backlog drained without a VACUUM (against a smaller one), runs only when
named in --workloads (it takes several minutes).
The machine is shared and drifts, so each W1/W2 run is paired with a
bare-psycopg baseline measured right before it (bench/baseline.py) and figures are also
given as ratios to those. Every django-tasks-plus measurement runs in a fresh process
(bench/driver.py); the worker is the real ``manage.py runtasks``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import baseline
import peers
import psycopg
import pyspy
import report
from benchenv import (
    BENCH,
    PG_DATABASE,
    PG_DSN,
    PG_SERVER,
    PG_URL,
    REPO,
    RESULTS,
    django_env,
    precompile,
    run_for_json,
)
from report import Row, Series

ALL_WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6")
# W6 enqueues and drains a million tasks (minutes, not seconds): only when asked for.
DEFAULT_WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
# W5's history finished this long ago: past the default 7-day retention of SUCCESSFUL.
EXPIRED_AGE_DAYS = 8.0
DRIVER = BENCH / "driver.py"


@dataclass(frozen=True)
class Plan:
    """Sizes and repetitions of one invocation."""

    workloads: tuple[str, ...]
    runs: int
    tasks: int
    single: int
    latency_tasks: int
    latency_rate: float
    history: int
    expired: int
    backlog: int
    backlog_reference: int
    processes: int
    sqlite: bool
    profile: bool


def parse_args(argv: list[str] | None = None) -> tuple[Plan, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one run each")
    parser.add_argument(
        "--workloads", default=",".join(DEFAULT_WORKLOADS), help="e.g. W1,W2 (W6: only if named)"
    )
    parser.add_argument("--runs", type=int, help="runs of W1, W2 and baselines (default 3)")
    parser.add_argument("--tasks", type=int, help="bulk/drain size (default 20,000)")
    parser.add_argument("--single", type=int, help="single enqueues in W1a (default 2,000)")
    parser.add_argument("--latency-tasks", type=int, help="W3 tasks (default 500)")
    parser.add_argument(
        "--latency-rate", type=float, default=50.0, help="W3 offered load, tasks/s (default 50)"
    )
    parser.add_argument("--history", type=int, help="W4 finished rows (default 1,000,000)")
    parser.add_argument(
        "--expired", type=int, help="W5 finished rows past retention (default 200,000)"
    )
    parser.add_argument("--backlog", type=int, help="W6 READY tasks (default 1,000,000)")
    parser.add_argument(
        "--backlog-reference",
        type=int,
        help="W6's smaller backlog, drained the same way (default 200,000; 0: compare with W2)",
    )
    parser.add_argument("--processes", type=int, default=2, help="drain worker processes")
    parser.add_argument("--sqlite", action="store_true", help="also W2/W3 on a SQLite file")
    parser.add_argument("--profile", action="store_true", help="py-spy profile of a W2 drain")
    parser.add_argument(
        "--peers",
        nargs="?",
        const="all",
        help="compare with other queues: all of them, or some (--peers pgqueuer,celery)",
    )
    args = parser.parse_args(argv)
    if args.peers:
        known = {peer.name for peer in peers.PEERS}
        wanted = set(args.peers.split(",")) - {"all"}
        if wanted - known:
            parser.error(f"unknown peers: {', '.join(sorted(wanted - known))}; known: {known}")
    workloads = tuple(w.strip().upper() for w in args.workloads.split(",") if w.strip())
    unknown = set(workloads) - set(ALL_WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    if args.latency_rate <= 0:
        parser.error(f"--latency-rate must be above 0 tasks/s, not {args.latency_rate:g}")
    quick = args.quick
    plan = Plan(
        workloads=workloads,
        runs=args.runs or (1 if quick else 3),
        tasks=args.tasks or (5_000 if quick else 20_000),
        single=args.single or (1_000 if quick else 2_000),
        latency_tasks=args.latency_tasks or (200 if quick else 500),
        latency_rate=args.latency_rate,
        history=args.history if args.history is not None else (100_000 if quick else 1_000_000),
        expired=args.expired if args.expired is not None else (50_000 if quick else 200_000),
        backlog=args.backlog or (100_000 if quick else 1_000_000),
        backlog_reference=(
            args.backlog_reference
            if args.backlog_reference is not None
            else (20_000 if quick else 200_000)
        ),
        processes=args.processes,
        sqlite=args.sqlite,
        profile=args.profile,
    )
    return plan, args


# --------------------------------------------------------------------------------------
# Running measurements
# --------------------------------------------------------------------------------------


def driver(
    workload: str, database_url: str, timeout: float = 900, **options: Any
) -> dict[str, Any]:
    """Run one measurement in a fresh Django process; return its JSON result."""
    command = [sys.executable, str(DRIVER), workload]
    for name, value in options.items():
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return run_for_json(
        command, what=" ".join(command[1:]), env=django_env(database_url), timeout=timeout
    )


def reset_postgres() -> None:
    """Drop and recreate the bench database, then migrate it."""
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DATABASE}")
    driver("setup", PG_URL)


def progress(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the results."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure_postgres(plan: Plan) -> dict[str, Series]:
    """W1 and W2 interleaved run by run, each right after its baseline; then W3, W4, W5."""
    series: dict[str, Series] = {}
    paired = {
        "W1a": (
            "W1",
            lambda: baseline.insert_loop(PG_DSN, plan.single),
            lambda: driver("enqueue-single", PG_URL, tasks=plan.single),
        ),
        "W1b": (
            "W1",
            lambda: baseline.copy_bulk(PG_DSN, plan.tasks),
            lambda: driver("enqueue-bulk", PG_URL, tasks=plan.tasks),
        ),
        "W2": (
            "W2",
            lambda: baseline.claim_drain(PG_DSN, plan.tasks, plan.processes),
            lambda: driver("drain", PG_URL, tasks=plan.tasks, processes=plan.processes),
        ),
    }
    for run in range(1, plan.runs + 1):
        for name, (workload, bare, ours) in paired.items():
            if workload not in plan.workloads:
                continue
            progress(f"{name} run {run}/{plan.runs}: baseline, then django-tasks-plus")
            entry = series.setdefault(name, Series())
            entry.baseline.append(bare())
            baseline.drop_tables(PG_DSN)
            entry.runs.append(ours())
    if "W3" in plan.workloads:
        progress(f"W3: {plan.latency_tasks} tasks at {plan.latency_rate:g}/s to an idle worker")
        result = driver("latency", PG_URL, tasks=plan.latency_tasks, rate=plan.latency_rate)
        series["W3"] = Series(runs=[result])
    if "W4" in plan.workloads:
        progress(f"W4: {plan.history:,} finished rows, then a {plan.tasks:,}-task drain")
        result = driver(
            "drain", PG_URL, tasks=plan.tasks, processes=plan.processes, history=plan.history
        )
        series["W4"] = Series(runs=[result])
    if "W5" in plan.workloads:
        series.update(measure_pruning(plan))
    if "W6" in plan.workloads:
        series.update(measure_backlog(plan))
    return series


def measure_pruning(plan: Plan) -> dict[str, Series]:
    """W5: drains over ``plan.expired`` finished rows past retention, alternating a worker
    whose leader prunes them meanwhile and one whose leader keeps them."""
    pruned, kept = Series(), Series()
    for run in range(1, plan.runs + 1):
        for retention, entry in (("off", kept), ("on", pruned)):
            progress(
                f"W5 run {run}/{plan.runs}: {plan.tasks:,}-task drain over {plan.expired:,} "
                f"expired rows, pruner {retention}"
            )
            entry.runs.append(
                driver(
                    "drain",
                    PG_URL,
                    tasks=plan.tasks,
                    processes=plan.processes,
                    history=plan.expired,
                    history_age_days=EXPIRED_AGE_DAYS,
                    retention=retention,
                )
            )
    return {"W5": pruned, "W5-kept": kept}


def measure_backlog(plan: Plan) -> dict[str, Series]:
    """W6: ``plan.backlog`` READY tasks enqueued (``enqueue_many``, COPY) and drained by
    ``runtasks --burst`` with no VACUUM in between, as a deployment that just received a
    flood would; then the smaller reference backlog the same way, if any."""
    sizes = [("W6", plan.backlog)]
    if plan.backlog_reference:
        sizes.append(("W6-reference", plan.backlog_reference))
    series: dict[str, Series] = {}
    for name, tasks in sizes:
        progress(f"{name}: {tasks:,} READY tasks, no VACUUM, then a drain")
        result = driver(
            "drain",
            PG_URL,
            timeout=3600,
            tasks=tasks,
            processes=plan.processes,
            vacuum="off",
        )
        series[name] = Series(runs=[result])
    return series


def measure_sqlite(plan: Plan) -> dict[str, Series]:
    """W2 and W3 on a throwaway SQLite file (no baselines: figures are informational)."""
    series: dict[str, Series] = {}
    with tempfile.TemporaryDirectory(prefix="dtp-bench-") as folder:
        url = f"sqlite:///{Path(folder) / 'bench.sqlite3'}"
        driver("setup", url)
        if "W2" in plan.workloads:
            series["W2"] = Series()
            for run in range(1, plan.runs + 1):
                progress(f"SQLite W2 run {run}/{plan.runs}")
                series["W2"].runs.append(
                    driver("drain", url, tasks=plan.tasks, processes=plan.processes)
                )
        if "W3" in plan.workloads:
            progress("SQLite W3")
            result = driver("latency", url, tasks=plan.latency_tasks, rate=plan.latency_rate)
            series["W3"] = Series(runs=[result])
    return series


def profile_drain(plan: Plan) -> dict[str, Any]:
    """One extra W2 drain under py-spy (slower; not part of the timed figures)."""
    spy = pyspy.find_pyspy()
    if spy is None:
        return {"skipped": "py-spy not found on PATH or next to the interpreter"}
    progress("profile: W2 drain under py-spy")
    with tempfile.TemporaryDirectory(prefix="dtp-spy-") as folder:
        raw = Path(folder) / "drain.txt"
        run = driver(
            "drain", PG_URL, tasks=plan.tasks, processes=plan.processes, profile=raw, pyspy=spy
        )
        summary = pyspy.summary(pyspy.parse(raw))
    summary["drain_rate_under_profiler"] = run["rate"]
    return summary


# --------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------


def measure_peers(plan: Plan, names: str) -> list[dict[str, Any]]:
    """Other queues with the same sizes, one at a time, after all of our workloads."""
    chosen = None if names == "all" else set(names.split(","))
    return peers.measure_all(
        peers.PeerPlan(
            workloads=plan.workloads,
            single=plan.single,
            tasks=plan.tasks,
            latency_tasks=plan.latency_tasks,
            latency_rate=plan.latency_rate,
            processes=plan.processes,
        ),
        progress,
        chosen,
    )


def table_rows(postgres: dict[str, Series], sqlite: dict[str, Series]) -> list[Row]:
    rows = report.enqueue_rows(postgres.get("W1a"), postgres.get("W1b"))
    if "W2" in postgres:
        rows += report.drain_rows(postgres["W2"])
    if "W3" in postgres:
        rows += report.latency_rows(postgres["W3"])
    if "W4" in postgres:
        rows += report.scale_rows(postgres["W4"], postgres.get("W2"))
    if "W5" in postgres:
        rows += report.pruning_rows(postgres["W5"], postgres["W5-kept"])
    if "W6" in postgres:
        rows += report.backlog_rows(
            postgres["W6"], postgres.get("W6-reference"), postgres.get("W2")
        )
    if "W2" in sqlite:
        rows += report.drain_rows(sqlite["W2"], label="W2 sqlite", judged=False)
    if "W3" in sqlite:
        rows += report.latency_rows(sqlite["W3"], label="W3 sqlite", judged=False)
    return rows


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return done.stdout.strip()


def environment() -> dict[str, Any]:
    """What the figures depend on, so results from different days can be compared."""
    with psycopg.connect(PG_DSN) as conn:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in (
                "server_version",
                "fsync",
                "synchronous_commit",
                "shared_buffers",
                "autovacuum",
            )
        }
    import django

    return {
        "python": platform.python_version(),
        "django": django.__version__,
        "psycopg": psycopg.__version__,
        "postgresql": settings,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain")),
        "hostname": platform.node(),
    }


def write_results(payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(payload, indent=2, default=str)
    path = RESULTS / f"{stamp}.json"
    path.write_text(text)
    (RESULTS / "latest.json").write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    plan, args = parse_args(argv)
    started = time.monotonic()
    progress(f"plan: {plan}")
    precompile()
    reset_postgres()
    meta = environment()
    postgres = measure_postgres(plan)
    sqlite = measure_sqlite(plan) if plan.sqlite else {}
    profile = profile_drain(plan) if plan.profile else None
    meta["loadavg_end"] = os.getloadavg()
    peer_results = measure_peers(plan, args.peers) if args.peers else None
    if peer_results is not None:
        meta["loadavg_after_peers"] = os.getloadavg()
    meta["seconds"] = time.monotonic() - started
    rows = table_rows(postgres, sqlite)
    if peer_results is not None:
        peers.attach_comparisons(peer_results, postgres)
        rows += peers.table_rows(peer_results)
    print(
        f"django-tasks-plus bench: {meta['commit'][:10]}{' (dirty)' if meta['dirty'] else ''}, "
        f"PostgreSQL {meta['postgresql']['server_version']}, {meta['cpus']} CPUs, "
        f"load {meta['loadavg_start'][0]:.2f} -> {meta['loadavg_end'][0]:.2f}, "
        f"medians of {plan.runs} run(s) for W1/W2/W5, 1 for W3/W4/W6"
    )
    print(report.render(rows))
    if peer_results is not None:
        print(peers.NOTE)
    if profile is not None:
        print()
        print(pyspy.render(profile) if "samples" in profile else profile["skipped"])
    payload: dict[str, Any] = {
        "meta": meta,
        "plan": plan.__dict__,
        "postgresql": {name: entry.to_json() for name, entry in postgres.items()},
        "sqlite": {name: entry.to_json() for name, entry in sqlite.items()},
        "table": [row.__dict__ for row in rows],
        "profile": profile,
    }
    if peer_results is not None:
        payload["peers"] = peer_results
    path = write_results(payload)
    print(f"\nresults: {path.relative_to(REPO)} ({meta['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
