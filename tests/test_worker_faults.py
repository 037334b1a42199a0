"""Faults a production fleet meets, against real databases and real worker processes.

A database stall longer than the lease, a host whose clock runs ahead, task code that
leaves a transaction open or raises exceptions that cannot be printed, values the
database refuses, a database connection that died between an outcome and its signals,
and an in-process burst run that must leave no session open behind it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus, task_backends
from django_tasks_plus.db.store import renew_leases
from django_tasks_plus.lifecycle import Succeeded, transition
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.execution import _run_all
from django_tasks_plus.worker.reporter import Reporter
from tests import tasks
from tests.conftest import REPO, claim_one, postgres_only, wait_for, worker_env, worker_log

pytestmark = pytest.mark.django_db(transaction=True)

SKEWED_CLOCK = REPO / "bench" / "skewed_clock.py"  # the chaos run starts it too


def _ledger() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n FROM {tasks.LEDGER_TABLE} ORDER BY n")
        return [row[0] for row in cursor.fetchall()]


def _row(result) -> TaskRecord:  # type: ignore[no-untyped-def]
    return TaskRecord.objects.get(pk=result.id)


def _runs(markers: Path, tag: str) -> int:
    path = markers / f"runs-{tag}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _other_connection():  # type: ignore[no-untyped-def]
    """A second, independent database session (not Django's thread-bound one)."""
    if connection.vendor == "postgresql":
        from tests.test_locked_rows import _other_session

        return _other_session()
    import sqlite3

    return sqlite3.connect(
        connection.settings_dict["NAME"], isolation_level=None, timeout=30, check_same_thread=False
    )


# -- a stall longer than the lease -------------------------------------------------------


def test_a_renewal_that_waited_for_a_table_lock_still_grants_a_whole_lease():
    """The new expiry is computed when the row is written, not before the lock wait.

    The lock is the table's (a row another session locks is skipped instead, renewed in
    a later round: tests/test_locked_rows.py)."""
    tasks.add.enqueue(1, 2)
    claimed = claim_one()
    other = _other_connection()
    held = threading.Event()
    released_at: list[float] = []

    def hold_the_row() -> None:
        if connection.vendor == "postgresql":
            other.execute("BEGIN")  # SHARE: every writer of the table waits for it
            other.execute(f"LOCK TABLE {TaskRecord._meta.db_table} IN SHARE MODE")
        else:
            other.execute("BEGIN IMMEDIATE")  # SQLite: the database's write lock
        held.set()
        time.sleep(2.0)
        released_at.append(time.time())
        other.execute("COMMIT")

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    held.wait(10)
    try:
        assert renew_leases("default", [(claimed.id, claimed.lease_token)], 1.0) == set()
    finally:
        holder.join()
        other.close()
    expires = _row(claimed).lease_expires_at.timestamp()
    # A whole second after the wait ended (the old code: one second after the call began,
    # which is already in the past by then).
    assert expires >= released_at[0] + 0.9, (expires, released_at[0])


@postgres_only
def test_a_stall_longer_than_the_lease_costs_at_most_one_rerun(start_worker, markers, tmp_path):
    """Another session locks the task table for twice the visibility timeout while a task
    runs: the task may run once more because of it, then everything settles normally."""
    long_one = tasks.counts_runs.enqueue("long", 10.0)  # still running after the stall
    worker = start_worker(
        "--worker-id", "stalled", "--queue", "slow", "--visibility-timeout", "3",
        "--concurrency", "2",
    )  # fmt: skip
    wait_for(lambda: _runs(markers, "long") == 1)
    _stall_the_task_table(6.0)
    # After the stall: more tasks, each of which must run exactly once.
    after = [tasks.counts_runs.enqueue(f"after-{n}", 0.2) for n in range(4)]

    def settled() -> bool:
        rows = [_row(result) for result in (long_one, *after)]
        return all(row.status in ("SUCCESSFUL", "FAILED") for row in rows)

    wait_for(settled, timeout=60)
    log = worker_log(tmp_path)
    assert _row(long_one).status == TaskResultStatus.SUCCESSFUL, log
    assert _runs(markers, "long") <= 2, log
    for n, result in enumerate(after):
        assert _row(result).status == TaskResultStatus.SUCCESSFUL, log
        assert _runs(markers, f"after-{n}") == 1, log
    _stop(worker, tmp_path)


def _stall_the_task_table(seconds: float) -> None:
    """Make the task table unwritable for ``seconds``: PostgreSQL, ``LOCK TABLE … IN
    ACCESS EXCLUSIVE MODE`` (reads wait too); SQLite, another session's write
    transaction (what a paused process holding the write lock does to everyone)."""
    locker = _other_connection()
    try:
        if connection.vendor == "postgresql":
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {TaskRecord._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        else:
            locker.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)
        locker.execute("COMMIT")
    finally:
        locker.close()


def test_after_a_stall_another_workers_reaper_leaves_a_live_lease_alone(
    start_worker, markers, tmp_path
):
    """The task table is unwritable for twice the lease while one worker runs a long task
    and a second one idles: neither could renew or reap meanwhile. When the stall ends,
    the second worker's heartbeat knows it was held up, so it leaves the other workers'
    expired leases alone until they have had a lease's time to renew them. The task runs
    once, and its lease was never returned (before: a race between the holder's renewal
    and the other worker's reaper, which the reaper won about as often as not, the chaos
    run's skewed worker among its losers)."""
    from django_tasks_plus.models import WorkerRecord

    long_one = tasks.counts_runs.enqueue("long", 10.0)  # still running after the stall
    start_worker("--worker-id", "holder", "--queue", "slow", "--visibility-timeout", "3")
    wait_for(lambda: _runs(markers, "long") == 1)
    start_worker("--worker-id", "reaper", "--queue", "default", "--visibility-timeout", "3")
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="reaper").exists())
    _stall_the_task_table(6.0)
    wait_for(lambda: _row(long_one).status != TaskResultStatus.RUNNING, timeout=60)
    log = worker_log(tmp_path) + worker_log(tmp_path, 1)
    row = _row(long_one)
    assert row.status == TaskResultStatus.SUCCESSFUL, log
    assert _runs(markers, "long") == 1, log
    assert row.errors == [], log  # no LeaseExpired recorded: the lease was never returned
    assert "expired; now READY" not in log, log
    assert "was held up" in worker_log(tmp_path, 1), log


def test_an_outcome_that_met_a_stall_longer_than_the_lease_is_written_after_it(
    start_worker, markers, tmp_path
):
    """A task ends early in a stall three leases long: its outcome cannot be written for
    longer than the writer's deadline (the visibility timeout), and the renewal of its
    lease fails too, so the database is the trouble, not the batch. The writer keeps the
    outcome until the stall ends, and the outcome lands: the task ran once (before: the
    outcome was dropped at the deadline, and the lease then expired and the task ran
    again)."""
    short = tasks.counts_runs.enqueue("short", 1.0)  # ends a second into the stall
    start_worker("--worker-id", "writer", "--queue", "slow", "--visibility-timeout", "3")
    wait_for(lambda: _runs(markers, "short") == 1)
    _stall_the_task_table(9.0)  # the write's deadline and the question after it both fail
    wait_for(lambda: _row(short).status != TaskResultStatus.RUNNING, timeout=60)
    time.sleep(4.0)  # a lease's time more: a dropped outcome would have its task re-run
    log = worker_log(tmp_path)
    row = _row(short)
    assert row.status == TaskResultStatus.SUCCESSFUL, log
    assert _runs(markers, "short") == 1, log
    assert row.errors == [], log
    assert "Could not write" not in log, log
    if connection.vendor == "postgresql":  # SQLite's writes wait the stall out instead
        assert "Keeping 1 outcome(s) past 3 s" in log, log


# -- one row another session holds locked -----------------------------------------------


def _hold_row_lock(row_id: str, seconds: float, held: threading.Event) -> None:
    """Hold a row lock on one task row for ``seconds``, as task code or an operator's open
    transaction can (``SELECT ... FOR UPDATE``), then commit."""
    locker = _other_connection()
    try:
        locker.execute("BEGIN")
        locker.execute(
            f"SELECT 1 FROM {TaskRecord._meta.db_table} WHERE id = %s FOR UPDATE", [row_id]
        )
        held.set()
        time.sleep(seconds)
        locker.execute("COMMIT")
    finally:
        locker.close()


def _stop(worker: subprocess.Popen[bytes], logs: Path) -> None:
    """SIGTERM the worker and wait for it: its own bound is the shutdown timeout (30 s)
    for running tasks plus its services' stop, so waiting only 30 s could fail a worker
    that keeps its promise; one that breaks it fails the test with its log."""
    worker.terminate()
    try:
        worker.wait(timeout=45)
    except subprocess.TimeoutExpired:
        worker.kill()
        pytest.fail(f"the worker did not stop within 45 s of SIGTERM:\n{worker_log(logs)[-4000:]}")
    log = worker_log(logs)
    assert "Shutdown timeout" not in log, log[-4000:]  # no task of these tests is left running


@postgres_only
def test_one_locked_row_does_not_stall_the_workers_other_tasks(start_worker, markers, tmp_path):
    """Another session holds one running task's row locked for more than twice the lease,
    past the task's end. The worker's other work goes on meanwhile: tasks enqueued while
    the locked task's outcome waits are claimed and written at once, the other running
    task keeps its lease (a second worker would reap it otherwise), and the locked task
    settles once the lock is gone (at most one more run: the lock kept its lease from
    being renewed)."""
    locked = tasks.counts_runs.enqueue("locked", 0.5)  # finishes while its row is locked
    long_one = tasks.counts_runs.enqueue("long", 9.0)  # runs through the whole lock
    worker = start_worker(
        "--worker-id", "neighbour", "--queue", "slow", "--visibility-timeout", "3",
        "--concurrency", "4",
    )  # fmt: skip
    # Serves another queue; its heartbeat reaps any expired lease of the backend.
    start_worker("--worker-id", "reaper", "--queue", "default", "--visibility-timeout", "3")
    wait_for(lambda: _runs(markers, "locked") == 1 and _runs(markers, "long") == 1)
    held = threading.Event()
    holder = threading.Thread(target=_hold_row_lock, args=(str(locked.id), 8.0, held))
    holder.start()
    try:
        assert held.wait(10)
        time.sleep(1.5)  # the locked task has ended: its outcome waits for the row
        enqueued = time.monotonic()
        quick = [tasks.counts_runs.enqueue(f"quick-{n}", 0.1) for n in range(3)]
        wait_for(
            lambda: all(_row(r).status == TaskResultStatus.SUCCESSFUL for r in quick),
            timeout=6.0,
            seen=lambda: [_row(r).status for r in quick],
        )
        assert time.monotonic() - enqueued < 1.5, worker_log(tmp_path)
        assert _row(locked).status == TaskResultStatus.RUNNING  # still locked
    finally:
        holder.join()

    def settled() -> bool:
        return all(_row(r).status == TaskResultStatus.SUCCESSFUL for r in (locked, long_one))

    wait_for(settled, timeout=60)
    log = worker_log(tmp_path) + worker_log(tmp_path, 1)
    assert _runs(markers, "long") == 1, log
    assert _runs(markers, "locked") <= 2, log
    for n in range(3):
        assert _runs(markers, f"quick-{n}") == 1, log
    assert "lock timeout" not in log, log
    _stop(worker, tmp_path)


# -- a host whose clock runs ahead ------------------------------------------------------


def _skewed_worker(tmp_path: Path, seconds: float, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SKEWED_CLOCK), "--skew", str(seconds), *args],
        env=worker_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_worker_whose_clock_runs_ahead_does_not_take_a_live_task(start_worker, markers, tmp_path):
    result = tasks.counts_runs.enqueue("live", 5.0)
    start_worker(
        "--worker-id", "honest", "--queue", "slow", "--visibility-timeout", "2",
        "--max-tasks", "1",
    )  # fmt: skip
    wait_for(lambda: _runs(markers, "live") == 1)
    # A host 90 s ahead would see every lease as long expired by its own clock.
    for _ in range(3):
        proc = _skewed_worker(
            tmp_path, 90, "--burst", "--worker-id", "fast-clock", "--queue", "slow",
            "--visibility-timeout", "2",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        time.sleep(0.5)
    wait_for(lambda: _row(result).status == TaskResultStatus.SUCCESSFUL, timeout=30)
    row = _row(result)
    assert row.worker_ids == ["honest"], worker_log(tmp_path)
    assert _runs(markers, "live") == 1
    assert row.errors == []


def test_a_worker_whose_clock_runs_ahead_schedules_retries_by_the_database_clock(tmp_path):
    result = tasks.fails_with_backoff.enqueue()
    proc = _skewed_worker(tmp_path, 90, "--burst", "--worker-id", "fast-clock")
    assert proc.returncode == 0, proc.stderr
    # The worker says what it noticed: about 90 s (the measured offset loses part of a
    # round trip, so a loaded machine may print 89.9).
    noticed = re.search(r"clock is (\d+\.\d) s ahead of", proc.stderr)
    assert noticed is not None, proc.stderr
    assert 89 <= float(noticed.group(1)) <= 91
    row = _row(result)
    assert row.status == TaskResultStatus.READY
    due_in = (row.run_after - timezone.now()).total_seconds()
    assert 20 < due_in <= 31, due_in  # 30 s of backoff, not 120
    assert abs((row.last_attempted_at - timezone.now()).total_seconds()) < 10


@pytest.mark.parametrize("use_tz", [True, False])
def test_the_worker_clock_reads_the_host_clock_as_timezone_now_does(settings, monkeypatch, use_tz):
    """The worker's clock (``DatabaseClock``) reads ``USE_TZ`` once and the host's time
    through ``time.time()``: aware UTC or naive local time, as ``timezone.now()`` gives
    them, and a host clock that is off (what ``bench/skewed_clock.py`` plays) is seen."""
    from django_tasks_plus.worker.dbclock import DatabaseClock

    settings.USE_TZ = use_tz
    clock = DatabaseClock("default")
    before = timezone.now()
    read = clock()
    after = timezone.now()
    assert (read.tzinfo is not None) is use_tz
    assert before <= read <= after
    host_time = time.time
    monkeypatch.setattr(time, "time", lambda: host_time() + 90)
    assert 89 < (clock() - timezone.now()).total_seconds() < 91


# -- task code that misuses its connection ----------------------------------------------


@pytest.mark.parametrize("leaker", ["leaks_transaction", "leaks_autocommit_off"])
def test_a_leaked_transaction_is_rolled_back_and_fails_its_attempt(leaker, ledger, run_worker):
    leaking = getattr(tasks, leaker).enqueue(1)
    followers = [tasks.record.enqueue(n) for n in (2, 3, 4)]
    # One thread, so the followers run on the connection the leaker left behind.
    proc = run_worker("--burst", "--concurrency", "1", "--prefetch", "0", timeout=60)
    assert proc.returncode == 0, proc.stderr

    row = _row(leaking)
    assert row.status == TaskResultStatus.FAILED
    assert row.errors[-1]["exception_class_path"] == (
        "django_tasks_plus.exceptions.TransactionLeaked"
    )
    assert "left a transaction open on database 'default'" in row.errors[-1]["traceback"]
    for result in followers:
        assert _row(result).status == TaskResultStatus.SUCCESSFUL
    # The leaker's write was rolled back; every follower's write is committed.
    assert _ledger() == [2, 3, 4]


def test_an_exception_that_cannot_be_printed_follows_the_tasks_own_policy(
    run_worker, markers, tmp_path
):
    once = tasks.raises_unprintable.enqueue()  # max_attempts=1: no retry
    aborted = tasks.aborts_unprintably.enqueue()  # Abort: dead-lettered at once
    proc = run_worker("--burst", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr

    for result, marker in ((once, "unprintable-runs"), (aborted, "unprintable-abort-runs")):
        row = _row(result)
        assert row.status == TaskResultStatus.FAILED
        assert (markers / marker).read_text().splitlines() == ["run"]
        assert "str() raised RuntimeError" in row.dead_letter_reason
        assert len(row.errors) == 1
    signals = (tmp_path / "signals.log").read_text()
    assert f"finished {once.id} FAILED" in signals
    assert f"finished {aborted.id} FAILED" in signals


def test_error_text_the_database_cannot_store_is_kept_escaped(run_worker):
    bad = tasks.raises_with_surrogate.enqueue()
    good = [tasks.add.enqueue(n, n) for n in range(30)]
    proc = run_worker("--burst", "--concurrency", "4")
    assert proc.returncode == 0, proc.stderr
    row = _row(bad)
    assert row.status == TaskResultStatus.FAILED
    assert len(row.errors) == 3  # NO_WAIT: three attempts, each recorded
    assert "bad file name \\udcff" in row.errors[0]["traceback"]
    for n, result in enumerate(good):
        good_row = _row(result)
        assert (good_row.status, good_row.return_value) == ("SUCCESSFUL", 2 * n)
        assert good_row.attempt == 1


def test_a_batch_that_fails_alone_is_given_up_after_one_more_deadline(monkeypatch, caplog):
    """Past its deadline the writer asks whether the database takes any write, by
    renewing the batch's leases (for real). It does here: only the batch's own write
    fails (a poison batch), so it is given up after one more deadline, not kept for
    ever, and the lease, renewed, still reads as held by the claim."""
    from django.db import OperationalError

    backend = task_backends["default"]
    tasks.add.enqueue(1, 1)
    claimed = claim_one(visibility_timeout=30)
    attempts: list[float] = []

    def batch_write_fails(self, completions, *, expect_locks=False):  # type: ignore[no-untyped-def]
        attempts.append(time.monotonic())
        raise OperationalError("canceling statement due to statement timeout")

    monkeypatch.setattr(Reporter, "_write", batch_write_fails)
    reporter = Reporter("default", persist_deadline=0.6, clock=timezone.now)
    told: list[bool] = []
    done = threading.Event()
    reporter.start()
    began = time.monotonic()
    try:
        outcome = transition(
            claimed, Succeeded(2), policy=backend.settings.retry, now=timezone.now()
        )
        reporter.submit(claimed, outcome, lambda ok: (told.append(ok), done.set()))
        assert done.wait(30)
    finally:
        reporter.stop()
        reporter.join(10)
        connection.close()
    took = time.monotonic() - began
    assert told == [False]
    # Tried past the first deadline (one more deadline from the question), then given up.
    assert 0.6 <= took < 10, took
    assert len(attempts) >= 3 and attempts[-1] - attempts[0] >= 0.6, attempts
    row = _row(claimed)
    assert row.status == TaskResultStatus.RUNNING and row.lease_token == claimed.lease_token
    assert row.lease_expires_at > timezone.now()  # renewed by the question, for 30 s
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("Could not write 1 outcome(s)") for m in messages), messages
    assert not any(m.startswith("Keeping") for m in messages), messages


def test_a_stalled_database_keeps_the_outcomes_until_the_worker_stops(monkeypatch, caplog):
    """Neither the batch nor the renewal of its leases gets through (the database is
    gone): the outcome is kept past every deadline while the worker runs, and given up
    within a deadline once the worker begins to stop, so shutdown keeps its bound."""
    from django.db import OperationalError

    from django_tasks_plus.worker import reporter as reporter_module

    backend = task_backends["default"]
    tasks.add.enqueue(1, 1)
    claimed = claim_one(visibility_timeout=30)

    def gone(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OperationalError("connection refused")

    monkeypatch.setattr(Reporter, "_write", gone)
    monkeypatch.setattr(reporter_module, "renew_leases", gone)
    reporter = Reporter("default", persist_deadline=0.3, clock=timezone.now)
    told: list[bool] = []
    done = threading.Event()
    reporter.start()
    try:
        outcome = transition(
            claimed, Succeeded(2), policy=backend.settings.retry, now=timezone.now()
        )
        reporter.submit(claimed, outcome, lambda ok: (told.append(ok), done.set()))
        assert not done.wait(3.0)  # ten deadlines: still kept
        assert told == []
        stopping = time.monotonic()
        reporter.stop_soon()
        assert done.wait(15)
        assert time.monotonic() - stopping < 0.3 + 5.0 + 1.0  # a deadline and a pause
    finally:
        reporter.stop()
        reporter.join(10)
        connection.close()
    assert told == [False]
    messages = [record.getMessage() for record in caplog.records]
    assert sum(m.startswith("Keeping 1 outcome(s)") for m in messages) == 1, messages
    assert any(m.startswith("Could not write 1 outcome(s)") for m in messages), messages


@postgres_only
def test_an_outcome_the_database_refuses_is_recorded_alone():
    """The last line of defence: a batch with one value the database refuses (jsonb has
    no lone surrogates; the codec refuses them earlier, but a bug or a custom path might
    not) lands every other outcome and dead-letters that one task with
    OutcomeNotStorable, instead of losing the batch and running it all again."""
    backend = task_backends["default"]
    results = [tasks.add.enqueue(n, n) for n in range(5)]
    claimed = [claim_one() for _ in results]
    landed: dict[str, bool] = {}
    done = threading.Event()
    reporter = Reporter("default", persist_deadline=5.0, clock=timezone.now)
    reporter.start()
    now = timezone.now()
    for index, task in enumerate(claimed):
        value = "\udcff" if index == 2 else index  # a lone surrogate: UTF-8 cannot hold it
        outcome = transition(task, Succeeded(value), policy=backend.settings.retry, now=now)

        def written(ok: bool, task_id: str = task.id) -> None:
            landed[task_id] = ok
            if len(landed) == len(claimed):
                done.set()

        reporter.submit(task, outcome, written)
    assert done.wait(30)
    reporter.stop()
    reporter.join(10)

    for index, task in enumerate(claimed):
        row = TaskRecord.objects.get(pk=task.id)
        if index == 2:
            assert landed[task.id] is False
            assert row.status == TaskResultStatus.FAILED
            assert row.errors[-1]["exception_class_path"] == (
                "django_tasks_plus.exceptions.OutcomeNotStorable"
            )
            assert row.dead_letter_reason.startswith("the attempt's outcome (SUCCESSFUL)")
        else:
            assert landed[task.id] is True
            assert (row.status, row.return_value) == ("SUCCESSFUL", index)


# -- connections after a database restart, and after an in-process run -------------------


@postgres_only
def test_task_finished_receivers_get_a_live_connection_after_the_old_one_died():
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    killer = _other_connection()
    killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    killer.close()
    wait_for(lambda: not connection.is_usable(), timeout=5)
    seen: list[int] = []

    def receiver_work() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 41 + 1")
            seen.append(cursor.fetchone()[0])

    _run_all([receiver_work])
    assert seen == [42]


@postgres_only
def test_an_in_process_burst_run_leaves_no_session_open(transactional_db):
    for n in range(5):
        tasks.add.enqueue(n, n)
    call_command("runtasks", burst=True, concurrency=2, verbosity=0)
    assert TaskRecord.objects.filter(status=TaskResultStatus.SUCCESSFUL).count() == 5

    def others() -> list[tuple[object, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name, state, backend_start, left(query, 60) "
                "FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return list(cursor.fetchall())

    # Behind Django's connection pool the task threads' sessions went back to the pool,
    # which keeps them open: those, and only those, remain (all but this test's own).
    pool = connection.pool if connection.settings_dict["OPTIONS"].get("pool") else None
    expected = pool.get_stats()["pool_size"] - 1 if pool else 0
    # A session the worker closed leaves pg_stat_activity when its server process exits,
    # a moment after the client hung up (seen once on a loaded CI machine): allow 5 s.
    wait_for(lambda: len(others()) == expected, timeout=5, seen=others)


# -- one rule for ordering_failure="block" --------------------------------------------------


def test_under_block_an_unrunnable_row_blocks_its_key_and_a_cancellation_does_not(run_worker):
    """Every dead letter of a known task blocks its key under "block"; cancellation never."""
    corrupt = tasks.dies_and_blocks.using(ordering_key="corrupt").enqueue(1)
    TaskRecord.objects.filter(pk=corrupt.id).update(args={"not": "a list"})
    behind_corrupt = tasks.add.using(ordering_key="corrupt").enqueue(1, 1)
    cancelled = tasks.dies_and_blocks.using(ordering_key="cancelled").enqueue(2)
    tasks.dies_and_blocks.get_backend().cancel(cancelled.id)
    behind_cancelled = tasks.add.using(ordering_key="cancelled").enqueue(2, 2)

    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr

    row = _row(corrupt)
    assert (row.status, row.ordering_blocked) == (TaskResultStatus.FAILED, True)
    assert row.dead_letter_reason.startswith("stored arguments are corrupt")
    assert _row(behind_corrupt).status == TaskResultStatus.READY  # waits for redrive/discard
    row = _row(cancelled)
    assert (row.status, row.ordering_blocked) == (TaskResultStatus.FAILED, False)
    assert _row(behind_cancelled).status == TaskResultStatus.SUCCESSFUL


def test_the_unexpected_error_path_uses_the_tasks_own_policy_and_ordering_option():
    """When something outside the task's code breaks mid-attempt, the attempt is still
    settled by the task's own retry policy (one attempt here, where the backend's default
    would retry) and its ordering_failure="block"."""
    from django_tasks_plus.worker.execution import TaskRunner

    backend = task_backends["default"]
    result = tasks.dies_and_blocks.using(ordering_key="unexpected").enqueue(1)
    claimed = claim_one()
    written = threading.Event()
    reporter = Reporter("default", persist_deadline=5.0, clock=timezone.now)
    runner = TaskRunner(
        backend,
        clock=timezone.now,
        reporter=reporter,
        on_written=lambda task: written.set(),
        schedule=lambda job: job(),
    )
    reporter.start()
    try:
        runner._fail_unexpectedly(claimed, RuntimeError("the worker broke"), time.monotonic())
        assert written.wait(30)
    finally:
        reporter.stop()
        reporter.join(10)
    row = _row(result)
    assert (row.status, row.ordering_blocked) == (TaskResultStatus.FAILED, True)
    assert row.errors[-1]["exception_class_path"] == "builtins.RuntimeError"
