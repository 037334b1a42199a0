"""Where the enqueue-to-start latency of one task goes, stage by stage.

One worker (``Worker`` in a thread of its own process, as ``runtasks`` runs it) and one
enqueuing process, paced at ``--rate`` tasks/s. Both stamp the wall clock (the same host's)
at the seams between stages, and each task is followed through them:

    enqueue          before ``enqueue()`` -> its INSERT, NOTIFY and commit returned, split
                     below into the Python before the statement, the statement's round
                     trip (INSERT, NOTIFY, commit), and the call's client CPU
    commit_to_wake   -> the worker's wake-up was set (the NOTIFY listener); below zero
                     when the listener heard the NOTIFY before the client read its reply
    wake_to_claim    -> the claim began (claim loop)
    claim            -> the claimed rows were returned, as objects
    claim_to_body    -> the task's body started (dispatch, task thread, TaskResult, signal)
    total            before ``enqueue()`` -> the body started (what W3 reports)

Also the claims that found nothing, counted and timed. The stamps wrap the engine's own
methods from outside (nothing in the package knows of them), so they cost a few
microseconds each.

    python bench/latency_trace.py --rate 50 --tasks 300

Needs PostgreSQL at 127.0.0.1:5432 (user root, trust); ``--database`` (default
``bench_trace``) is dropped and recreated.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchenv import migrated_database, paced, percentile  # noqa: E402

STAGES = (
    "enqueue",
    "  before_statement",
    "  statement",
    "  client_cpu",
    "commit_to_wake",
    "wake_to_claim",
    "claim",
    "claim_to_body",
    "total",
)


def run_worker() -> None:
    """Run a worker until SIGTERM; then print its stamps as one JSON line."""
    import django

    django.setup()
    from django_tasks_plus.db import postgresql
    from django_tasks_plus.worker import engine
    from django_tasks_plus.worker.config import WorkerConfig

    stamps: dict[str, Any] = {"wakes": [], "claims": [], "empty_claims_ms": []}
    claim_from = engine.Worker._claim_from
    dialect_claim = postgresql.PostgreSQLDialect.claim

    def traced_claim_from(self: Any, group: Any, wanted: int) -> Any:
        began = time.time()
        claimed = claim_from(self, group, wanted)
        if claimed:
            stamps["claims"].append((began, time.time(), [task.id for task in claimed]))
        return claimed

    def traced_dialect_claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        claimed = dialect_claim(self, *args, **kwargs)
        if not claimed:
            stamps["empty_claims_ms"].append((time.perf_counter() - began) * 1000)
        return claimed

    engine.Worker._claim_from = traced_claim_from  # type: ignore[method-assign]
    postgresql.PostgreSQLDialect.claim = traced_dialect_claim  # type: ignore[method-assign]
    worker = engine.Worker(WorkerConfig.from_settings("default"))
    set_wakeup = worker.wakeup.set

    def traced_set() -> None:
        stamps["wakes"].append(time.time())
        set_wakeup()

    worker.wakeup.set = traced_set  # type: ignore[method-assign]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=worker.run, daemon=True).start()
    print("ready", flush=True)
    done.wait()
    worker.stopping.set()
    set_wakeup()
    print(json.dumps(stamps), flush=True)


def run_enqueuer(tasks: int, rate: float) -> None:
    """Enqueue ``benchtasks.stamp`` at ``rate``; print (id, before, statement sent,
    committed, the call's client CPU in seconds) per task."""
    import django

    django.setup()
    from benchtasks import stamp

    from django_tasks_plus.db import postgresql

    statement: list[tuple[float, float]] = []
    insert_tasks = postgresql.PostgreSQLDialect.insert_tasks

    def traced_insert(self: Any, *args: Any, **kwargs: Any) -> None:
        began = time.time()
        insert_tasks(self, *args, **kwargs)
        statement.append((began, time.time()))  # autocommit: its return is its commit

    postgresql.PostgreSQLDialect.insert_tasks = traced_insert  # type: ignore[method-assign]
    sent: list[tuple[str, float, float, float, float]] = []

    def send(_: int) -> None:
        cpu = time.thread_time()
        before = time.time()
        result = stamp.enqueue(before)
        cpu = time.thread_time() - cpu
        sent.append((result.id, before, *statement[-1], cpu))

    paced(tasks, rate, send)
    print(json.dumps(sent), flush=True)


def stages(sent: list[Any], stamps: dict[str, Any], started: dict[str, float]) -> dict[str, list]:
    """Each task's time in each stage, in ms (a stage without a stamp is left out)."""
    wakes = sorted(stamps["wakes"])
    claims = {task_id: (began, ended) for began, ended, ids in stamps["claims"] for task_id in ids}
    spans: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for task_id, before, statement_sent, committed, cpu in sent:
        if task_id not in claims or task_id not in started:
            continue
        began, ended = claims[task_id]
        body = started[task_id]
        spans["enqueue"].append(committed - before)
        spans["  before_statement"].append(statement_sent - before)
        spans["  statement"].append(committed - statement_sent)
        spans["  client_cpu"].append(cpu)
        spans["claim"].append(ended - began)
        spans["claim_to_body"].append(body - ended)
        spans["total"].append(body - before)
        # The wake-up this claim answered: the last one before it, if after the call began.
        index = bisect.bisect_right(wakes, began) - 1
        if index >= 0 and wakes[index] >= before:
            spans["commit_to_wake"].append(wakes[index] - committed)
            spans["wake_to_claim"].append(began - wakes[index])
    return {stage: sorted(1000 * value for value in values) for stage, values in spans.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("worker", "enqueuer"), help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--database", default="bench_trace")
    args = parser.parse_args()
    if args.role == "worker":
        return run_worker()
    if args.role == "enqueuer":
        return run_enqueuer(args.tasks, args.rate)

    env = migrated_database(args.database)
    me = [sys.executable, __file__]
    worker = subprocess.Popen([*me, "--role", "worker"], env=env, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    if worker.stdout.readline().strip() != "ready":
        raise SystemExit("the worker did not start")
    time.sleep(1.0)  # its listener connects
    enqueue = [*me, "--role", "enqueuer", "--tasks", str(args.tasks), "--rate", str(args.rate)]
    sent = json.loads(subprocess.run(enqueue, env=env, check=True, capture_output=True).stdout)
    time.sleep(1.0)  # the last tasks finish
    worker.send_signal(signal.SIGTERM)
    stamps = json.loads(worker.communicate(timeout=30)[0])

    import psycopg

    with psycopg.connect(env["DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT id::text, return_value FROM django_tasks_plus_taskrecord"
            " WHERE status = 'SUCCESSFUL'"
        ).fetchall()
    started = {task_id: float(value) for task_id, value in rows}
    figures = stages(sent, stamps, started)
    print(f"{args.tasks} tasks at {args.rate:g}/s, one worker, load {os.getloadavg()[0]:.2f}")
    for stage, values in figures.items():
        if values:
            p50, p90, p99 = (percentile(values, share) for share in (0.5, 0.9, 0.99))
            print(
                f"{stage:18s} n={len(values):4d}  p50 {p50:6.3f} ms  p90 {p90:6.3f} ms"
                f"  p99 {p99:6.3f} ms"
            )
    empty = sorted(stamps["empty_claims_ms"])
    if empty:
        print(f"empty claims      n={len(empty):4d}  p50 {percentile(empty, 0.5):6.3f} ms")


if __name__ == "__main__":
    main()
