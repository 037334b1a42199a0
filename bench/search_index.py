"""What the admin search's GIN indexes cost an enqueue: with and without, alternating.

    python bench/search_index.py                       # 6 rounds
    python bench/search_index.py --rounds 8 --single 2000 --tasks 20000

One database (``bench_search``), migrated once; this script then re-runs itself as a
Django process on it. Each round measures single ``enqueue()`` and ``enqueue_many``
without the indexes and with them (``manage.py searchindex drop``/``create``), the order
swapped every round so neither side always runs first. Per side and workload it records
the rate (tasks/s, wall clock: sensitive to the machine's load), the CPU per task of this
process and of its PostgreSQL backend (``/proc/<pid>/stat``: what the work costs whatever
else runs; the server must be on this host) and the index bytes written per task. Medians
over rounds, spread as half the min-max range; the last column is with/without. JSON in
``bench/results/search-index-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchenv import RESULTS, migrated_database

SIDES = ("without", "with")
WORKLOADS = ("single", "bulk")
FIGURES = ("rate", "client_cpu_us", "server_cpu_us", "index_bytes")
TICK = os.sysconf("SC_CLK_TCK")


def _backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the PostgreSQL backend process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run(args: argparse.Namespace) -> int:  # inside Django, on the bench database
    import django

    django.setup()
    from ab import summarize
    from django.core.management import call_command
    from django.db import connection

    from django_tasks_plus import enqueue_many
    from example.tasks import add

    table = connection.ops.quote_name("django_tasks_plus_taskrecord")

    def sizes() -> int:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_indexes_size('{table}'::regclass)")
            return int(cursor.fetchone()[0])

    def measure(workload: str) -> dict[str, float]:
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {table}")
            cursor.execute(f"VACUUM ANALYZE {table}")
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        before_bytes = sizes()
        count = args.single if workload == "single" else args.tasks
        wall, cpu, server = time.perf_counter(), time.process_time(), _backend_cpu(backend)
        if workload == "single":
            for i in range(count):
                add.enqueue(i, i)
        else:
            enqueue_many(add, [((i, i), {}) for i in range(count)])
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        server = _backend_cpu(backend) - server
        return {
            "rate": count / wall,
            "client_cpu_us": 1e6 * cpu / count,
            "server_cpu_us": 1e6 * server / count,
            "index_bytes": (sizes() - before_bytes) / count,
            "load_average": os.getloadavg()[0],
        }

    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"search-index-{time.strftime('%Y%m%d-%H%M%S')}.json"
    results: dict[str, dict[str, list[dict[str, float]]]] = {side: {} for side in SIDES}
    for workload in WORKLOADS:  # a warm-up of each, not recorded
        measure(workload)
    for round_ in range(1, args.rounds + 1):
        for side in SIDES if round_ % 2 else SIDES[::-1]:
            call_command("searchindex", "create" if side == "with" else "drop", stdout=sys.stderr)
            for workload in WORKLOADS:
                figures = measure(workload)
                results[side].setdefault(workload, []).append(figures)
                print(f"round {round_} {side:7} {workload:6} {figures}", file=sys.stderr)
                path.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    call_command("searchindex", "drop", stdout=sys.stderr)
    lines = [f"{'workload':8} {'figure':14} {'without':>17} {'with':>17} {'with/without':>13}"]
    for workload in WORKLOADS:
        without = summarize(results["without"][workload])
        with_ = summarize(results["with"][workload])
        for figure in FIGURES:
            (a, a_spread), (b, b_spread) = without[figure], with_[figure]
            ratio = f"{b / a:>13.3f}" if a else f"{'-':>13}"
            cells = f" {a:>11.4g} ±{a_spread:3.0f}% {b:>11.4g} ±{b_spread:3.0f}%"
            lines.append(f"{workload:8} {figure:14}{cells} {ratio}")
    print("\n".join(lines))
    print(f"results: {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=20_000, help="enqueue_many size")
    parser.add_argument("--single", type=int, default=2_000, help="single enqueues")
    parser.add_argument("--database", default="bench_search")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        return run(args)
    env = migrated_database(args.database)
    return subprocess.run(
        [sys.executable, __file__, "--inside", *(argv or sys.argv[1:])], env=env, check=False
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
