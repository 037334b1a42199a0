"""One django-tasks-plus measurement per invocation, printed as a JSON line.

``run.py`` starts this script once per measurement so that every figure comes from a
fresh process with its own settings (PostgreSQL or a SQLite file, chosen by
DATABASE_URL) and no state left over from an earlier workload.

    python bench/driver.py {setup,enqueue-single,enqueue-bulk,drain,latency} [options]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import django

django.setup()

from benchenv import (  # noqa: E402
    TreeRssSampler,
    latency_figures,
    machine_cpu,
    paced,
    runtasks_command,
    wait_until,
)
from benchtasks import stamp  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import Max, Min  # noqa: E402
from django.utils import timezone  # noqa: E402

from django_tasks_plus import enqueue_many  # noqa: E402
from django_tasks_plus.compat import task_backends  # noqa: E402
from django_tasks_plus.db import postgresql, sql  # noqa: E402
from django_tasks_plus.models import DedupKey, TaskRecord, WorkerRecord  # noqa: E402
from example.tasks import add  # noqa: E402

TASKS = TaskRecord._meta.db_table
CLAIM_INDEX = "dtp_task_claim_idx"
CLAIM_LIMIT = 16  # default concurrency 8 + default prefetch 8
# A deep backlog is enqueued in batches of this many calls: one ``enqueue_many`` of a
# million would hold a million results (and their rows' values) in memory at once.
ENQUEUE_BATCH = 100_000


# --------------------------------------------------------------------------------------
# Database housekeeping
# --------------------------------------------------------------------------------------


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def empty_tables() -> None:
    """Start from an empty queue; TRUNCATE on PostgreSQL so no dead tuples remain."""
    models = (TaskRecord, WorkerRecord, DedupKey)
    with connection.cursor() as cursor:
        if is_postgres():
            names = ", ".join(connection.ops.quote_name(m._meta.db_table) for m in models)
            cursor.execute(f"TRUNCATE {names}")
        else:
            for model in models:
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(model._meta.db_table)}")


def vacuum_analyze() -> None:
    """Fresh statistics and no dead tuples before a timed drain (autocommit needed)."""
    with connection.cursor() as cursor:
        if is_postgres():
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(TASKS)}")
        else:
            cursor.execute("VACUUM")
            cursor.execute("ANALYZE")


def analyze() -> None:
    """Statistics of the task table, without a VACUUM (its dead tuples stay)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(TASKS)}")


def enqueue_backlog(tasks: int) -> None:
    """Queue ``tasks`` no-op ``add`` calls with ``enqueue_many``, ``ENQUEUE_BATCH`` at a time."""
    for first in range(0, tasks, ENQUEUE_BATCH):
        last = min(first + ENQUEUE_BATCH, tasks)
        enqueue_many(add, [((i, i), {}) for i in range(first, last)])


def fill_history(rows: int, age_days: float = 1.0) -> float:
    """Insert ``rows`` finished (SUCCESSFUL) tasks in one statement; return seconds taken.

    Every NOT NULL column gets a real value; ``sequence`` comes from its default. The rows
    look like the ``add`` calls of ``age_days`` ago (yesterday's by default, inside the
    default retention of 7 days), so only their status keeps them out of a claim.
    """
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {connection.ops.quote_name(TASKS)} (
                id, task_path, backend_name, queue_name, priority, args, kwargs, status,
                run_after, attempt, lease_token, lease_expires_at, worker_ids, enqueued_at,
                started_at, last_attempted_at, finished_at, return_value, errors,
                dead_letter_reason, ordering_key, ordering_blocked, dedup_key,
                cancel_requested, metadata
            )
            SELECT gen_random_uuid(), 'example.tasks.add', 'default', 'default', 0,
                   jsonb_build_array(g, g), '{{}}'::jsonb, 'SUCCESSFUL',
                   at, 1, NULL, NULL, '["history-worker"]'::jsonb, at,
                   at + interval '1 ms', at + interval '1 ms', at + interval '2 ms',
                   to_jsonb(2 * g), '[]'::jsonb, '', NULL, false, NULL, false, '{{}}'::jsonb
            FROM generate_series(1, %s) AS g,
                 LATERAL (SELECT now() - %s * interval '1 day' + g * interval '50 ms') AS t(at)
            """,
            [rows, age_days],
        )
    return time.perf_counter() - started


def vacuum_counts() -> dict[str, int]:
    """How often autovacuum has vacuumed and analyzed the task table (PostgreSQL)."""
    if not is_postgres():
        return {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables"
            " WHERE relid = %s::regclass",
            [TASKS],
        )
        vacuums, analyzes = cursor.fetchone()
    return {"autovacuum_count": int(vacuums), "autoanalyze_count": int(analyzes)}


def wal_written() -> dict[str, int]:
    """The server's WAL so far (PostgreSQL 14+, the whole cluster: the bench's is the only
    load): bytes, full-page images (the first change of each page after a checkpoint
    writes it whole) and checkpoints begun (counted in ``pg_stat_checkpointer`` from
    PostgreSQL 17, whose ``pg_stat_bgwriter`` no longer has them)."""
    if not is_postgres() or connection.pg_version < 140000:
        return {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal")
        wal_bytes, wal_fpi = cursor.fetchone()
        cursor.execute(
            "SELECT num_timed + num_requested FROM pg_stat_checkpointer"  # PostgreSQL 17+
            if connection.pg_version >= 170000
            else "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        )
        (checkpoints,) = cursor.fetchone()
    return {"wal_bytes": int(wal_bytes), "wal_fpi": int(wal_fpi), "checkpoints": int(checkpoints)}


def committed_transactions() -> int | None:
    """Transactions committed in this database so far (PostgreSQL statistics).

    Read after the worker has exited: a backend flushes its counters when it ends.
    """
    if not is_postgres():
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def claim_plan() -> dict[str, Any]:
    """EXPLAIN (ANALYZE) the worker's candidate SELECT, rolled back; does it use the index?

    It is the SELECT inside the worker's claim CTE (the package's own text), with the
    served queues and the default batch limit.
    """
    if not is_postgres():
        return {}
    queues = sorted(task_backends["default"].settings.queues)
    candidates = sql.claim_candidates(
        sql.CLAIM_CANDIDATES_LATERAL,
        served=postgresql.SERVED,
        now=postgresql.NOW,
        skip_locked="\n            FOR UPDATE SKIP LOCKED",
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + candidates,
            ["default", queues, CLAIM_LIMIT, CLAIM_LIMIT],
        )
        lines = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    plan = "\n".join(lines)
    return {"plan": plan, "uses_claim_index": CLAIM_INDEX in plan}


# --------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------


def setup(_: argparse.Namespace) -> dict[str, Any]:
    call_command("migrate", verbosity=0)
    return {"vendor": connection.vendor}


def enqueue_single(args: argparse.Namespace) -> dict[str, Any]:
    """``add.enqueue`` in autocommit: one INSERT (+ NOTIFY) and one commit per call."""
    empty_tables()
    vacuum_analyze()
    started = time.perf_counter()
    for i in range(args.tasks):
        add.enqueue(i, i)
    seconds = time.perf_counter() - started
    return {"rate": args.tasks / seconds, "seconds": seconds}


def enqueue_bulk(args: argparse.Namespace) -> dict[str, Any]:
    """``enqueue_many`` of one batch: validation, encoding, COPY and commit."""
    empty_tables()
    vacuum_analyze()
    calls = [((i, i), {}) for i in range(args.tasks)]
    started = time.perf_counter()
    enqueue_many(add, calls)
    seconds = time.perf_counter() - started
    return {"rate": args.tasks / seconds, "seconds": seconds}


def _worker_options(args: argparse.Namespace) -> list[str]:
    options = ["--burst", "--processes", str(args.processes)]
    if args.concurrency:
        options += ["--concurrency", str(args.concurrency)]
    if args.prefetch is not None:
        options += ["--prefetch", str(args.prefetch)]
    return options


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_burst(command: list[str], measure_rss: bool) -> tuple[float, dict[str, Any]]:
    """Run the worker to exit; return wall seconds (process start included) and resources.

    CPU time comes from RUSAGE_CHILDREN, which includes the forked workers because the
    supervisor waits for them; machine CPU shows whether the drain was CPU-bound at all.
    """
    cpu_before, (busy_before, total_before) = _children_cpu(), machine_cpu()
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if measure_rss:
        with TreeRssSampler(process.pid) as sampler:
            _, stderr = process.communicate()
        usage: dict[str, Any] = dict(sampler.summary())
    else:
        _, stderr = process.communicate()
        usage = {}
    seconds = time.perf_counter() - started
    if process.returncode:
        raise RuntimeError(f"worker exited {process.returncode}: {stderr.decode()[-2000:]}")
    busy_after, total_after = machine_cpu()
    usage["worker_cpu_seconds"] = _children_cpu() - cpu_before
    usage["machine_cpu_busy_percent"] = (
        100 * (busy_after - busy_before) / max(total_after - total_before, 1e-9)
    )
    return seconds, usage


def _verify_drain(since: datetime, expected: int) -> dict[str, Any]:
    """Every drained task SUCCESSFUL with the right return value; first start, last end."""
    rows = TaskRecord.objects.filter(enqueued_at__gte=since)
    bad = sum(
        1
        for status, call, value in rows.values_list("status", "args", "return_value").iterator()
        if status != "SUCCESSFUL" or value != call[0] + call[1]
    )
    span = rows.aggregate(first=Min("started_at"), last=Max("finished_at"))
    total = rows.count()
    if total != expected or bad:
        raise RuntimeError(f"drain check failed: {total} rows of {expected}, {bad} not correct")
    return {"first_started": span["first"], "last_finished": span["last"]}


def drain(args: argparse.Namespace) -> dict[str, Any]:
    """Pre-enqueue ``tasks`` no-op tasks (optionally over finished history), then drain."""
    empty_tables()
    result: dict[str, Any] = {}
    if args.history:
        result["history_rows"] = args.history
        result["history_fill_seconds"] = fill_history(args.history, args.history_age_days)
        vacuum_analyze()
    # The drain's worker inherits this: with "off", its leader prunes no finished task.
    os.environ["TASKS_RETENTION"] = "true" if args.retention == "on" else "false"
    since = timezone.now()
    autovacuum_at_fill = vacuum_counts()
    started = time.perf_counter()
    enqueue_backlog(args.tasks)
    result["enqueue_seconds"] = time.perf_counter() - started
    if args.vacuum == "on":
        vacuum_analyze()
    elif args.vacuum == "analyze":
        analyze()
    result.update(claim_plan())
    autovacuum_before = vacuum_counts()
    commits_before = committed_transactions()
    wal_before = wal_written()
    connection.close()  # the worker should not compete with an idle session

    command = runtasks_command(*_worker_options(args))
    if args.profile:
        spy = [args.pyspy, "record", "--format", "raw", "--subprocesses", "--nolineno"]
        if args.profile_gil:  # only the thread holding the GIL: CPU, not lock waits
            spy.append("--gil")
        command = [*spy, "--rate", "250", "--output", args.profile, "--", *command]
    wall, usage = _run_burst(command, measure_rss=not args.profile)
    for key, count in vacuum_counts().items():  # autovacuum's runs while the queue drained
        usage[f"{key}_during"] = count - autovacuum_before[key]
        # ... and between the queue's fill and its drain: a table vacuumed before its
        # drain is cheaper to drain than one vacuumed in the middle of it.
        usage[f"{key}_before_drain"] = autovacuum_before[key] - autovacuum_at_fill[key]
    span = _verify_drain(since, args.tasks)
    steady = (span["last_finished"] - span["first_started"]).total_seconds()
    usage["worker_cpu_ms_per_task"] = usage["worker_cpu_seconds"] * 1000 / args.tasks
    commits_after = committed_transactions()
    for key, value in wal_written().items():  # the drain's, and the checks' few rows
        usage[f"{key}_during"] = value - wal_before[key]
    if "wal_bytes_during" in usage:
        usage["wal_bytes_per_task"] = usage["wal_bytes_during"] / args.tasks
    if commits_before is not None and commits_after is not None:
        # Includes the verification queries above: a handful against thousands.
        usage["commits_per_task"] = (commits_after - commits_before) / args.tasks
    result.update(usage)
    if args.history:
        left = TaskRecord.objects.filter(enqueued_at__lt=since).count()
        result["history_pruned"] = args.history - left
    result.update(
        tasks=args.tasks,
        rate_with_start=args.tasks / wall,
        wall_seconds=wall,
        rate=args.tasks / steady,
        steady_seconds=steady,
    )
    return result


def _start_idle_worker() -> subprocess.Popen[bytes]:
    """One default ``runtasks``; ready once its WorkerRecord exists, plus a second."""
    process = subprocess.Popen(runtasks_command(), stdout=subprocess.DEVNULL)
    if not wait_until(WorkerRecord.objects.exists, timeout=30):
        process.kill()
        raise RuntimeError("the latency worker never registered")
    time.sleep(1.0)
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue-to-start latency against an idle worker, at a steady trickle."""
    empty_tables()
    vacuum_analyze()
    worker = _start_idle_worker()
    enqueue_seconds: list[float] = []

    def send(_: int) -> None:
        sent = time.time()
        stamp.enqueue(sent)
        enqueue_seconds.append(time.time() - sent)

    try:
        paced(args.tasks, args.rate, send)
        done = TaskRecord.objects.filter(status="SUCCESSFUL", task_path=stamp.module_path)
        finished = wait_until(lambda: done.count() >= args.tasks, timeout=60, interval=0.1)
    finally:
        _stop(worker)
    if not finished:
        raise RuntimeError(f"only {done.count()} of {args.tasks} latency tasks finished")
    delays = (
        (started - call[0]) * 1000 for call, started in done.values_list("args", "return_value")
    )
    return latency_figures(delays, enqueue_seconds)


WORKLOADS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-bulk": enqueue_bulk,
    "drain": drain,
    "latency": latency,
}


def main() -> None:
    parser = argparse.ArgumentParser(description="One django-tasks-plus measurement.")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--history", type=int, default=0, help="finished rows under a drain")
    parser.add_argument(
        "--history-age-days", type=float, default=1.0, help="how long ago the history ran"
    )
    parser.add_argument(
        "--retention",
        choices=("on", "off"),
        default="on",
        help="the leader's pruner deletes"
        " finished tasks past OPTIONS['RETENTION'] (on) or keeps them (off)",
    )
    parser.add_argument(
        "--vacuum",
        choices=("on", "off", "analyze"),
        default="on",
        help="VACUUM ANALYZE the table after the drain's enqueue (on), only ANALYZE it "
        "(analyze: statistics, no VACUUM), or leave it to autovacuum (off)",
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--prefetch", type=int)
    parser.add_argument("--rate", type=float, default=50.0, help="latency enqueues per second")
    parser.add_argument("--profile", help="write a py-spy raw profile of the drain here")
    parser.add_argument("--pyspy", default="py-spy")
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="profile only the thread holding the GIL (py-spy --gil): what burns the "
        "CPU, leaving out the threads that wait on a lock, a queue or a socket",
    )
    args = parser.parse_args()
    result = WORKLOADS[args.workload](args)
    result["pid"] = os.getpid()
    print(json.dumps(result, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
