"""The scheduler's cost per tick with many schedules (docs/schedules.md#cost-per-tick).

With ``--schedules`` runtime schedules stored (half ``Every(hours=1)``, half the cron
``0 * * * *``), times the scheduler's work for one tick (``store.fire_due``, what the
leader's ``Scheduler.tick`` runs):

    idle     no schedule is due: the tick's one indexed query (median of 50 ticks)
    all-due  every schedule is due at once: each occurrence recorded and its task
             enqueued, exactly once (checked), in batches of ``store.BATCH_SIZE``
             (median of ``--runs``; the tasks and occurrences are deleted between runs),
             with the CPU time the scheduler's process spent on it

``--batch-size 1`` measures one transaction per schedule; ``--repo PATH`` measures another
checkout's code (an older scheduler, say) with this script.

    python bench/schedule_tick.py                      # PostgreSQL and SQLite
    python bench/schedule_tick.py --only sqlite --schedules 200

Needs PostgreSQL at 127.0.0.1:5432 (user root, trust) for its part; the database
(``--database``, default ``bench_schedules``) is dropped and recreated. SQLite runs on a
temporary file (WAL, as the test project configures it). Prints a table on stdout, with
the machine's load average: on a shared machine the wall time follows it, the CPU time
much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchenv import django_env, recreate_database  # noqa: E402

IDLE_TICKS = 50


def recreate_pg(database: str) -> str:
    recreate_database(database)
    return f"postgres://root@127.0.0.1:5432/{database}"


def run_child(
    url: str, schedules: int, runs: int, batch_size: int | None, repo: Path | None
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", url, "--schedules", str(schedules)]
    command += ["--runs", str(runs)]
    if batch_size:
        command += ["--batch-size", str(batch_size)]
    env = django_env(url)
    if repo is not None:  # another checkout's code (its test project too), this script
        env["PYTHONPATH"] = os.pathsep.join([str(repo), str(repo / "testproject"), str(BENCH)])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{url}: the measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the measuring process (Django configured by django_env) ---------------------------------


def measure(schedules: int, runs: int, batch_size: int | None) -> dict[str, Any]:
    import django

    django.setup()
    from datetime import timedelta

    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from django_tasks_plus.compat import task_backends
    from django_tasks_plus.models import ScheduleOccurrence, ScheduleRecord, TaskRecord
    from django_tasks_plus.schedules import store

    if batch_size:
        store.BATCH_SIZE = batch_size
    call_command("migrate", verbosity=0)
    settings = task_backends["default"].settings
    ScheduleRecord.objects.all().delete()
    TaskRecord.objects.all().delete()
    now = timezone.now()
    minute = now.replace(second=0, microsecond=0)
    ScheduleRecord.objects.bulk_create(
        ScheduleRecord(
            backend_name="default",
            name=f"bench-{index:05d}",
            task_path="example.tasks.add",
            cron="" if index % 2 else "0 * * * *",
            every_seconds=3600 if index % 2 else None,
            args=[index, 1],
            next_at=minute + timedelta(days=1),
        )
        for index in range(schedules)
    )

    def clock() -> Any:
        return timezone.now()

    idle = []
    for _ in range(IDLE_TICKS):
        started = time.perf_counter()
        assert store.fire_due(settings, clock) == 0
        idle.append(time.perf_counter() - started)

    due, due_cpu = [], []
    for _ in range(runs):
        TaskRecord.objects.all().delete()
        ScheduleOccurrence.objects.all().delete()
        # The latest occurrence of both kinds: due now, on time or caught up ("latest").
        latest = timezone.now().replace(minute=0, second=0, microsecond=0)
        ScheduleRecord.objects.update(next_at=latest, last_task_id=None, last_fired_at=None)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE django_tasks_plus_schedulerecord")
        started, cpu = time.perf_counter(), time.process_time()
        fired = store.fire_due(settings, clock)
        due.append(time.perf_counter() - started)
        due_cpu.append(time.process_time() - cpu)
        occurrences = ScheduleOccurrence.objects.filter(action="fired")
        assert fired == schedules, fired
        assert occurrences.count() == schedules
        assert occurrences.filter(task_id__isnull=True).count() == 0
        assert TaskRecord.objects.count() == schedules
        assert store.fire_due(settings, clock) == 0  # exactly once: nothing due again
    return {
        "database": connection.vendor,
        "schedules": schedules,
        "batch_size": getattr(store, "BATCH_SIZE", 1),  # unbatched code: one per transaction
        "idle_ms": statistics.median(idle) * 1000,
        "all_due_s": statistics.median(due),
        "all_due_runs_s": due,
        "all_due_cpu_s": statistics.median(due_cpu),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, help="default: store.BATCH_SIZE")
    parser.add_argument("--only", choices=("postgresql", "sqlite"))
    parser.add_argument("--database", default="bench_schedules")
    parser.add_argument("--repo", type=Path, help="measure another checkout's code")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(measure(options.schedules, options.runs, options.batch_size)))
        return
    results = []
    if options.only in (None, "postgresql"):
        url = recreate_pg(options.database)
        results.append(
            run_child(url, options.schedules, options.runs, options.batch_size, options.repo)
        )
    if options.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{os.path.join(folder, 'bench.sqlite3')}"
            results.append(
                run_child(url, options.schedules, options.runs, options.batch_size, options.repo)
            )
    print(
        f"{'database':<11} {'schedules':>9} {'batch':>5} {'idle tick':>10} "
        f"{'all-due tick':>13} {'(its CPU)':>10} {'load avg':>9}"
    )
    for row in results:
        print(
            f"{row['database']:<11} {row['schedules']:>9,} {row['batch_size']:>5} "
            f"{row['idle_ms']:>7.2f} ms {row['all_due_s']:>11.2f} s "
            f"{row['all_due_cpu_s']:>8.2f} s {row['load_average']:>9.1f}"
        )


if __name__ == "__main__":
    main()
