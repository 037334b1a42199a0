"""A/B: this checkout against another commit, in alternating same-run pairs.

    git worktree add --detach /tmp/base <commit>
    python bench/ab.py --base /tmp/base                 # 3 rounds, A B A B A B
    python bench/ab.py --base /tmp/base --rounds 5 --only drain,idle
    python bench/ab.py --side new=. --side main=/tmp/main --side old=/tmp/base

Each round measures, for A (this checkout) then B (``--base``): single ``enqueue()``/s,
``enqueue_many``/s and a ``runtasks --burst`` drain, each right after its bare-psycopg
baseline (``baseline.py``), so every figure also comes as a ratio to the bare loop of the
same moment; the peak memory of a second drain (``memory``: summed PSS, the supervisor's
and the workers'); and an idle burst worker (start-up and shutdown alone). The drain is split
into start-up (CPU and wall from process start to the first claim, per process) and
steady state (worker CPU per task between the 10th and 90th percentile of finish times),
see ``ab_driver.py``; and (``wal``) the write-ahead log a bulk enqueue and a drain write
per task, the one figure here a loaded machine does not move. Medians over rounds,
spread as half the min-max range.

Each side gets its own database (``<prefix>_0``, ``<prefix>_1``, …, migrated by its own
code) and the baselines one more (``<prefix>_bare``); all are dropped and recreated. The
JSON in ``bench/results/ab-<time>.json`` is rewritten after every measurement.
Nothing is installed: the side's checkout goes first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import baseline
import psycopg
from benchenv import BENCH, PG_SERVER, REPO, RESULTS, precompile, run_for_json

DRIVER = BENCH / "ab_driver.py"
WORKLOADS = ("single", "bulk", "drain", "memory", "idle", "wal")


def side_env(checkout: Path, database: str) -> dict[str, str]:
    """The side's package, test project and bench tasks first (its settings then import
    ``benchtasks``, not the test suite's tasks, as ``run.py``'s processes do)."""
    folders = [checkout, checkout / "testproject", checkout / "bench", BENCH]
    path = os.pathsep.join(str(folder) for folder in folders)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"postgres://root@127.0.0.1:5432/{database}",
        "DEBUG": "false",
        "TASKS_LOG_LEVEL": "WARNING",
    }


def measure(checkout: Path, database: str, workload: str, **options: Any) -> dict[str, Any]:
    command = [sys.executable, str(DRIVER), workload]
    command += ["--manage", str(checkout / "testproject" / "manage.py")]
    for name, value in options.items():
        command += [f"--{name}", str(value)]
    return run_for_json(
        command,
        what=f"{checkout} {workload}",
        env=side_env(checkout, database),
        cwd=checkout,
        timeout=900,
    )


def recreate(database: str) -> None:
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {database}")


def bare(workload: str, dsn: str, args: argparse.Namespace) -> float:
    if workload == "single":
        return baseline.insert_loop(dsn, args.single)["rate"]
    if workload == "bulk":
        return baseline.copy_bulk(dsn, args.tasks)["rate"]
    return baseline.claim_drain(dsn, args.tasks, args.processes)["rate"]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summarize(runs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """key -> (median, spread %), spread being half the min-max range over the median."""
    keys = sorted({key for run in runs for key, value in run.items() if isinstance(value, float)})
    summary = {}
    for key in keys:
        values = [run[key] for run in runs if key in run]
        middle = median(values)
        spread = 50 * (max(values) - min(values)) / middle if middle and len(values) > 1 else 0.0
        summary[key] = (middle, spread)
    return summary


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    """Each figure's median (and spread) per side; the last column is the first side's
    median over the last side's."""
    names = list(results)
    head = f"{'workload':8} {'figure':24}" + "".join(f" {name:>17}" for name in names)
    lines = [f"{head} {names[0] + '/' + names[-1]:>8}"]
    for workload in WORKLOADS:
        summaries = [summarize(results[name].get(workload, [])) for name in names]
        for key in summaries[0]:
            if not all(key in summary for summary in summaries):
                continue
            cells = "".join(f" {s[key][0]:>11.4g} ±{s[key][1]:3.0f}%" for s in summaries)
            last = summaries[-1][key][0]
            ratio = summaries[0][key][0] / last if last else float("nan")
            lines.append(f"{workload:8} {key:24}{cells} {ratio:>8.3f}")
    return lines


def parse_side(value: str) -> tuple[str, Path]:
    name, _, path = value.rpartition("=")
    return name or Path(path).name, Path(path).resolve()


def measure_twice(checkout: Path, database: str, workload: str, **options: Any) -> dict[str, Any]:
    """One retry: on a shared machine a run can fail for want of connections."""
    try:
        return measure(checkout, database, workload, **options)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        progress(f"failed, once more in 10 s: {str(exc).splitlines()[-1][:200]}")
        time.sleep(10)
        return measure(checkout, database, workload, **options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--side",
        action="append",
        type=parse_side,
        help="NAME=CHECKOUT, in run order (repeat; the table divides the first by the last)",
    )
    parser.add_argument("--base", type=Path, help="checkout of B (same as --side B=PATH)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000, help="bulk and drain size")
    parser.add_argument("--single", type=int, default=2_000, help="single enqueues")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run")
    parser.add_argument("--db-prefix", default="bench_ab", help="database names' prefix")
    args = parser.parse_args(argv)
    workloads = [w for w in WORKLOADS if w in args.only.split(",")]
    sides = dict(args.side or [("A", REPO)])
    if args.base is not None:
        sides["B"] = args.base.resolve()
    if len(sides) < 2:
        parser.error("give the side to compare with: --base PATH or --side NAME=PATH")
    databases = {name: f"{args.db_prefix}_{index}" for index, name in enumerate(sides)}
    bare_db = f"{args.db_prefix}_bare"
    bare_dsn = f"{PG_SERVER}/{bare_db}"
    for database in [*databases.values(), bare_db]:
        recreate(database)
    for side, checkout in sides.items():
        precompile(checkout)
        measure(checkout, databases[side], "setup")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"ab-{time.strftime('%Y%m%d-%H%M%S')}.json"
    results: dict[str, dict[str, list[dict[str, Any]]]] = {side: {} for side in sides}
    payload = {
        "sides": {side: str(checkout) for side, checkout in sides.items()},
        "args": {key: str(value) for key, value in vars(args).items()},
        "results": results,
    }
    for round_ in range(1, args.rounds + 1):
        for workload in workloads:
            for side, checkout in sides.items():
                progress(f"round {round_}: {workload} {side}")
                unpaired = workload in ("idle", "memory", "wal")  # no bare loop to divide by
                reference = None if unpaired else bare(workload, bare_dsn, args)
                size = args.single if workload == "single" else args.tasks
                run = measure_twice(
                    checkout, databases[side], workload, tasks=size, processes=args.processes
                )
                run["load_average"] = os.getloadavg()[0]
                if reference:
                    run["bare_rate"] = float(reference)
                    run["ratio_to_bare"] = run["rate"] / reference
                results[side].setdefault(workload, []).append(run)
                path.write_text(json.dumps(payload, indent=1))  # a crash keeps what ran
    baseline.drop_tables(bare_dsn)
    print("\n".join(table(results)))
    progress(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
