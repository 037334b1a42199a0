"""Quick throughput probe: single-enqueue rate and ``runtasks --burst`` drain rate.

Usage (from the repository root, with the test project's dependencies installed):

    DATABASE_URL=postgres://root@127.0.0.1:5432/bench python bench/drain.py --tasks 20000

It creates the tables in the named database (``migrate``), empties the task table, and
prints one line per measurement. The full side-by-side benchmark with baselines and peers
is planned in its own issue; this probe exists so every change can be checked quickly.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
# DEBUG on would keep every query in memory and log every task: not what is measured.
os.environ.setdefault("DEBUG", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefetch", type=int, help="runtasks --prefetch (default: its own)")
    parser.add_argument("--single", type=int, default=2000, help="tasks for the enqueue rate")
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from django_tasks_plus import enqueue_many
    from django_tasks_plus.models import TaskRecord
    from example.tasks import add

    call_command("migrate", verbosity=0)
    TaskRecord.objects.all().delete()

    started = time.perf_counter()
    for n in range(args.single):
        add.enqueue(n, n)
    single = args.single / (time.perf_counter() - started)
    print(f"single enqueue (autocommit): {single:,.0f} tasks/s ({connection.vendor})")

    TaskRecord.objects.all().delete()
    started = time.perf_counter()
    with transaction.atomic():
        for n in range(args.tasks):
            add.enqueue(n, n)
    batched = args.tasks / (time.perf_counter() - started)
    print(f"enqueue in one transaction: {batched:,.0f} tasks/s")

    TaskRecord.objects.all().delete()
    calls = [((n, n), {}) for n in range(args.tasks)]
    started = time.perf_counter()
    enqueue_many(add, calls)
    bulk = args.tasks / (time.perf_counter() - started)
    print(f"enqueue_many: {bulk:,.0f} tasks/s")
    connection.close()

    command = [
        sys.executable,
        str(REPO / "testproject" / "manage.py"),
        "runtasks",
        "--burst",
        "-v",
        "0",
        "--processes",
        str(args.processes),
        "--concurrency",
        str(args.concurrency),
    ]
    if args.prefetch is not None:
        command += ["--prefetch", str(args.prefetch)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path[:2]), "TASKS_LOG_LEVEL": "WARNING"}
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    elapsed = time.perf_counter() - started
    done = TaskRecord.objects.filter(status="SUCCESSFUL").count()
    print(
        f"drain: {done:,} tasks in {elapsed:.2f} s = {done / elapsed:,.0f} tasks/s "
        f"({args.processes} processes x {args.concurrency} threads, process start included)"
    )


if __name__ == "__main__":
    main()
