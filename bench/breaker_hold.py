"""Circuit breaker hold at scale: 100,000 tasks for a dead host beside a healthy one.

One command, ``python bench/breaker_hold.py`` (PostgreSQL at 127.0.0.1:5432, user root):

1. Recreate the database ``breaker_bench`` and migrate it; force the circuit of the dead
   host open (``circuits.force_open``; its recovery delay is an hour, so no probe runs
   during the bench) and enqueue ``--held`` tasks for it (``enqueue_many`` in chunks).
2. Start ``--workers`` ``runtasks`` processes. They import this file as the task module
   ``breaker_hold`` (``EXTRA_TASK_MODULES``), which subscribes a counter to the breaker
   events: how many claimed tasks were held (``task.held``: each is one claim of a held
   task), how many waiting tasks were parked in one statement (``breaker.parked``), and
   how many bodies ran; each worker writes its counts to a file twice a second.
3. For ``--seconds``, enqueue tasks for the healthy host at ``--rate`` per second, each
   carrying the time it was sent; its body returns the time it started.
4. Report the claims per second of held tasks (over the whole window and over its second
   half, once the first claims are behind), the healthy tasks' enqueue-to-start latency
   p50/p95/max, and how many rows the circuit holds (``breaker_states()``). One summary
   line goes to stdout, the full results to ``bench/results/breaker-hold-<time>.json``.

Both hosts' tasks share one task, one queue and one breaker: only the key differs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from benchenv import (  # noqa: E402
    MANAGE,
    PG_SERVER,
    REPO,
    RESULTS,
    TESTPROJECT,
    django_env,
    percentile,
    runtasks_command,
)

PG_DATABASE = "breaker_bench"
DEAD_HOST = "dead.example"
HEALTHY_HOST = "healthy.example"
BREAKER_NAME = "bench"
COUNTS_DIR_ENV = "BREAKER_BENCH_COUNTS"
ENQUEUE_CHUNK = 5000


# -- the task module (imported by the workers as ``breaker_hold``) -------------------------


if __name__ != "__main__":
    from django_tasks_plus import Breaker, events, task

    BENCH_BREAKER = Breaker(
        key=lambda host, sent: host,
        name=BREAKER_NAME,
        failure_threshold=5,
        failure_window=60,
        recovery_delay=timedelta(hours=1),  # no probe during the bench
        release_interval=1,
        failures=(ConnectionError,),
    )

    @task(breaker=BENCH_BREAKER)
    def call_host(host: str, sent: float) -> float:
        """A call to a remote host; returns when its body started (this host's clock)."""
        started = time.time()
        if host == DEAD_HOST:
            raise ConnectionError(f"{host} is down")
        return started

    def _install_counter(folder: str) -> None:
        """Count the breaker events of this worker process; write them twice a second."""
        lock = threading.Lock()
        counts = {"held": 0, "parked": 0, "parks": 0, "held_dead": 0, "ran": 0}
        path = Path(folder) / f"counts-{os.getpid()}.json"

        def count(event: events.Event) -> None:
            with lock:
                if event.name == events.TASK_HELD:
                    counts["held"] += 1
                elif event.name == events.BREAKER_PARKED:
                    counts["parks"] += 1
                    counts["parked"] += int(event.measurements.get("count", 0))
                elif event.name == events.TASK_STARTED:
                    counts["ran"] += 1

        def flush() -> None:
            while True:
                with lock:
                    snapshot = {**counts, "at": time.time()}
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(snapshot))
                tmp.replace(path)
                time.sleep(0.5)

        events.subscribe(count, events.TASK_HELD, events.BREAKER_PARKED, events.TASK_STARTED)
        threading.Thread(target=flush, name="breaker-bench-counts", daemon=True).start()

    if os.environ.get(COUNTS_DIR_ENV):
        _install_counter(os.environ[COUNTS_DIR_ENV])


# -- the harness --------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def recreate_database() -> str:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DATABASE}")
    return f"{PG_SERVER.replace('postgresql://', 'postgres://')}/{PG_DATABASE}"


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    for path in (str(REPO), str(TESTPROJECT), str(BENCH)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django

    django.setup()


def read_counts(folder: Path) -> dict[str, int]:
    total: dict[str, int] = {}
    for path in folder.glob("counts-*.json"):
        try:
            counts = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for name, value in counts.items():
            if name != "at":
                total[name] = total.get(name, 0) + int(value)
    return total


def claim_query_ms(connection: Any) -> float:
    """Median execution time of the claim's candidate query, run 5 times (EXPLAIN ANALYZE,
    inside a transaction that is rolled back: the rows it locks are released)."""
    from django.db import transaction

    from django_tasks_plus.db import postgresql, sql

    query = sql.claim_candidates(
        sql.CLAIM_CANDIDATES_LATERAL,
        served=postgresql.SERVED,
        now=postgresql.NOW,
        skip_locked="\n            FOR UPDATE SKIP LOCKED",
    )
    times = []
    for _ in range(5):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", ["default", ["default"], 8, 8]
            )
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            times.append(float(plan[0]["Execution Time"]))
            transaction.set_rollback(True)
    return round(sorted(times)[2], 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=100_000, help="tasks for the dead host")
    parser.add_argument("--workers", type=int, default=2, help="runtasks processes")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the run")
    parser.add_argument("--rate", type=float, default=50.0, help="healthy tasks per second")
    args = parser.parse_args(argv)

    url = recreate_database()
    env = django_env(url)
    env["EXTRA_TASK_MODULES"] = "breaker_hold"
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env, cwd=REPO, check=True
    )
    setup_django(env)
    import breaker_hold as module  # this file, as the workers import it
    from django.db import connection
    from django.db.models import Q

    from django_tasks_plus import enqueue_many
    from django_tasks_plus.circuits import breaker_states, force_open
    from django_tasks_plus.models import TaskRecord

    force_open(DEAD_HOST, name=BREAKER_NAME)
    began = time.monotonic()
    for start in range(0, args.held, ENQUEUE_CHUNK):
        size = min(ENQUEUE_CHUNK, args.held - start)
        enqueue_many(module.call_host, [((DEAD_HOST, 0.0), {})] * size)
    enqueue_seconds = time.monotonic() - began
    log(f"breaker_hold: {args.held} tasks for {DEAD_HOST} enqueued in {enqueue_seconds:.1f} s")

    counts_dir = Path(tempfile.mkdtemp(prefix="breaker-hold-"))
    worker_env = {**env, COUNTS_DIR_ENV: str(counts_dir)}
    workers = []
    for index in range(args.workers):
        log_file = open(counts_dir / f"worker-{index}.log", "w")  # noqa: SIM115
        workers.append(
            subprocess.Popen(
                runtasks_command("--worker-id", f"breaker-bench-{index}"),
                env=worker_env,
                cwd=REPO,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    healthy: list[Any] = []
    try:
        # Wait until every worker has started (they register in the workers table).
        from django_tasks_plus.models import WorkerRecord

        deadline = time.monotonic() + 30
        while WorkerRecord.objects.count() < args.workers and time.monotonic() < deadline:
            time.sleep(0.1)
        log(f"breaker_hold: {args.workers} workers up; healthy stream for {args.seconds:.0f} s")
        window_start = time.monotonic()
        half_counts: dict[str, int] = {}
        half_at = window_start
        interval = 1.0 / args.rate
        next_send = window_start
        while (now := time.monotonic()) < window_start + args.seconds:
            if not half_counts and now >= window_start + args.seconds / 2:
                half_counts = read_counts(counts_dir)
                half_at = now
            if now < next_send:
                time.sleep(min(next_send - now, 0.05))
                continue
            healthy.append(module.call_host.enqueue(HEALTHY_HOST, time.time()))
            next_send += interval
        time.sleep(1.0)  # one more flush of the workers' counts
        end_counts = read_counts(counts_dir)
        window_end = time.monotonic() - 1.0
        # Let the last healthy tasks finish.
        ids = [result.id for result in healthy]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done = TaskRecord.objects.filter(pk__in=ids, status="SUCCESSFUL").count()
            if done == len(ids):
                break
            time.sleep(0.2)
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    latencies, steady = [], []
    steady_from = time.time() - (time.monotonic() - half_at)  # the window's second half
    rows = TaskRecord.objects.filter(pk__in=[result.id for result in healthy])
    for sent_args, value, status in rows.values_list("args", "return_value", "status"):
        if status == "SUCCESSFUL" and isinstance(value, float):
            sent = float(sent_args[1])
            latencies.append((value - sent) * 1000.0)
            if sent >= steady_from:
                steady.append((value - sent) * 1000.0)
    latencies.sort()
    steady.sort()
    claim_ms = claim_query_ms(connection)
    [status] = [s for s in breaker_states() if s.key == DEAD_HOST]
    dead = TaskRecord.objects.filter(breaker_key=f"{BREAKER_NAME}/{DEAD_HOST}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        db_now = cursor.fetchone()[0]
    dead_ran = dead.filter(Q(attempt__gt=0) | ~Q(status="READY")).count()
    window = window_end - window_start
    second_half = window_end - half_at
    held_total = end_counts.get("held", 0)
    held_second_half = held_total - half_counts.get("held", 0)
    results = {
        "at": datetime.now(UTC).isoformat(),
        "database": "postgresql",
        "held_tasks_enqueued": args.held,
        "enqueue_seconds": round(enqueue_seconds, 2),
        "workers": args.workers,
        "window_seconds": round(window, 2),
        "held_claims": held_total,
        "held_claims_per_second": round(held_total / window, 3),
        "held_claims_per_second_second_half": round(held_second_half / second_half, 3),
        "park_statements": end_counts.get("parks", 0),
        "rows_parked": end_counts.get("parked", 0),
        "task_started_events": end_counts.get("ran", 0),  # held claims included
        "dead_host_bodies_run": dead_ran,
        "circuit_state": status.state,
        "rows_held_by_circuit": status.held,
        "rows_due_later": dead.filter(status="READY", run_after__gt=db_now).count(),
        "healthy_sent": len(healthy),
        "healthy_done": len(latencies),
        "healthy_latency_ms": {
            "p50": round(percentile(latencies, 0.50), 1) if latencies else None,
            "p95": round(percentile(latencies, 0.95), 1) if latencies else None,
            "max": round(latencies[-1], 1) if latencies else None,
        },
        "healthy_latency_ms_second_half": {
            "p50": round(percentile(steady, 0.50), 1) if steady else None,
            "p95": round(percentile(steady, 0.95), 1) if steady else None,
            "max": round(steady[-1], 1) if steady else None,
        },
        # The claim's candidate query (as the PostgreSQL dialect runs it) with the rows
        # still held, no due task: EXPLAIN ANALYZE execution time, median of 5.
        "claim_query_ms_while_held": claim_ms,
        "logs": str(counts_dir),
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"breaker-hold-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    latency = results["healthy_latency_ms"]
    steady_latency = results["healthy_latency_ms_second_half"]
    print(
        f"breaker_hold: {args.held} held, {results['rows_held_by_circuit']} rows held by the "
        f"{status.state} circuit; held claims {held_total} in {window:.1f} s "
        f"({results['held_claims_per_second']}/s, second half "
        f"{results['held_claims_per_second_second_half']}/s), "
        f"{results['rows_parked']} rows parked in {results['park_statements']} statement(s); "
        f"healthy {len(latencies)}/{len(healthy)} done, latency p50 {latency['p50']} ms "
        f"p95 {latency['p95']} ms (second half p50 {steady_latency['p50']} ms p95 "
        f"{steady_latency['p95']} ms); claim query {claim_ms} ms; "
        f"results in {out.relative_to(REPO)}"
    )
    ok = len(latencies) == len(healthy) and dead_ran == 0 and status.held == args.held
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
