"""Plain tasks' latency beside a host's held tasks, in every breaker state.

One command, ``python bench/breaker_halfopen.py`` (PostgreSQL at 127.0.0.1:5432, user
root). For each phase it empties the tables, sets one host's circuit up with ``--held``
tasks, starts ``--workers`` ``runtasks`` processes and enqueues plain tasks for another
host at ``--rate`` per second for ``--seconds``, each carrying the time it was sent; the
body returns the time it started. The phases:

* ``baseline``: no task of the breaker's host at all;
* ``closed``: the host's circuit is closed (with failures remembered), its tasks held
  until an hour from now (as tasks a circuit held before it closed look);
* ``open``: the circuit forced open (``force_open``), its tasks due now: the first
  claimed one parks the others until the probe time, an hour away;
* ``half-open``: the circuit half-open with no live probe (as a probe that ended
  neutral leaves it), its tasks due now (released): the first claimed becomes the probe
  and runs for the whole phase, the others are held while it runs, and the host gets
  ``--trickle`` new tasks per second (tasks enqueued after the park).

Each phase reports the plain tasks' enqueue-to-start p50/p95/max and its ratio to the
baseline's p50, and how often held tasks were claimed (``task.held``) and parked
(``breaker.parked``), counted by ``breaker_hold``'s event counter. The results go to
``bench/results/breaker-halfopen-<time>.json``; the exit status is 1 if a phase's p50
is more than twice the baseline's (and over 20 ms: below that, the shared machine's noise
decides), or if a held task's body ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
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

# breaker_hold's event counter (task.held, breaker.parked, task.started per worker), on
# when this variable names a folder; imported once Django is set up.
COUNTS_DIR_ENV = "BREAKER_BENCH_COUNTS"

PG_DATABASE = "breaker_halfopen_bench"
BREAKER_NAME = "halfopen-bench"
HELD_HOST = "held.example"
PLAIN_HOST = "plain.example"
PHASES = ("baseline", "closed", "open", "half-open")
# Below this p50 a ratio says more about the machine's noise than about the breaker.
NOISE_FLOOR_MS = 20.0


# -- the task module (imported by the workers as ``breaker_halfopen``) ---------------------


if __name__ != "__main__":
    import breaker_hold  # noqa: F401 (installs the event counter in the workers)

    from django_tasks_plus import Breaker, task

    HALFOPEN_BREAKER = Breaker(
        key=lambda host, sent, until=0.0: host,
        name=BREAKER_NAME,
        failure_threshold=5,
        failure_window=60,
        recovery_delay=timedelta(hours=1),  # the probe stays live for the whole phase
        release_interval=1,
        failures=(ConnectionError,),
    )

    @task(breaker=HALFOPEN_BREAKER)
    def call_host(host: str, sent: float, until: float = 0.0) -> float:
        """A call to a remote host; returns when its body started (this host's clock).
        The held host answers only at ``until``: its probe runs until then."""
        started = time.time()
        if host == HELD_HOST:
            time.sleep(max(0.0, until - started))
        return started


# -- the harness --------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    for path in (str(REPO), str(TESTPROJECT), str(BENCH)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django

    django.setup()


def recreate_database() -> str:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DATABASE}")
    return f"{PG_SERVER.replace('postgresql://', 'postgres://')}/{PG_DATABASE}"


def set_up(phase: str, held: int, until: float) -> None:
    """Empty the tables and put the held host's circuit and tasks in the phase's state."""
    import breaker_halfopen as module
    from django.utils import timezone

    from django_tasks_plus import enqueue_many
    from django_tasks_plus.breaker import failures_text
    from django_tasks_plus.circuits import force_open
    from django_tasks_plus.models import BreakerRecord, TaskRecord, WorkerRecord

    TaskRecord.objects.all().delete()
    BreakerRecord.objects.all().delete()
    WorkerRecord.objects.all().delete()  # the last phase's workers were killed
    if phase == "baseline":
        return
    now = timezone.now()
    calls = [((HELD_HOST, 0.0, until), {})] * held
    if phase == "closed":
        BreakerRecord.objects.create(
            backend_name="default",
            name=BREAKER_NAME,
            key=HELD_HOST,
            state="closed",
            failures=failures_text([now - timedelta(seconds=1)]),
            updated_at=now,
        )
        enqueue_many(module.call_host, calls)
        TaskRecord.objects.filter(breaker_key__isnull=False).update(
            run_after=now + timedelta(hours=1), held_since=now - timedelta(minutes=1)
        )
    elif phase == "open":
        force_open(HELD_HOST, name=BREAKER_NAME)
        enqueue_many(module.call_host, calls)
    else:  # half-open, no live probe: as a probe that ended neutral leaves it
        BreakerRecord.objects.create(
            backend_name="default",
            name=BREAKER_NAME,
            key=HELD_HOST,
            state="half-open",
            failures="[]",
            opened_at=now - timedelta(hours=2),
            updated_at=now,
        )
        enqueue_many(module.call_host, calls)
        TaskRecord.objects.filter(breaker_key__isnull=False).update(
            held_since=now - timedelta(minutes=1)
        )


def run_phase(phase: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    import breaker_halfopen as module
    from breaker_hold import read_counts
    from django.db.models import Q

    from django_tasks_plus.circuits import breaker_states
    from django_tasks_plus.models import TaskRecord, WorkerRecord

    until = time.time() + args.seconds + 30  # the half-open probe outlives the stream
    set_up(phase, args.held, until)
    counts_dir = Path(tempfile.mkdtemp(prefix=f"breaker-halfopen-{phase}-"))
    worker_env = {**env, COUNTS_DIR_ENV: str(counts_dir)}
    workers = []
    for index in range(args.workers):
        log_file = open(counts_dir / f"worker-{index}.log", "w")  # noqa: SIM115
        workers.append(
            subprocess.Popen(
                runtasks_command("--worker-id", f"halfopen-bench-{index}"),
                env=worker_env,
                cwd=REPO,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    plain: list[Any] = []
    trickled = 0
    try:
        deadline = time.monotonic() + 30
        while WorkerRecord.objects.count() < args.workers and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)  # past the first claims of the held host's tasks
        start_counts = read_counts(counts_dir)
        log(f"{phase}: {args.workers} workers up; plain stream for {args.seconds:.0f} s")
        window_start = time.monotonic()
        interval = 1.0 / args.rate
        trickle_every = 1.0 / args.trickle if args.trickle > 0 else None
        next_send = next_trickle = window_start
        while (now := time.monotonic()) < window_start + args.seconds:
            if phase == "half-open" and trickle_every is not None and now >= next_trickle:
                module.call_host.enqueue(HELD_HOST, 0.0, until)
                trickled += 1
                next_trickle += trickle_every
            if now < next_send:
                time.sleep(min(next_send - now, 0.02))
                continue
            plain.append(module.call_host.enqueue(PLAIN_HOST, time.time()))
            next_send += interval
        time.sleep(1.0)  # one more flush of the workers' counts
        end_counts = read_counts(counts_dir)
        window = time.monotonic() - 1.0 - window_start
        ids = [result.id for result in plain]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if TaskRecord.objects.filter(pk__in=ids, status="SUCCESSFUL").count() == len(ids):
                break
            time.sleep(0.2)
        states = [s for s in breaker_states() if s.key == HELD_HOST]
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the probe sleeps: no graceful stop
        for proc in workers:
            proc.wait()

    latencies = []
    rows = TaskRecord.objects.filter(pk__in=[result.id for result in plain])
    for sent_args, value, status in rows.values_list("args", "return_value", "status"):
        if status == "SUCCESSFUL" and isinstance(value, float):
            latencies.append((value - float(sent_args[1])) * 1000.0)
    latencies.sort()
    held_rows = TaskRecord.objects.filter(breaker_key=f"{BREAKER_NAME}/{HELD_HOST}")
    # A held task's body ran if it finished; the half-open probe (RUNNING when killed) is
    # the one task of the host allowed to start.
    bodies_run = held_rows.filter(Q(status="SUCCESSFUL") | Q(status="FAILED")).count()
    held_claims = end_counts.get("held", 0) - start_counts.get("held", 0)
    return {
        "phase": phase,
        "held_tasks": 0 if phase == "baseline" else args.held + trickled,
        "circuit_state_at_end": states[0].state if states else None,
        "window_seconds": round(window, 2),
        "plain_sent": len(plain),
        "plain_done": len(latencies),
        "latency_ms": {
            "p50": round(percentile(latencies, 0.50), 1) if latencies else None,
            "p95": round(percentile(latencies, 0.95), 1) if latencies else None,
            "max": round(latencies[-1], 1) if latencies else None,
        },
        "held_claims_in_window": held_claims,
        "held_claims_per_second": round(held_claims / window, 2),
        "held_claims_total": end_counts.get("held", 0),
        "park_statements_total": end_counts.get("parks", 0),
        "rows_parked_total": end_counts.get("parked", 0),
        "held_bodies_run": bodies_run,
        "logs": str(counts_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=1000, help="tasks of the held host")
    parser.add_argument("--workers", type=int, default=2, help="runtasks processes")
    parser.add_argument("--seconds", type=float, default=20.0, help="stream length per phase")
    parser.add_argument("--rate", type=float, default=20.0, help="plain tasks per second")
    parser.add_argument(
        "--trickle", type=float, default=5.0, help="held host's new tasks per second (half-open)"
    )
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated phases")
    args = parser.parse_args(argv)
    phases = [phase.strip() for phase in args.phases.split(",") if phase.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phase(s) {', '.join(sorted(unknown))}; use {', '.join(PHASES)}")

    url = recreate_database()
    env = django_env(url)
    env["EXTRA_TASK_MODULES"] = "breaker_halfopen"
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env, cwd=REPO, check=True
    )
    setup_django(env)

    results = [run_phase(phase, args, env) for phase in phases]
    baseline = next((r["latency_ms"]["p50"] for r in results if r["phase"] == "baseline"), None)
    ok = True
    for result in results:
        p50 = result["latency_ms"]["p50"]
        ratio = None if baseline in (None, 0) or p50 is None else round(p50 / baseline, 2)
        result["p50_to_baseline"] = ratio
        within = p50 is not None and (p50 <= NOISE_FLOOR_MS or (ratio is not None and ratio <= 2))
        result["within_2x_of_baseline"] = within
        ok = ok and within and result["held_bodies_run"] == 0
        ok = ok and result["plain_done"] == result["plain_sent"]
    report = {
        "at": datetime.now(UTC).isoformat(),
        "database": "postgresql",
        "workers": args.workers,
        "rate_per_second": args.rate,
        "phases": results,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"breaker-halfopen-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{'phase':<10} {'held':>6} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'x base':>7} "
        f"{'held claims/s':>14} {'parks':>6}"
    )
    for result in results:
        latency = result["latency_ms"]
        print(
            f"{result['phase']:<10} {result['held_tasks']:>6} {latency['p50']!s:>8} "
            f"{latency['p95']!s:>8} {latency['max']!s:>8} {result['p50_to_baseline']!s:>7} "
            f"{result['held_claims_per_second']:>14} {result['park_statements_total']:>6}"
        )
    print(f"results in {out.relative_to(REPO)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
