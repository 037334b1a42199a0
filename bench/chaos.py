"""Chaos run: workers are killed, paused and cut off from the database while they drain.

One command, ``python bench/chaos.py`` (PostgreSQL) or ``python bench/chaos.py --sqlite``:

1. Recreate the database (PostgreSQL ``chaos``, or a temporary SQLite file), migrate, add
   the ``chaos_ledger`` and ``chaos_leak`` tables, and enqueue N ``chaostasks.chaos_step``
   tasks whose arguments say how each behaves (slow, failing once, designed to die,
   returning an unstorable string, leaking a transaction).
2. Start worker processes (``runtasks``, each in its own session), plus one whose host
   clock runs ``--skew`` seconds ahead (``bench/skewed_clock.py``), and, while they drain:
   SIGKILL a random worker every few seconds and start a replacement under a new worker
   id; SIGSTOP a worker for twice its visibility timeout, then SIGCONT it; restart
   PostgreSQL once (or terminate every backend, ``--db-chaos terminate``); hold
   ``LOCK TABLE … IN ACCESS EXCLUSIVE MODE`` on the task table for twice the visibility
   timeout, and (``rowlock``) hold a few running tasks' rows locked for as long, as task
   code's or an operator's open transaction can (PostgreSQL).
3. When no task is READY or RUNNING, SIGTERM the workers; past the deadline, fail.
4. Compare the task rows with the ledger (one row per execution of a task body) and
   print one summary line; exit non-zero if any check failed. Full results go to
   ``bench/results/chaos-<timestamp>.json``; worker logs are kept on failure.

A task may run again only because of a disruption it was caught in: each kill, pause,
database cut and lock stall records the tasks in flight, and each such task is allowed
one re-run per disruption; a row lock excuses only the tasks whose rows it held. Any
other re-run (``unexcused_reruns``) fails the run.

``--faults`` picks the newer faults (``stall,rowlock,skew,surrogate,leak``, all by
default);
``--no-kills --pauses 0 --no-restart`` leaves only them, for a run beside other users of
the PostgreSQL server (``--pg-database`` names the database to recreate).
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
LEDGER_TABLE = "chaos_ledger"  # the same name as chaostasks.LEDGER_TABLE
LEAK_TABLE = "chaos_leak"  # the same name as chaostasks.LEAK_TABLE
SKEW_LAUNCHER = BENCH / "skewed_clock.py"
ENQUEUE_CHUNK = 1000
TICK = 0.25
DESIGNED_TO_DIE = ("abort", "doomed", "surrogate")
FAULTS = ("stall", "rowlock", "skew", "surrogate", "leak")
# How many running tasks' rows the row-lock fault holds locked.
ROWLOCK_TASKS = 3
# Class names the worker records for the two misbehaving task kinds.
SURROGATE_ERROR = "ReturnValueNotSerializable"
LEAK_ERROR = "TransactionLeaked"
# Every 97th task returns a lone surrogate and every 53rd leaks a transaction, so both
# are spread over the run and land in different outcome batches.
SURROGATE_EVERY, LEAK_EVERY = 97, 53
LONG_EVERY = 41
# How attempt 1 of a leaking task may end instead when a disruption caught it: its lease
# ran out (kill, pause, stall), or its own query failed (database restart or cut).
DISRUPTED_ATTEMPT = (["LeaseExpired"], ["OperationalError"], ["InterfaceError"])
# Seconds after a lock stall within which a claim that waited on the lock starts its body.
STALL_CLAIM_GRACE = 1.0
# Seconds around a database cut within which an attempt's failed query was caused by it.
DB_CUT_GRACE = 2.0
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
    kind: str  # ok | flaky | abort | doomed | surrogate | leak | long
    sleep: float


def make_plan(
    count: int,
    rng: random.Random,
    slow_fraction: float,
    faults: frozenset[str] = frozenset(),
    long_sleep: float = 0.0,
) -> list[Planned]:
    """~10 % fail their first attempt, ~1 % abort, ~1 % always fail; some are slow.

    With the ``surrogate`` and ``leak`` faults, every 97th task returns an unstorable
    string and every 53rd leaks a transaction on its first attempt. With ``long_sleep``
    (the lock stall), every 41st is ``long``: it sleeps longer than a lease and a stall,
    so only heartbeats keep it leased, and it is still running when a stall ends.
    """
    plan = []
    for n in range(count):
        draw = rng.random()
        if "surrogate" in faults and n % SURROGATE_EVERY == SURROGATE_EVERY // 2:
            kind = "surrogate"
        elif "leak" in faults and n % LEAK_EVERY == LEAK_EVERY // 2:
            kind = "leak"
        elif long_sleep and n % LONG_EVERY == LONG_EVERY // 2:
            kind = "long"
        elif draw < 0.01:
            kind = "abort"
        elif draw < 0.02:
            kind = "doomed"
        elif draw < 0.12:
            kind = "flaky"
        else:
            kind = "ok"
        slow = rng.random() < slow_fraction
        sleep = rng.uniform(0.2, 1.0) if slow else rng.uniform(0.0, 0.02)
        if kind == "long":
            sleep = long_sleep
        plan.append(Planned(n, kind, round(sleep, 3)))
    return plan


# --------------------------------------------------------------------------------------
# Database set-up (the harness itself is a Django process too)
# --------------------------------------------------------------------------------------


def recreate_pg_database(name: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")


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
        # Rows written inside transactions that ``leak`` tasks leave open: must vanish.
        cursor.execute(
            f"CREATE TABLE {LEAK_TABLE} (task_id text NOT NULL, attempt integer NOT NULL)"
        )


def enqueue(plan: list[Planned]) -> dict[str, Planned]:
    from chaostasks import chaos_long, chaos_step

    from django_tasks_plus import enqueue_many

    by_id: dict[str, Planned] = {}
    for task, planned in (
        (chaos_step, [p for p in plan if p.kind != "long"]),
        (chaos_long, [p for p in plan if p.kind == "long"]),
    ):
        for start in range(0, len(planned), ENQUEUE_CHUNK):
            chunk = planned[start : start + ENQUEUE_CHUNK]
            results = enqueue_many(task, [((p.n, p.kind, p.sleep), {}) for p in chunk])
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


def running_holders() -> dict[str, str] | None:
    """RUNNING task id -> the worker holding it; None while the database is unreachable."""
    from django.db import DatabaseError, connection

    from django_tasks_plus.models import TaskRecord

    try:
        rows = TaskRecord.objects.filter(status="RUNNING").values_list("id", "worker_ids")
        return {str(pk): (ids[-1] if ids else "") for pk, ids in rows}
    except DatabaseError:
        connection.close()
        return None


def fetch_state() -> tuple[
    list[dict[str, Any]], list[tuple[str, int, str, int, float]], list[tuple[str, int]]
]:
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
        cursor.execute(f"SELECT task_id, attempt FROM {LEAK_TABLE}")
        leaked = [(str(t), int(a)) for t, a in cursor]
    return rows, ledger, leaked


# --------------------------------------------------------------------------------------
# Workers and the chaos inflicted on them
# --------------------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    worker_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    skewed: bool = False
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
    stalls: int = 0
    stall_problems: list[str] = field(default_factory=list)
    rowlocks: int = 0
    rowlock_caught: int = 0
    # Task id -> re-runs it may have: one per disruption it was in flight at.
    allowance: Counter[str] = field(default_factory=Counter)
    stall_caught: set[str] = field(default_factory=set)
    # (lock taken, lock released), in the database's epoch seconds.
    stall_windows: list[tuple[float, float]] = field(default_factory=list)
    # (cut began, database back), in epoch seconds (this host's clock, the database's host).
    db_windows: list[tuple[float, float]] = field(default_factory=list)
    _serial: int = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self, event: str, **detail: Any) -> None:
        self.events.append({"t": round(self.elapsed(), 2), "event": event, **detail})
        log(f"  [{self.elapsed():6.1f}s] {event} {' '.join(f'{k}={v}' for k, v in detail.items())}")

    def start_worker(self, *, skewed: bool = False) -> WorkerProcess:
        worker_id = f"chaos-{'skew-' if skewed else ''}{self._serial}"
        self._serial += 1
        log_path = self.log_dir / f"{worker_id}.log"
        options = [
            "--concurrency",
            str(self.args.concurrency),
            "--visibility-timeout",
            str(self.args.visibility),
            "--shutdown-timeout",
            "10",
            "--worker-id",
            worker_id,
        ]
        command = runtasks_command(*options)
        if skewed:  # the same runtasks, through the launcher that shifts the host clock
            launcher = [sys.executable, str(SKEW_LAUNCHER), "--skew", str(self.args.skew)]
            command = launcher + command[command.index("runtasks") + 1 :]
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                command,
                env=self.env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProcess(worker_id, proc, log_path, skewed=skewed)
        self.workers.append(worker)
        return worker

    def live(self) -> list[WorkerProcess]:
        """Workers that may be killed or paused: running, and not the skewed one (its
        fault is its clock; killing it would only make the drain wait for its leases)."""
        return [w for w in self.workers if w.paused_until is None and not w.skewed]

    def excuse(self, cause: str, task_ids: Iterable[str]) -> int:
        """Allow each of ``task_ids`` one more re-run, caught in ``cause``."""
        ids = sorted(set(task_ids))
        self.allowance.update(ids)
        if cause == "stall":
            self.stall_caught.update(ids)
        return len(ids)

    def excuse_blocked_claims(self, ledger: Iterable[tuple[str, int, str, int, float]]) -> int:
        """Count as caught in a stall the tasks whose claim waited on the lock.

        Such a claim commits the moment the lock is released, so its body starts within
        about a second after that (the ledger's time is the database's). A few tasks
        claimed normally just after the release are excused too; that errs on the
        lenient side by at most one re-run each.
        """
        caught = {
            task_id
            for task_id, _attempt, _worker, _pid, at in ledger
            if any(
                locked <= at <= released + STALL_CLAIM_GRACE
                for locked, released in self.stall_windows
            )
        }
        return self.excuse("stall", caught - self.stall_caught)

    def excuse_failed_queries(self, rows: Iterable[dict[str, Any]]) -> int:
        """Allow a re-run for each attempt whose own query failed during a database cut.

        An attempt claimed just before a restart can fail (``OperationalError``) and have
        that failure written after the restart, by which time it is no longer RUNNING:
        ``cut_database`` cannot see it in flight. Its recorded error time says it was.
        """
        excused: list[str] = []
        for row in rows:
            for error in row["errors"] or []:
                if (
                    not isinstance(error, dict)
                    or [_error_class(error).rsplit(".", 1)[-1]] not in (DISRUPTED_ATTEMPT[1:])
                ):
                    continue
                at = _epoch(error.get("at"))
                if at is not None and any(
                    began - DB_CUT_GRACE <= at <= back + DB_CUT_GRACE
                    for began, back in self.db_windows
                ):
                    excused.append(row["id"])
        fresh = {task_id for task_id in excused if self.allowance[task_id] == 0}
        self.allowance.update(fresh)
        return len(fresh)

    def held_by(self, worker_id: str) -> list[str]:
        holders = running_holders() or {}
        return [task_id for task_id, holder in holders.items() if holder == worker_id]

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
            self.start_worker(skewed=worker.skewed)

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
        # Dead, it claims nothing more: what it holds now is what the kill caught.
        caught = self.excuse("kill", self.held_by(victim.worker_id))
        replacement = self.start_worker()
        self.note("kill", worker=victim.worker_id, replacement=replacement.worker_id, caught=caught)

    def pause_one(self) -> None:
        candidates = self.live()
        if len(candidates) < 2:  # keep someone working
            return
        victim = self.rng.choice(candidates)
        seconds = 2 * self.args.visibility
        victim.signal(signal.SIGSTOP)
        victim.paused_until = time.monotonic() + seconds
        self.pauses += 1
        time.sleep(0.5)  # a claim sent just before SIGSTOP may still commit
        caught = self.excuse("pause", self.held_by(victim.worker_id))
        self.note("pause", worker=victim.worker_id, seconds=seconds, caught=caught)

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
        began_epoch = time.time()
        in_flight = set(running_holders() or {})
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
                    [self.args.pg_database],
                )
        self.restarts += 1
        self.db_windows.append((began_epoch, time.time()))
        # Claims that committed just before the cut are in flight too.
        in_flight |= set(running_holders() or {})
        caught = self.excuse("db", in_flight)
        self.note(
            f"db-{self.args.db_chaos}", seconds=round(time.monotonic() - began, 2), caught=caught
        )

    def stall(self) -> None:
        """Hold ACCESS EXCLUSIVE on the task table for twice the visibility timeout.

        Every worker statement on the table waits meanwhile: claims, heartbeats, outcome
        writes. The tasks RUNNING while the lock is held are the ones the stall caught;
        so are those whose claim waited on the lock (see ``excuse_blocked_claims``). Each
        may run once more, nothing else may.
        """
        import psycopg

        from django_tasks_plus.models import TaskRecord

        table = TaskRecord._meta.db_table
        seconds = 2 * self.args.visibility
        began = time.monotonic()
        try:
            with psycopg.connect(f"{PG_SERVER}/{self.args.pg_database}") as conn:
                # Never queue behind a transaction some task left open for ever.
                conn.execute("SET lock_timeout = '10s'")
                conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                waited = time.monotonic() - began
                rows = conn.execute(f"SELECT id FROM {table} WHERE status = 'RUNNING'")
                caught = {str(row[0]) for row in rows}
                locked_at = _db_epoch(conn)
                time.sleep(seconds)
                released_at = _db_epoch(conn)
                conn.commit()
        except psycopg.Error as exc:
            problem = f"the lock stall could not hold the task table: {exc}".strip()
            self.stall_problems.append(problem)
            self.note("stall-failed", error=str(exc).strip()[:120])
            return
        self.stalls += 1
        self.stall_windows.append((locked_at, released_at))
        count = self.excuse("stall", caught)
        self.note("stall", seconds=seconds, waited=round(waited, 2), caught=count)

    def lock_rows(self) -> bool:
        """Hold a few RUNNING tasks' rows locked (``FOR UPDATE``) for twice the visibility
        timeout, as task code's or an operator's open transaction can; False when no
        task was running to lock.

        Only those tasks may run once more: the lock can outlast their leases. Every
        other task of their workers must go on as if nothing happened (their outcomes
        written, their leases renewed, new tasks claimed).
        """
        import psycopg

        from django_tasks_plus.models import TaskRecord

        table = TaskRecord._meta.db_table
        seconds = 2 * self.args.visibility
        try:
            with psycopg.connect(f"{PG_SERVER}/{self.args.pg_database}") as conn:
                conn.execute("SET lock_timeout = '10s'")
                rows = conn.execute(
                    f"SELECT id FROM {table} WHERE status = 'RUNNING' ORDER BY random() "
                    f"LIMIT {ROWLOCK_TASKS} FOR UPDATE SKIP LOCKED"
                )
                caught = {str(row[0]) for row in rows}
                if not caught:
                    conn.rollback()
                    return False
                time.sleep(seconds)
                conn.commit()
        except psycopg.Error as exc:
            problem = f"the row lock could not be held: {exc}".strip()
            self.stall_problems.append(problem)
            self.note("rowlock-failed", error=str(exc).strip()[:120])
            return True
        self.rowlocks += 1
        self.rowlock_caught += self.excuse("rowlock", caught)
        self.note("rowlock", seconds=seconds, caught=len(caught))
        return True

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
    # The stall comes late: with few tasks left to claim, a task it caught is claimed again
    # at once, so a worker that mixes up two attempts of one task shows it.
    plan = [("pause", 0.2), ("db", 0.4), ("pause", 0.6), ("rowlock", 0.75), ("stall", 0.9)]
    if args.db_chaos == "none":
        plan = [step for step in plan if step[0] != "db"]
    if not stall_enabled(args):
        plan = [step for step in plan if step[0] != "stall"]
    if not rowlock_enabled(args):
        plan = [step for step in plan if step[0] != "rowlock"]
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
                elif step == "stall":
                    chaos.stall()
                    calm_until = time.monotonic() + args.visibility
                elif step == "rowlock":
                    if chaos.lock_rows():
                        calm_until = time.monotonic() + args.visibility
                    else:  # nothing running at this moment: try again next tick
                        plan.insert(0, (step, done))
                else:
                    chaos.cut_database()
                    calm_until = time.monotonic() + args.visibility
            elif (
                not args.no_kills
                and (now >= next_kill or (chaos.kills == 0 and done >= first_kill_mark))
                and (now >= calm_until or paused)
            ):
                chaos.kill_one()
                next_kill = time.monotonic() + chaos.rng.uniform(*args.kill_every)
        time.sleep(TICK)


# --------------------------------------------------------------------------------------
# Checks: the task rows against the ledger
# --------------------------------------------------------------------------------------


def _error_class(error: Any) -> str:
    return str(error.get("exception_class_path", "")) if isinstance(error, dict) else ""


def _epoch(iso: Any) -> float | None:
    """An error record's ``at`` (ISO 8601) in epoch seconds; None when unreadable."""
    try:
        return datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return None


# Failures raised by the task body after its ledger row was committed: such an attempt
# must have its ledger row, or a write of the body was lost.
BODY_ERRORS = ("PlannedFailure", "Doomed", "Abort", SURROGATE_ERROR, LEAK_ERROR)


def analyse(
    plan: dict[str, Planned],
    rows: list[dict[str, Any]],
    ledger: Iterable[tuple[str, int, str, int, float]],
    leaked: Iterable[tuple[str, int]] = (),
    allowance: Counter[str] | None = None,
    stall_caught: Iterable[str] = (),
) -> dict[str, Any]:
    """Compare the final rows with what really ran; every list holds violations."""
    allowance = allowance or Counter()
    stall_caught = set(stall_caught)
    runs: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for task_id, attempt, worker, _pid, _at in ledger:
        runs[task_id].append((attempt, worker))
    seen = {row["id"] for row in rows}
    by_status = Counter(row["status"] for row in rows)
    designed = {task_id for task_id, p in plan.items() if p.kind in DESIGNED_TO_DIE}
    dead = {row["id"] for row in rows if row["status"] == "FAILED"}

    stale: list[dict[str, Any]] = []
    lost_writes: list[dict[str, Any]] = []
    duplicates: list[dict[str, Any]] = []
    unexcused: list[dict[str, Any]] = []
    reexecutions = 0
    stall_reruns = 0
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
                if (
                    _error_class(error).rsplit(".", 1)[-1] in BODY_ERRORS
                    and (
                        error.get("attempt"),
                        error.get("worker_id"),
                    )
                    not in executions
                ):
                    lost_writes.append(
                        {"task": task_id, "attempt": error.get("attempt"), "outcome": "failed"}
                    )
        if status == "SUCCESSFUL":
            accepted[attempt] = worker
            if (attempt, worker) not in executions:
                lost_writes.append({"task": task_id, "attempt": attempt, "outcome": "succeeded"})
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
        reruns = 0
        for run_attempt, run_worker in executions:
            if run_attempt not in accepted:
                reruns += 1
            elif run_worker != accepted[run_attempt]:
                problems.append(
                    f"attempt {run_attempt} ran on {run_worker}, outcome by {accepted[run_attempt]}"
                )
        reexecutions += reruns
        if task_id in stall_caught:
            stall_reruns += reruns
        if reruns > allowance[task_id]:
            unexcused.append(
                {"task": task_id, "reruns": reruns, "allowed": allowance[task_id], "kind": None}
            )
        stale += [
            {"task": task_id, "status": status, "attempt": attempt, "problem": problem}
            for problem in problems
        ]
    for entry in unexcused:
        planned = plan.get(entry["task"])
        entry["kind"] = planned.kind if planned else None

    worn_out = {
        row["id"]
        for row in rows
        if row["id"] in dead - designed and _worn_out_by_chaos(row, plan, allowance)
    }
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
        "dead_not_designed": sorted(dead - designed - worn_out),
        "dead_not_designed_details": [
            _death(row, plan) for row in rows if row["id"] in dead - designed - worn_out
        ],
        "worn_out_by_chaos": sorted(worn_out),
        "designed_not_dead": sorted(designed - dead),
        "designed_causes": dict(designed_causes),
        "stale_writes": stale,
        "lost_writes": lost_writes,
        "duplicate_executions": duplicates,
        "reexecutions": reexecutions,
        "unexcused_reruns": unexcused,
        "stall_caught": len(stall_caught),
        "stall_reruns": stall_reruns,
        **misbehaving_tasks(plan, rows, leaked, allowance),
        "ledger_rows": sum(len(v) for v in runs.values()),
        "lease_expired": lease_expired,
    }


def _worn_out_by_chaos(
    row: dict[str, Any], plan: dict[str, Planned], allowance: Counter[str]
) -> bool:
    """Whether a task died only because chaos spent its attempts: every failed attempt was
    a disruption it was caught in (at most its allowance) or its own designed first
    failure, and the retry policy then gave up, as it must."""
    planned = plan.get(row["id"])
    classes = [_error_class(e).rsplit(".", 1)[-1] for e in row["errors"] or []]
    disrupted = sum([c] in DISRUPTED_ATTEMPT for c in classes)
    designed_first = {"flaky": "PlannedFailure", "leak": LEAK_ERROR}.get(
        planned.kind if planned else "", ""
    )
    others = [c for c in classes if [c] not in DISRUPTED_ATTEMPT and c != designed_first]
    return (
        bool(classes)
        and not others
        and disrupted <= allowance[row["id"]]
        and str(row.get("dead_letter_reason") or "").startswith("gave up after")
    )


def _death(row: dict[str, Any], plan: dict[str, Planned]) -> dict[str, Any]:
    """What the report shows of an unplanned death: enough to tell its cause."""
    planned = plan.get(row["id"])
    return {
        "task": row["id"],
        "kind": planned.kind if planned else None,
        "attempt": row["attempt"],
        "workers": row["worker_ids"],
        "errors": [
            (e.get("attempt"), _error_class(e).rsplit(".", 1)[-1], e.get("at"))
            for e in row["errors"] or []
            if isinstance(e, dict)
        ],
        "reason": str(row.get("dead_letter_reason") or "")[:300],
    }


def misbehaving_tasks(
    plan: dict[str, Planned],
    rows: list[dict[str, Any]],
    leaked: Iterable[tuple[str, int]],
    allowance: Counter[str],
) -> dict[str, Any]:
    """The designed outcomes of ``surrogate`` and ``leak`` tasks; lists hold violations.

    * surrogate: dead-lettered, its last error ``ReturnValueNotSerializable``, and no
      other error from its own body (it is not retried), unless a disruption it was
      caught in made an earlier attempt's own query fail.
    * leak: attempt 1 failed with ``TransactionLeaked``, then the task succeeded; the row
      it wrote inside the transaction it left open was rolled back. A task caught in a
      disruption during attempt 1 may instead have lost that attempt to its lease, or
      (a database restart or cut) seen its own query fail.
    """
    by_id = {row["id"]: row for row in rows}
    wrong: dict[str, list[dict[str, Any]]] = {"surrogate": [], "leak": []}
    planned = Counter()
    for task_id, p in plan.items():
        if p.kind not in wrong or task_id not in by_id:
            continue
        planned[p.kind] += 1
        row = by_id[task_id]
        errors = [e for e in row["errors"] or [] if isinstance(e, dict)]
        classes = [_error_class(e).rsplit(".", 1)[-1] for e in errors]
        body = [c for c in classes if c != "LeaseExpired"]
        if p.kind == "surrogate":
            # Dead-lettered on its first complete run; a run before that may only have
            # been cut short by a disruption it was caught in (its own query failing in a
            # database restart or cut).
            earlier = body[:-1]
            ok = (
                row["status"] == "FAILED"
                and body[-1:] == [SURROGATE_ERROR]
                and (
                    not earlier
                    or (allowance[task_id] > 0 and all([c] in DISRUPTED_ATTEMPT for c in earlier))
                )
            )
        else:
            first = [c for e, c in zip(errors, classes, strict=True) if e.get("attempt") == 1]
            ok = row["status"] == "SUCCESSFUL" and (
                first == [LEAK_ERROR] or (first in DISRUPTED_ATTEMPT and allowance[task_id] > 0)
            )
        if not ok:
            wrong[p.kind].append(
                {"task": task_id, "status": row["status"], "errors": classes, "n": p.n}
            )
    return {
        "surrogates_planned": planned["surrogate"],
        "surrogates_wrong": wrong["surrogate"],
        "leaks_planned": planned["leak"],
        "leaks_wrong": wrong["leak"],
        "leaked_rows_kept": sorted({task_id for task_id, _ in leaked}),
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


def _db_epoch(conn: Any) -> float:
    """The database's clock, in epoch seconds, through a psycopg connection."""
    row = conn.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()
    return float(row[0])


def stall_enabled(args: argparse.Namespace) -> bool:
    """The lock stall needs PostgreSQL's LOCK TABLE; SQLite has no table locks."""
    return "stall" in args.faults and not args.sqlite


def rowlock_enabled(args: argparse.Namespace) -> bool:
    """The row lock needs PostgreSQL's row locks; SQLite locks the whole database."""
    return "rowlock" in args.faults and not args.sqlite


def _designed(report: dict[str, Any], kind: str) -> str:
    """``as-designed/planned`` for the surrogate or leak tasks."""
    planned = report[f"{kind}_planned"]
    return f"{planned - len(report[f'{kind}_wrong'])}/{planned}"


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
    parser.add_argument("--no-kills", action="store_true", help="kill no worker")
    parser.add_argument("--db-chaos", choices=("restart", "terminate", "none"), default="restart")
    parser.add_argument(
        "--no-restart",
        action="store_true",
        help="leave the PostgreSQL server alone (the same as --db-chaos none)",
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help="comma-separated, from stall and rowlock (PostgreSQL), skew, surrogate, leak; "
        "'' for none (default: all)",
    )
    parser.add_argument(
        "--skew", type=float, default=90.0, help="seconds the skewed worker's clock is ahead (90)"
    )
    parser.add_argument(
        "--pg-database", default=PG_DATABASE, help=f"database to recreate ({PG_DATABASE})"
    )
    parser.add_argument("--slow-fraction", type=float, help="share of slow tasks (0.2; long 0.02)")
    parser.add_argument(
        "--strict-logs", action="store_true", help="fail on ERROR lines in worker logs"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs on success")
    args = parser.parse_args(argv)
    faults = frozenset(name.strip() for name in args.faults.split(",") if name.strip())
    if faults - set(FAULTS):
        parser.error(f"unknown fault(s) {sorted(faults - set(FAULTS))}; known: {FAULTS}")
    args.faults = faults
    if not args.pg_database.isidentifier():
        parser.error("--pg-database must be a plain identifier")
    if args.sqlite or args.no_restart:
        args.db_chaos = "none"
    default_tasks = 100_000 if args.long else (1000 if args.sqlite else 5000)
    args.tasks = args.tasks or default_tasks
    args.workers = args.workers or (2 if args.sqlite else 3)
    args.concurrency = args.concurrency or (4 if args.sqlite else 8)
    if args.slow_fraction is None:
        args.slow_fraction = 0.02 if args.long else 0.2
    if args.deadline is None:
        args.deadline = 180 + args.tasks * (0.1 if args.sqlite else 0.03)
        if "skew" in args.faults:  # a skewed clock may delay retries by the skew
            args.deadline += args.skew
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
        recreate_pg_database(args.pg_database)
        url = f"{PG_SERVER.replace('postgresql://', 'postgres://')}/{args.pg_database}"
    env = django_env(url)
    log(
        f"chaos: {vendor}, {args.tasks} tasks, seed {args.seed}, "
        f"faults {','.join(sorted(args.faults)) or 'none'}, logs in {log_dir}"
    )
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env, cwd=REPO, check=True
    )
    setup_django(env)
    create_ledger("sqlite" if args.sqlite else "postgresql")
    # Long tasks outlive a lease and the stall: with the stall only (PostgreSQL).
    long_sleep = 3 * args.visibility if stall_enabled(args) else 0.0
    plan = make_plan(args.tasks, rng, args.slow_fraction, args.faults, long_sleep)
    began = time.monotonic()
    by_id = enqueue(plan)
    log(f"chaos: enqueued {len(by_id)} tasks in {time.monotonic() - began:.1f} s")

    from django.db import connection

    connection.close()
    chaos = Chaos(args, env, log_dir, rng)
    for _ in range(args.workers):
        chaos.start_worker()
    if "skew" in args.faults:
        chaos.start_worker(skewed=True)
    finished, counts = False, {}
    try:
        finished, counts = drive(chaos, len(by_id), chaos.started + args.deadline)
    finally:
        stop_problems = chaos.stop_all(grace=30)
    duration = chaos.elapsed()

    rows, ledger, leaked = fetch_state()
    chaos.excuse_blocked_claims(ledger)
    chaos.excuse_failed_queries(rows)
    report = analyse(by_id, rows, ledger, leaked, chaos.allowance, chaos.stall_caught)
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
    if report["lost_writes"]:
        failures.append(
            f"{len(report['lost_writes'])} attempt(s) reported done whose own committed write "
            "is missing (a transaction left open by an earlier task swallowed it?)"
        )
    if report["duplicate_executions"]:
        failures.append(f"{len(report['duplicate_executions'])} attempt(s) ran twice")
    if report["unexcused_reruns"]:
        kinds = Counter(str(entry["kind"]) for entry in report["unexcused_reruns"])
        failures.append(
            f"{len(report['unexcused_reruns'])} task(s) ran again without being in flight at a "
            f"kill, pause, database cut, stall or row lock (or more often than those allow): "
            f"{dict(kinds)}"
        )
    if report["surrogates_wrong"]:
        failures.append(
            f"{len(report['surrogates_wrong'])} of {report['surrogates_planned']} surrogate "
            f"task(s) did not end dead-lettered with {SURROGATE_ERROR} alone"
        )
    if report["leaks_wrong"]:
        failures.append(
            f"{len(report['leaks_wrong'])} of {report['leaks_planned']} leaking task(s) did "
            f"not fail attempt 1 with {LEAK_ERROR} and then succeed"
        )
    if report["leaked_rows_kept"]:
        failures.append(
            f"{len(report['leaked_rows_kept'])} row(s) written inside a leaked transaction "
            "were committed instead of rolled back"
        )
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
    if (chaos.kills == 0 and not args.no_kills) or chaos.pauses < args.pauses:
        failures.append(f"chaos incomplete (kills={chaos.kills}, pauses={chaos.pauses})")
    if args.db_chaos != "none" and chaos.restarts == 0:
        failures.append("the database was never restarted")
    failures += chaos.stall_problems
    if stall_enabled(args) and chaos.stalls == 0 and not chaos.stall_problems:
        failures.append("the lock stall never happened")
    if rowlock_enabled(args) and chaos.rowlocks == 0 and not chaos.stall_problems:
        failures.append("the row lock never happened")
    skewed = sum(w.skewed for w in chaos.retired)

    summary = (
        f"chaos: tasks={len(by_id)} succeeded={report['succeeded']} dead={report['dead']} "
        f"(designed {report['designed']}, worn out by chaos {len(report['worn_out_by_chaos'])}) "
        f"kills={chaos.kills} pauses={chaos.pauses} "
        f"restarts={chaos.restarts} stalls={chaos.stalls} "
        f"rowlocks={chaos.rowlocks}/{chaos.rowlock_caught} skewed={skewed} "
        f"lost={len(report['lost'])} stale_writes={len(report['stale_writes'])} "
        f"lost_writes={len(report['lost_writes'])} reexecutions={report['reexecutions']} "
        f"unexcused_reruns={len(report['unexcused_reruns'])} "
        f"stall_reruns={report['stall_reruns']}/{report['stall_caught']} "
        f"surrogates={_designed(report, 'surrogates')} leaks={_designed(report, 'leaks')} "
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
        "config": {k: sorted(v) if isinstance(v, frozenset) else v for k, v in vars(args).items()},
        "duration_s": round(duration, 2),
        "kills": chaos.kills,
        "pauses": chaos.pauses,
        "stalls": chaos.stalls,
        "rowlocks": chaos.rowlocks,
        "rowlock_caught": chaos.rowlock_caught,
        "skewed_workers": skewed,
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
        for death in report["dead_not_designed_details"][:5]:
            log(f"chaos: unplanned death: {death}")
        for name in ("leaks_wrong", "surrogates_wrong", "unexcused_reruns", "stale_writes"):
            for entry in report[name][:5]:
                log(f"chaos: {name}: {entry}")
        log(f"chaos: worker logs kept in {log_dir}")
        return 1
    if args.keep_logs:
        log(f"chaos: worker logs kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
