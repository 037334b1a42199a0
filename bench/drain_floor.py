"""The floor of our drain: the worker's own claim and outcome statements with no Python
work around them.

``runtasks`` spends CPU in two places per drained task: its Python (objects, signals,
threads) and the PostgreSQL backends running its statements. This replays the second
alone: two processes (``--processes``) loop over our exact prepared claim (batches of
``--batch``, the session planned as the worker plans it) and our exact batched success
write (``UPDATE_OUTCOMES`` with the columns a first successful attempt sets), against our
own table with its indexes, and nothing else. Beside them, ``baseline.py``'s bare
``SKIP LOCKED`` loop on its two-index table, in the same run. What it prints: tasks per
second and CPU per task of the loop processes and of their backends (``/proc``; the
database is on this host), medians of ``--runs``.

    python bench/drain_floor.py --db-prefix floor --tasks 20000 --runs 3

No change to the worker's Python can make the drain faster than this floor; its backend
CPU per task (against the bare loop's, which ``account.py`` measures) is what our schema
and writes cost PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject"), str(HERE)]

import baseline  # noqa: E402
from benchenv import PG_SERVER as SERVER  # noqa: E402
from benchenv import recreate_database  # noqa: E402
from cpuaccount import process_cpu  # noqa: E402

SUCCESS_COLUMNS = ("finished_at", "last_attempted_at", "return_value", "started_at")


def _django(database: str) -> None:
    os.environ["DATABASE_URL"] = f"{SERVER}/{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("DEBUG", "false")
    import django

    django.setup()


def fill(database: str, tasks: int) -> None:
    """A fresh database with ``tasks`` READY tasks queued as ``enqueue_many`` queues them."""
    recreate_database(database)
    _django(database)
    from django.core.management import call_command

    from django_tasks_plus import enqueue_many
    from example.tasks import add

    call_command("migrate", verbosity=0)
    for start in range(0, tasks, 5_000):
        enqueue_many(add, [((n, n), {}) for n in range(start, min(tasks, start + 5_000))])
    with psycopg.connect(f"{SERVER}/{database}", autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE django_tasks_plus_taskrecord")


def _loop(database: str, batch: int, barrier: Any, queue: Any) -> None:
    """Claim and complete with our statements until nothing is left (one process)."""
    _django(database)
    from django_tasks_plus.db import postgresql
    from django_tasks_plus.db.pgexec import PLAN_ONCE

    # As a worker runs them by default: claims committed without waiting for the flush.
    claim = postgresql.claim_statement("", synchronous=False)
    write = postgresql._update_outcomes_sql(SUCCESS_COLUMNS)
    worker_id = f"floor-{os.getpid()}"
    done = 0
    with psycopg.connect(f"{SERVER}/{database}", autocommit=True) as conn:
        # The worker's session settings (statement bounds, no JIT, one generic plan).
        conn.execute(postgresql.SET_WORKER_TIMEOUTS, ["300000", "100000"])
        conn.execute(PLAN_ONCE)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        barrier.wait()
        own, server = process_cpu(os.getpid()), process_cpu(backend)
        while True:
            token = uuid.uuid4().hex
            params = postgresql.claim_parameters(
                backend_name="default",
                queues=["default"],
                filter_params=[],
                limit=batch,
                lease_token=token,
                visibility_timeout=300.0,
                worker_id=worker_id,
            )
            rows = conn.execute(claim, params, prepare=True).fetchall()
            if not rows:
                break
            now = postgresql._micros(datetime.now(UTC), "UTC")  # as the worker sends times
            records = [
                {
                    "id": row[0],
                    "lease_token": token,
                    "status": "SUCCESSFUL",
                    "finished_at": now,
                    "last_attempted_at": now,
                    "return_value": 2,
                    "started_at": now,
                }
                for row in rows
            ]
            landed = conn.execute(write, [json.dumps(records)], prepare=True).fetchall()
            if len(landed) != len(rows):
                raise RuntimeError(f"{len(rows) - len(landed)} outcomes did not land")
            done += len(rows)
        queue.put((done, process_cpu(os.getpid()) - own, process_cpu(backend) - server))


def floor_drain(database: str, tasks: int, processes: int, batch: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    filler = context.Process(target=fill, args=(database, tasks))
    filler.start()
    filler.join()
    if filler.exitcode:
        raise RuntimeError("filling the queue failed")
    barrier, queue = context.Barrier(processes + 1), context.Queue()
    workers = [
        context.Process(target=_loop, args=(database, batch, barrier, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    reports = [queue.get() for _ in workers]
    seconds = time.perf_counter() - started
    for worker in workers:
        worker.join()
    done = sum(report[0] for report in reports)
    if done != tasks:
        raise RuntimeError(f"the floor drained {done} of {tasks} tasks")
    return {
        "rate": tasks / seconds,
        "client_cpu_us": sum(report[1] for report in reports) / tasks * 1e6,
        "server_cpu_us": sum(report[2] for report in reports) / tasks * 1e6,
    }


def bare_drain(database: str, tasks: int, processes: int, batch: int) -> float:
    """``baseline.py``'s loop on its own table, tasks per second (the same run's yardstick)."""
    recreate_database(database)
    return baseline.claim_drain(f"{SERVER}/{database}", tasks, processes, batch)["rate"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-prefix", default="floor")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    database, bare = f"{args.db_prefix}_ours", f"{args.db_prefix}_bare"
    runs = []
    try:
        for run in range(args.runs):
            result = floor_drain(database, args.tasks, args.processes, args.batch)
            result["bare_rate"] = bare_drain(bare, args.tasks, args.processes, args.batch)
            result["floor_to_bare"] = result["rate"] / result["bare_rate"]
            runs.append(result)
            print(f"run {run + 1}: {runs[-1]}", flush=True)
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
            for name in (database, bare):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    for key in runs[0]:
        print(f"{key}: {statistics.median(run[key] for run in runs):.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
