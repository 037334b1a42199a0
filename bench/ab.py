"""A/B: this checkout against another commit, in alternating same-run pairs.

    git worktree add --detach /tmp/base <commit>
    python bench/ab.py --base /tmp/base                 # 3 rounds, A B A B A B
    python bench/ab.py --base /tmp/base --rounds 5 --only drain,idle

Each round measures, for A (this checkout) then B (``--base``): single ``enqueue()``/s,
``enqueue_many``/s and a ``runtasks --burst`` drain, each right after its bare-psycopg
baseline (``baseline.py``), so every figure also comes as a ratio to the bare loop of the
same moment; and an idle burst worker (start-up and shutdown alone). The drain is split
into start-up (CPU and wall from process start to the first claim, per process) and
steady state (worker CPU per task between the 10th and 90th percentile of finish times),
see ``ab_driver.py``. Medians over rounds, spread as half the min-max range.

Each side gets its own database (``<prefix>_a``, ``<prefix>_b``, migrated by its own
code) and the baselines a third (``<prefix>_bare``); all three are dropped and recreated.
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
from benchenv import BENCH, PG_SERVER, REPO, RESULTS, precompile

DRIVER = BENCH / "ab_driver.py"
WORKLOADS = ("single", "bulk", "drain", "idle")


def side_env(checkout: Path, database: str) -> dict[str, str]:
    path = os.pathsep.join([str(checkout), str(checkout / "testproject"), str(BENCH)])
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
    done = subprocess.run(
        command,
        env=side_env(checkout, database),
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{checkout} {workload} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    lines = [f"{'workload':8} {'figure':26} {'A (head)':>18} {'B (base)':>18} {'A/B':>6}"]
    for workload in WORKLOADS:
        a = summarize(results["A"].get(workload, []))
        b = summarize(results["B"].get(workload, []))
        for key in a:
            if key not in b:
                continue
            (av, aspread), (bv, bspread) = a[key], b[key]
            lines.append(
                f"{workload:8} {key:26} {av:>11.4g} ±{aspread:3.0f}% {bv:>11.4g} ±{bspread:3.0f}%"
                f" {av / bv if bv else float('nan'):>6.3f}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout of the B commit")
    parser.add_argument("--head", type=Path, default=REPO, help="checkout of A (this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000, help="bulk and drain size")
    parser.add_argument("--single", type=int, default=2_000, help="single enqueues")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run")
    parser.add_argument("--db-prefix", default="bench_ab", help="database names' prefix")
    args = parser.parse_args(argv)
    workloads = [w for w in WORKLOADS if w in args.only.split(",")]
    sides = {"A": args.head.resolve(), "B": args.base.resolve()}
    databases = {"A": f"{args.db_prefix}_a", "B": f"{args.db_prefix}_b"}
    bare_db = f"{args.db_prefix}_bare"
    bare_dsn = f"{PG_SERVER}/{bare_db}"
    for database in [*databases.values(), bare_db]:
        recreate(database)
    for side, checkout in sides.items():
        precompile(checkout)
        measure(checkout, databases[side], "setup")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {"A": {}, "B": {}}
    for round_ in range(1, args.rounds + 1):
        for workload in workloads:
            for side, checkout in sides.items():
                progress(f"round {round_}: {workload} {side}")
                reference = None if workload == "idle" else bare(workload, bare_dsn, args)
                size = args.single if workload == "single" else args.tasks
                run = measure(
                    checkout, databases[side], workload, tasks=size, processes=args.processes
                )
                if reference:
                    run["bare_rate"] = float(reference)
                    run["ratio_to_bare"] = run["rate"] / reference
                results[side].setdefault(workload, []).append(run)
    baseline.drop_tables(bare_dsn)
    lines = table(results)
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"ab-{time.strftime('%Y%m%d-%H%M%S')}.json"
    payload = {
        "sides": {side: str(checkout) for side, checkout in sides.items()},
        "args": {key: str(value) for key, value in vars(args).items()},
        "results": results,
        "load_average": os.getloadavg(),
    }
    path.write_text(json.dumps(payload, indent=1))
    progress(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
