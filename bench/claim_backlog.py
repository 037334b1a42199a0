"""Enqueue-to-start latency of fresh tasks beside backlogs the claim must not pay for.

One real ``runtasks --queue default`` worker stays up while backlogs are added, phase by
phase, and fresh tasks are enqueued at a steady rate after each (p50/p95 of their
enqueue-to-start delay):

    empty          no other rows
    +future        N READY tasks of the served queue due in an hour (retries, scheduled,
                   tasks a breaker parked)
    +future-high   N more, at a higher priority than the fresh tasks
    +unserved      N due tasks of a queue this worker does not serve ("emails")

Each phase also EXPLAINs (ANALYZE, BUFFERS) the claim's candidate query as the worker
runs it when idle, and reports the shared buffers it read.

    python bench/claim_backlog.py                          # this checkout's code
    python bench/claim_backlog.py --repo /path/to/other    # another checkout's code

Needs PostgreSQL at 127.0.0.1:5432 (user root, trust); the database (``--database``,
default ``bench_claim``) is dropped and recreated. Prints one JSON line per phase on
stderr as it goes and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchenv import PG_SERVER, REPO, recreate_database  # noqa: E402

TASKS = "django_tasks_plus_taskrecord"
UNSERVED_QUEUE = "emails"

# (phase name, queue, priority, seconds until due) of the backlog each phase adds.
PHASES: list[tuple[str, str | None, int, int]] = [
    ("empty", None, 0, 0),
    ("+future", "default", 0, 3600),
    ("+future-high", "default", 10, 3600),
    ("+unserved", UNSERVED_QUEUE, 0, -60),
]


def env_for(repo: Path, database: str) -> dict[str, str]:
    """A Django process running ``repo``'s code against ``database``."""
    path = os.pathsep.join([str(repo), str(repo / "testproject"), str(BENCH)])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"postgres://root@127.0.0.1:5432/{database}",
        "DEBUG": "false",
        "TASKS_LOG_LEVEL": "WARNING",
        "EXTRA_TASK_MODULES": "benchtasks",
    }


def add_backlog(dsn: str, count: int, queue: str, priority: int, due_in: int) -> None:
    """``count`` READY rows in one INSERT … SELECT, then VACUUM ANALYZE."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"""
            INSERT INTO {TASKS} (id, task_path, backend_name, queue_name, priority, args,
                kwargs, status, run_after, attempt, worker_ids, enqueued_at, errors,
                dead_letter_reason, ordering_blocked, cancel_requested, metadata)
            SELECT gen_random_uuid(), 'benchtasks.stamp', 'default', %s, %s, '[0]', '{{}}',
                'READY', now() + make_interval(secs => %s), 0, '[]', now(), '[]', '',
                false, false, '{{}}'
            FROM generate_series(1, %s)
            """,
            [queue, priority, due_in, count],
        )
        conn.execute(f"VACUUM ANALYZE {TASKS}")


def idle_claim_buffers() -> dict[str, Any]:
    """(Django set up.) EXPLAIN (ANALYZE, BUFFERS) of the idle claim's candidate query as
    the checkout runs it: the sub-select of its PostgreSQL ``CLAIM``, rolled back."""
    from django.db import connection, transaction

    from django_tasks_plus.db import postgresql

    text = postgresql.CLAIM
    start = text.index("WITH picked AS (") + len("WITH picked AS (")
    query = text[start : text.index(")\n    UPDATE")]
    params: list[Any] = ["default", ["default"], 16]
    if "WITH RECURSIVE" in query:  # the level walk takes the limit twice
        params.append(16)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
        raw = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    return {
        "claim_buffers": plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"],
        "claim_ms": plan["Execution Time"],
    }


def measure(args: argparse.Namespace) -> None:
    """(Child process, Django set up.) Enqueue ``--tasks`` stamps at ``--rate``, wait for
    them all to finish, print their latency figures as JSON."""
    import django

    django.setup()
    from benchenv import latency_figures, paced, wait_until
    from benchtasks import stamp

    from django_tasks_plus.models import TaskRecord

    TaskRecord.objects.filter(task_path=stamp.module_path, status="SUCCESSFUL").delete()
    enqueue_seconds: list[float] = []

    def send(_: int) -> None:
        sent = time.time()
        stamp.enqueue(sent)
        enqueue_seconds.append(time.time() - sent)

    paced(args.tasks, args.rate, send)
    done = TaskRecord.objects.filter(task_path=stamp.module_path, status="SUCCESSFUL")
    if not wait_until(lambda: done.count() >= args.tasks, timeout=120, interval=0.1):
        raise SystemExit(f"only {done.count()} of {args.tasks} tasks finished")
    delays = (
        (started - call[0]) * 1000 for call, started in done.values_list("args", "return_value")
    )
    print(json.dumps({**latency_figures(delays, enqueue_seconds), **idle_claim_buffers()}))


def run(args: argparse.Namespace) -> int:
    repo = Path(args.repo).resolve()
    env = env_for(repo, args.database)
    dsn = f"{PG_SERVER}/{args.database}"
    recreate_database(args.database)
    manage = [sys.executable, str(repo / "testproject" / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True)
    worker = subprocess.Popen(
        [*manage, "runtasks", "-v", "0", "--queue", "default"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    measure_command = [sys.executable, __file__, "measure"]
    results = []
    try:
        time.sleep(3.0)
        for name, queue, priority, due_in in PHASES:
            if queue is not None:
                add_backlog(dsn, args.backlog, queue, priority, due_in)
                time.sleep(1.0)
            figures = json.loads(
                subprocess.run(
                    [*measure_command, "--tasks", str(args.tasks), "--rate", str(args.rate)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.splitlines()[-1]
            )
            figures["phase"] = name
            print(json.dumps(figures), file=sys.stderr, flush=True)
            results.append(figures)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    empty = results[0]["p50_ms"]
    print(f"claim backlog ({args.backlog:,} rows per kind, {args.tasks} tasks at {args.rate:g}/s)")
    print(f"{'phase':<14} {'p50 ms':>8} {'p95 ms':>8} {'vs empty':>9} {'claim buffers':>14}")
    for row in results:
        print(
            f"{row['phase']:<14} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} "
            f"{row['p50_ms'] / empty:>8.2f}x {row['claim_buffers']:>14}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "measure"])
    parser.add_argument("--repo", default=str(REPO), help="checkout whose code runs")
    parser.add_argument("--database", default="bench_claim")
    parser.add_argument("--backlog", type=int, default=100_000, help="rows of each kind")
    parser.add_argument("--tasks", type=int, default=500, help="fresh tasks per phase")
    parser.add_argument("--rate", type=float, default=50.0, help="fresh tasks per second")
    args = parser.parse_args()
    if args.command == "measure":
        measure(args)
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
