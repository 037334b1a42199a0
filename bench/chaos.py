"""Chaos run: workers are killed, paused and cut off from the database while they drain.

One command, ``python bench/chaos.py`` (PostgreSQL) or ``python bench/chaos.py --sqlite``:

1. Recreate the database (PostgreSQL ``chaos``, or a temporary SQLite file), migrate, add
   the ``chaos_ledger`` table, and enqueue N ``chaostasks.chaos_step`` tasks whose
   arguments say how each behaves (slow, failing once, designed to die).
2. Start worker processes (``runtasks``, each in its own session) and, while they drain:
   SIGKILL a random worker every few seconds and start a replacement under a new worker
   id; SIGSTOP a worker for twice its visibility timeout, then SIGCONT it; restart
   PostgreSQL once (or terminate every backend, ``--db-chaos terminate``).
3. When no task is READY or RUNNING, SIGTERM the workers; past the deadline, fail.
4. Compare the task rows with the ledger (one row per execution of a task body) and
   print one summary line; exit non-zero if any check failed. Full results go to
   ``bench/results/chaos-<timestamp>.json``; worker logs are kept on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchenv import (
    BENCH,
    MANAGE,
    PG_SERVER,
    REPO,
    RESULTS,
    TESTPROJECT,
    django_env,
    runtasks_command,
)

PG_DATABASE = "chaos"
PG_URL = f"postgres://root@127.0.0.1:5432/{PG_DATABASE}"
LEDGER_TABLE = "chaos_ledger"  # the same name as chaostasks.LEDGER_TABLE
TASK_PATH = "chaostasks.chaos_step"
ENQUEUE_CHUNK = 1000
TICK = 0.25
DESIGNED_TO_DIE = ("abort", "doomed")
# Log lines that mean something in a worker went wrong, not that it survived chaos as
# designed (reported; fatal with --strict-logs).
ERROR_MARKERS = (" ERROR ", " CRITICAL ", "crashed", "failed unexpectedly")
LOCKED = "database is locked"
TERMINAL = ("SUCCESSFUL", "FAILED")


def pg_restart_command() -> list[str]:
    """``pg_ctlcluster … restart`` for the cluster on port 5432 (version read, not assumed)."""
    listing = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout
    for line in listing.splitlines():
        version, cluster, port, *_ = line.split()
        if port == "5432":
            return ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart"]
    raise SystemExit("chaos: pg_lsclusters lists no cluster on port 5432 to restart")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# The plan: what each task does, decided here so the checks know what to expect
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    n: int
    kind: str  # ok | flaky | abort | doomed
    sleep: float


def make_plan(count: int, rng: random.Random, slow_fraction: float) -> list[Planned]:
    """~10 % fail their first attempt, ~1 % abort, ~1 % always fail; some are slow."""
    plan = []
    for n in range(count):
        draw = rng.random()
        if draw < 0.01:
            kind = "abort"
        elif draw < 0.02:
            kind = "doomed"
        elif draw < 0.12:
            kind = "flaky"
        else:
            kind = "ok"
        slow = rng.random() < slow_fraction
        sleep = rng.uniform(0.2, 1.0) if slow else rng.uniform(0.0, 0.02)
        plan.append(Planned(n, kind, round(sleep, 3)))
    return plan


# --------------------------------------------------------------------------------------
# Database set-up (the harness itself is a Django process too)
# --------------------------------------------------------------------------------------


def recreate_pg_database() -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DATABASE}")


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    for path in (str(REPO), str(TESTPROJECT), str(BENCH)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django

    django.setup()


def create_ledger(vendor: str) -> None:
    from django.db import connection

    at_type = "double precision" if vendor == "postgresql" else "REAL"
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {LEDGER_TABLE} (task_id text NOT NULL, attempt integer NOT NULL, "
            f"worker text NOT NULL, pid integer NOT NULL, at {at_type} NOT NULL)"
        )


def enqueue(plan: list[Planned]) -> dict[str, Planned]:
    from chaostasks import chaos_step

    from django_tasks_plus import enqueue_many

    by_id: dict[str, Planned] = {}
    for start in range(0, len(plan), ENQUEUE_CHUNK):
        chunk = plan[start : start + ENQUEUE_CHUNK]
        results = enqueue_many(chaos_step, [((p.n, p.kind, p.sleep), {}) for p in chunk])
        by_id.update((str(result.id), p) for result, p in zip(results, chunk, strict=True))
    return by_id


def status_counts() -> dict[str, int] | None:
    """Tasks per status, or None while the database is unreachable."""
    from django.db import DatabaseError, connection
    from django.db.models import Count

    from django_tasks_plus.models import TaskRecord

    try:
        rows = TaskRecord.objects.values_list("status").annotate(n=Count("id")).order_by()
        return {status: n for status, n in rows}
    except DatabaseError:
        connection.close()
        return None


def wait_until_registered(worker_ids: list[str], timeout: float) -> None:
    """Wait until every worker has its row (written after its signal handlers are set)."""
    from django.db import DatabaseError, connection

    from django_tasks_plus.models import WorkerRecord

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = WorkerRecord.objects.filter(worker_id__in=worker_ids).count()
        except DatabaseError:
            connection.close()
            found = -1
        if found == len(worker_ids):
            return
        time.sleep(TICK)


def fetch_state() -> tuple[list[dict[str, Any]], list[tuple[str, int, str, int, float]]]:
    from django.db import connection

    from django_tasks_plus.models import TaskRecord

    fields = ("id", "status", "attempt", "worker_ids", "errors", "return_value")
    rows = [
        {**row, "id": str(row["id"])}
        for row in TaskRecord.objects.values(*fields, "dead_letter_reason").iterator(2000)
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT task_id, attempt, worker, pid, at FROM {LEDGER_TABLE}")
        ledger = [(str(t), int(a), str(w), int(p), float(at)) for t, a, w, p, at in cursor]
    return rows, ledger


# --------------------------------------------------------------------------------------
# Workers and the chaos inflicted on them
# --------------------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    worker_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    killed: bool = False
    paused_until: float | None = None

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)


@dataclass
class Chaos:
    args: argparse.Namespace
    env: dict[str, str]
    log_dir: Path
    rng: random.Random
    started: float = field(default_factory=time.monotonic)
    workers: list[WorkerProcess] = field(default_factory=list)
    retired: list[WorkerProcess] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    kills: int = 0
    pauses: int = 0
    restarts: int = 0
    _serial: int = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self, event: str, **detail: Any) -> None:
        self.events.append({"t": round(self.elapsed(), 2), "event": event, **detail})
        log(f"  [{self.elapsed():6.1f}s] {event} {' '.join(f'{k}={v}' for k, v in detail.items())}")

    def start_worker(self) -> WorkerProcess:
        worker_id = f"chaos-{self._serial}"
        self._serial += 1
        log_path = self.log_dir / f"{worker_id}.log"
        command = runtasks_command(
            "--concurrency",
            str(self.args.concurrency),
            "--visibility-timeout",
            str(self.args.visibility),
            "--shutdown-timeout",
            "10",
            "--worker-id",
            worker_id,
        )
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                command,
                env=self.env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProcess(worker_id, proc, log_path)
        self.workers.append(worker)
        return worker

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.paused_until is None]

    def check_crashes(self) -> None:
        """A worker that exits on its own is a crash: record it and replace it."""
        for worker in list(self.workers):
            code = worker.proc.poll()
            if code is None:
                continue
            self.workers.remove(worker)
            self.retired.append(worker)
            tail = worker.log_path.read_text(errors="replace").splitlines()[-20:]
            self.crashes.append({"worker": worker.worker_id, "exit_code": code, "log_tail": tail})
            self.note("crash", worker=worker.worker_id, code=code)
            self.start_worker()

    def kill_one(self) -> None:
        candidates = self.live()
        if not candidates:
            return
        victim = self.rng.choice(candidates)
        victim.killed = True
        victim.signal(signal.SIGKILL)
        victim.proc.wait()
        self.workers.remove(victim)
        self.retired.append(victim)
        self.kills += 1
        replacement = self.start_worker()
        self.note("kill", worker=victim.worker_id, replacement=replacement.worker_id)

    def pause_one(self) -> None:
        candidates = self.live()
        if len(candidates) < 2:  # keep someone working
            return
        victim = self.rng.choice(candidates)
        seconds = 2 * self.args.visibility
        victim.signal(signal.SIGSTOP)
        victim.paused_until = time.monotonic() + seconds
        self.pauses += 1
        self.note("pause", worker=victim.worker_id, seconds=seconds)

    def resume_due(self, *, force: bool = False) -> bool:
        resumed = False
        for worker in self.workers:
            if worker.paused_until is not None and (
                force or time.monotonic() >= worker.paused_until
            ):
                worker.signal(signal.SIGCONT)
                worker.paused_until = None
                resumed = True
                self.note("resume", worker=worker.worker_id)
        return resumed

    def cut_database(self) -> None:
        began = time.monotonic()
        if self.args.db_chaos == "restart":
            restart = pg_restart_command()
            done = subprocess.run(restart, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise SystemExit(f"chaos: {' '.join(restart)} failed: {done.stderr.strip()}")
        else:
            import psycopg

            with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    [PG_DATABASE],
                )
        self.restarts += 1
        self.note(f"db-{self.args.db_chaos}", seconds=round(time.monotonic() - began, 2))

    def stop_all(self, grace: float) -> list[dict[str, Any]]:
        """SIGCONT the paused, SIGTERM everyone, wait; SIGKILL (and report) stragglers."""
        self.resume_due(force=True)
        # A worker still starting up has no SIGTERM handler yet and would just die.
        wait_until_registered([w.worker_id for w in self.workers], timeout=20)
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        problems = []
        for worker in self.workers:
            try:
                code = worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.signal(signal.SIGKILL)
                worker.proc.wait()
                problems.append({"worker": worker.worker_id, "problem": "did not stop"})
                continue
            if code != 0:
                problems.append({"worker": worker.worker_id, "problem": f"exit code {code}"})
        self.retired.extend(self.workers)
        self.workers = []
        return problems


def drive(chaos: Chaos, total: int, deadline: float) -> tuple[bool, dict[str, int]]:
    """Run the chaos schedule until every task is finished; False if the deadline passed."""
    args = chaos.args
    # Disruptions happen one at a time, in this order, at these shares of finished tasks.
    plan = [("pause", 0.2), ("db", 0.4), ("pause", 0.6)]
    if args.db_chaos == "none":
        plan = [step for step in plan if step[0] != "db"]
    pauses = [step for step in plan if step[0] == "pause"][: args.pauses]
    plan = [step for step in plan if step[0] != "pause" or step in pauses]
    first_kill_mark = 0.1
    next_kill = time.monotonic() + chaos.rng.uniform(*args.kill_every)
    calm_until = 0.0  # no new disruption (and no kill after the database) until then
    last_progress = 0.0
    counts: dict[str, int] = {}
    while True:
        now = time.monotonic()
        if now > deadline:
            return False, counts
        chaos.check_crashes()
        if chaos.resume_due():
            calm_until = time.monotonic() + args.visibility
        polled = status_counts()
        if polled is not None:
            counts = polled
            pending = counts.get("READY", 0) + counts.get("RUNNING", 0)
            if pending == 0 and sum(counts.values()) >= total:
                return True, counts
            done = 1 - pending / total
            if now - last_progress >= 5:
                last_progress = now
                log(
                    f"  [{chaos.elapsed():6.1f}s] done {total - pending}/{total} "
                    f"{dict(sorted(counts.items()))} workers={len(chaos.workers)}"
                )
            paused = any(w.paused_until is not None for w in chaos.workers)
            if plan and done >= plan[0][1] and not paused and now >= calm_until:
                step, _ = plan.pop(0)
                if step == "pause":
                    chaos.pause_one()
                else:
                    chaos.cut_database()
                    calm_until = time.monotonic() + args.visibility
            elif (now >= next_kill or (chaos.kills == 0 and done >= first_kill_mark)) and (
                now >= calm_until or paused
            ):
                chaos.kill_one()
                next_kill = time.monotonic() + chaos.rng.uniform(*args.kill_every)
        time.sleep(TICK)


# --------------------------------------------------------------------------------------
# Checks: the task rows against the ledger
# --------------------------------------------------------------------------------------


def _error_class(error: Any) -> str:
    return str(error.get("exception_class_path", "")) if isinstance(error, dict) else ""


def analyse(
    plan: dict[str, Planned],
    rows: list[dict[str, Any]],
    ledger: Iterable[tuple[str, int, str, int, float]],
) -> dict[str, Any]:
    """Compare the final rows with what really ran; every list holds violations."""
    runs: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for task_id, attempt, worker, _pid, _at in ledger:
        runs[task_id].append((attempt, worker))
    seen = {row["id"] for row in rows}
    by_status = Counter(row["status"] for row in rows)
    designed = {task_id for task_id, p in plan.items() if p.kind in DESIGNED_TO_DIE}
    dead = {row["id"] for row in rows if row["status"] == "FAILED"}

    stale: list[dict[str, Any]] = []
    duplicates: list[dict[str, Any]] = []
    reexecutions = 0
    lease_expired = 0
    for row in rows:
        task_id, status, attempt = row["id"], row["status"], row["attempt"]
        worker = row["worker_ids"][-1] if row["worker_ids"] else None
        errors = row["errors"] or []
        executions = runs.get(task_id, [])
        lease_expired += sum(_error_class(e).endswith(".LeaseExpired") for e in errors)

        per_attempt = Counter(a for a, _ in executions)
        duplicates += [
            {"task": task_id, "attempt": a, "runs": n} for a, n in per_attempt.items() if n > 1
        ]

        problems: list[str] = []
        if status not in TERMINAL:
            continue
        latest = max((a for a, _ in executions), default=0)
        if latest > attempt:
            problems.append(f"attempt {latest} ran but the row records {attempt} attempts")
        # Attempts whose outcome the row took from the task body (not a lease expiry).
        accepted: dict[int, str | None] = {}
        for error in errors:
            if isinstance(error, dict) and not _error_class(error).endswith(".LeaseExpired"):
                accepted[int(error.get("attempt", -1))] = error.get("worker_id")
        if status == "SUCCESSFUL":
            accepted[attempt] = worker
            if (attempt, worker) not in executions:
                problems.append(f"no execution of attempt {attempt} by {worker} logged")
            value = row["return_value"]
            if not (isinstance(value, list) and value[:2] == [attempt, worker]):
                problems.append(f"return value {value!r} is not from attempt {attempt} by {worker}")
        else:
            last = errors[-1] if errors else {}
            if not isinstance(last, dict) or (last.get("attempt"), last.get("worker_id")) != (
                attempt,
                worker,
            ):
                problems.append(
                    f"last error {last!r:.120} is not from attempt {attempt} by {worker}"
                )
        for run_attempt, run_worker in executions:
            if run_attempt not in accepted:
                reexecutions += 1
            elif run_worker != accepted[run_attempt]:
                problems.append(
                    f"attempt {run_attempt} ran on {run_worker}, outcome by {accepted[run_attempt]}"
                )
        stale += [
            {"task": task_id, "status": status, "attempt": attempt, "problem": problem}
            for problem in problems
        ]

    designed_causes = Counter()
    for row in rows:
        if row["id"] in designed and row["status"] == "FAILED" and row["errors"]:
            designed_causes[_error_class(row["errors"][-1]).rsplit(".", 1)[-1]] += 1
    return {
        "statuses": dict(by_status),
        "lost": sorted(set(plan) - seen),
        "unexpected_rows": sorted(seen - set(plan)),
        "unfinished": sorted(row["id"] for row in rows if row["status"] not in TERMINAL),
        "succeeded": by_status.get("SUCCESSFUL", 0),
        "dead": len(dead),
        "designed": len(designed),
        "dead_not_designed": sorted(dead - designed),
        "designed_not_dead": sorted(designed - dead),
        "designed_causes": dict(designed_causes),
        "stale_writes": stale,
        "duplicate_executions": duplicates,
        "reexecutions": reexecutions,
        "ledger_rows": sum(len(v) for v in runs.values()),
        "lease_expired": lease_expired,
    }


def scan_logs(paths: Iterable[Path]) -> dict[str, Any]:
    error_lines: list[str] = []
    locked: list[str] = []
    warnings = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if "WARNING" in line:
                warnings += 1
            if any(marker in line for marker in ERROR_MARKERS):
                error_lines.append(f"{path.name}: {line}")
            if LOCKED in line:
                locked.append(f"{path.name}: {line}")
    return {"error_lines": error_lines, "locked_lines": locked, "warning_lines": warnings}


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, help="tasks to enqueue (5000; SQLite 1000)")
    parser.add_argument("--long", action="store_true", help="100,000 tasks, fewer slow ones")
    parser.add_argument("--sqlite", action="store_true", help="temporary SQLite file, 2 workers")
    parser.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    parser.add_argument("--deadline", type=float, help="seconds before the run fails")
    parser.add_argument("--workers", type=int, help="worker processes (3; SQLite 2)")
    parser.add_argument("--concurrency", type=int, help="threads per worker (8; SQLite 4)")
    parser.add_argument("--visibility", type=float, default=3.0, help="lease seconds (3)")
    parser.add_argument(
        "--kill-every", type=float, nargs=2, default=(3.0, 6.0), metavar=("MIN", "MAX")
    )
    parser.add_argument("--pauses", type=int, default=2, choices=(0, 1, 2))
    parser.add_argument("--db-chaos", choices=("restart", "terminate", "none"), default="restart")
    parser.add_argument("--slow-fraction", type=float, help="share of slow tasks (0.2; long 0.02)")
    parser.add_argument(
        "--strict-logs", action="store_true", help="fail on ERROR lines in worker logs"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs on success")
    args = parser.parse_args(argv)
    if args.sqlite:
        args.db_chaos = "none"
    default_tasks = 100_000 if args.long else (1000 if args.sqlite else 5000)
    args.tasks = args.tasks or default_tasks
    args.workers = args.workers or (2 if args.sqlite else 3)
    args.concurrency = args.concurrency or (4 if args.sqlite else 8)
    if args.slow_fraction is None:
        args.slow_fraction = 0.02 if args.long else 0.2
    if args.deadline is None:
        args.deadline = 180 + args.tasks * (0.1 if args.sqlite else 0.03)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    vendor = "sqlite" if args.sqlite else "postgresql"
    rng = random.Random(args.seed)
    log_dir = Path(tempfile.mkdtemp(prefix=f"chaos-{vendor}-"))
    if args.sqlite:
        url = f"sqlite:///{log_dir / 'chaos.sqlite3'}"
    else:
        recreate_pg_database()
        url = PG_URL
    env = django_env(url)
    log(f"chaos: {vendor}, {args.tasks} tasks, seed {args.seed}, logs in {log_dir}")
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env, cwd=REPO, check=True
    )
    setup_django(env)
    create_ledger("sqlite" if args.sqlite else "postgresql")
    plan = make_plan(args.tasks, rng, args.slow_fraction)
    began = time.monotonic()
    by_id = enqueue(plan)
    log(f"chaos: enqueued {len(by_id)} tasks in {time.monotonic() - began:.1f} s")

    from django.db import connection

    connection.close()
    chaos = Chaos(args, env, log_dir, rng)
    for _ in range(args.workers):
        chaos.start_worker()
    finished, counts = False, {}
    try:
        finished, counts = drive(chaos, len(by_id), chaos.started + args.deadline)
    finally:
        stop_problems = chaos.stop_all(grace=30)
    duration = chaos.elapsed()

    rows, ledger = fetch_state()
    report = analyse(by_id, rows, ledger)
    logs = scan_logs(w.log_path for w in chaos.retired)

    failures = []
    if not finished:
        failures.append(f"deadline of {args.deadline:.0f} s passed with {counts}")
    if report["unfinished"]:
        failures.append(f"{len(report['unfinished'])} task(s) not finished")
    if report["lost"] or report["unexpected_rows"]:
        failures.append(f"{len(report['lost'])} lost, {len(report['unexpected_rows'])} unknown")
    if report["stale_writes"]:
        failures.append(f"{len(report['stale_writes'])} stale write(s)")
    if report["duplicate_executions"]:
        failures.append(f"{len(report['duplicate_executions'])} attempt(s) ran twice")
    if report["dead_not_designed"] or report["designed_not_dead"]:
        failures.append(
            f"dead-letter set differs: {len(report['dead_not_designed'])} died unplanned, "
            f"{len(report['designed_not_dead'])} planned deaths survived"
        )
    if chaos.crashes:
        failures.append(f"{len(chaos.crashes)} worker(s) exited on their own")
    if args.strict_logs and logs["error_lines"]:
        failures.append(f"{len(logs['error_lines'])} error line(s) in worker logs")
    if args.sqlite and logs["locked_lines"]:
        failures.append(f"'{LOCKED}' appears {len(logs['locked_lines'])} time(s) in worker logs")
    if stop_problems:
        failures.append(f"workers did not stop cleanly: {stop_problems}")
    if chaos.kills == 0 or chaos.pauses < args.pauses:
        failures.append(f"chaos incomplete (kills={chaos.kills}, pauses={chaos.pauses})")
    if args.db_chaos != "none" and chaos.restarts == 0:
        failures.append("the database was never restarted")

    summary = (
        f"chaos: tasks={len(by_id)} succeeded={report['succeeded']} dead={report['dead']} "
        f"(designed {report['designed']}) kills={chaos.kills} pauses={chaos.pauses} "
        f"restarts={chaos.restarts} lost={len(report['lost'])} "
        f"stale_writes={len(report['stale_writes'])} reexecutions={report['reexecutions']} "
        f"duration={duration:.0f}s lease_expired={report['lease_expired']} "
        f"worker_errors={len(logs['error_lines'])}"
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"chaos-{stamp}{'-sqlite' if args.sqlite else ''}.json"
    sample = 50
    document = {
        "summary": summary,
        "passed": not failures,
        "failures": failures,
        "backend": vendor,
        "config": {k: v for k, v in vars(args).items()},
        "duration_s": round(duration, 2),
        "kills": chaos.kills,
        "pauses": chaos.pauses,
        "restarts": chaos.restarts,
        "events": chaos.events,
        "crashes": chaos.crashes,
        "stop_problems": stop_problems,
        "log_dir": str(log_dir) if failures or args.keep_logs else None,
        "workers_started": [w.worker_id for w in chaos.retired],
        **{k: (v[:sample] if isinstance(v, list) else v) for k, v in report.items()},
        "counts": {k: len(v) for k, v in report.items() if isinstance(v, list)},
        "logs": {
            "error_lines": logs["error_lines"][:sample],
            "locked_lines": logs["locked_lines"][:sample],
            "warning_lines": logs["warning_lines"],
        },
    }
    out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(summary, flush=True)
    for line in logs["error_lines"][:5]:
        log(f"chaos: worker log: {line}")
    log(
        f"chaos: ledger_rows={report['ledger_rows']} "
        f"designed_causes={report['designed_causes']} results in {out.relative_to(REPO)}"
    )
    if failures:
        for failure in failures:
            log(f"chaos: FAILED: {failure}")
        log(f"chaos: worker logs kept in {log_dir}")
        return 1
    if args.keep_logs:
        log(f"chaos: worker logs kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
