"""A task row another session holds locked, met by each writer that touches many rows.

Task code or an operator can hold a task's row locked for as long as a transaction stays
open (``SELECT ... FOR UPDATE``). The worker's writers of many rows (the outcome writer,
the lease renewal, the reaper) skip such a row rather than wait for it, so the lock costs
that one task a later write and no other task anything. PostgreSQL only: SQLite locks
the whole database, never one row.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus, task_backends
from django_tasks_plus.db.completions import apply_transitions
from django_tasks_plus.db.store import leases_still_held, renew_leases
from django_tasks_plus.lifecycle import ClaimedTask, Succeeded, transition
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.reaper import reap_expired
from django_tasks_plus.worker.reporter import Reporter
from tests import tasks
from tests.conftest import claim_one, heartbeat_of, postgres_only, worker_row

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

TABLE = TaskRecord._meta.db_table


def _other_session() -> psycopg.Connection:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding", "pool"):
        params.pop(key, None)
    return psycopg.connect(**params, autocommit=True)


@contextlib.contextmanager
def row_locked(task_id: str) -> Iterator[psycopg.Connection]:
    """Hold ``task_id``'s row locked in another session's open transaction."""
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(f"SELECT 1 FROM {TABLE} WHERE id = %s FOR UPDATE", [uuid.UUID(task_id)])
        yield other
        other.execute("COMMIT")
    finally:
        other.close()


def _claimed(count: int, visibility_timeout: float = 300) -> list[ClaimedTask]:
    for n in range(count):
        tasks.add.enqueue(n, n)
    return [claim_one(visibility_timeout=visibility_timeout) for _ in range(count)]


def _success(claimed: ClaimedTask, value: int = 7):  # type: ignore[no-untyped-def]
    backend = task_backends["default"]
    return transition(claimed, Succeeded(value), policy=backend.settings.retry, now=timezone.now())


def _status(claimed: ClaimedTask) -> str:
    return TaskRecord.objects.get(pk=claimed.id).status


@contextlib.contextmanager
def lock_timeout(seconds: float) -> Iterator[None]:
    """Bound this session's lock waits, so a statement that waited would fail the test."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{int(seconds * 1000)}ms"])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


# -- the outcome write --------------------------------------------------------------------


def test_an_outcome_write_skips_a_locked_row_and_writes_the_others_at_once():
    locked, free = _claimed(2)
    with row_locked(locked.id), lock_timeout(5.0):
        began = time.monotonic()
        landed = apply_transitions("default", [(locked, _success(locked)), (free, _success(free))])
        took = time.monotonic() - began
        assert landed == [False, True]
        assert took < 1.0, took  # skipped, not waited for
        # Still this attempt's: the writer may write it again.
        assert leases_still_held("default", [(locked.id, locked.lease_token)]) == {
            (locked.id, locked.lease_token)
        }
    assert (_status(locked), _status(free)) == ("RUNNING", "SUCCESSFUL")
    assert apply_transitions("default", [(locked, _success(locked))]) == [True]
    assert _status(locked) == "SUCCESSFUL"


def test_an_outcome_write_that_expects_locks_skips_at_once():
    """Outcomes written again after meeting a lock skip it without the short wait."""
    locked, free = _claimed(2)
    batch = [(locked, _success(locked)), (free, _success(free))]
    with row_locked(locked.id), lock_timeout(5.0):
        began = time.monotonic()
        assert apply_transitions("default", batch, expect_locks=True) == [False, True]
        took = time.monotonic() - began
    assert took < 0.09, took  # below the short wait (100 ms)


def test_an_outcome_write_in_a_transaction_skips_a_locked_row():
    """With an outcome hook the batch runs in a transaction, where a statement that
    timed out would spoil the rest: there the locked row is skipped at once, and the
    hook sees only the outcomes that landed."""
    from django_tasks_plus import extensions

    seen: list[str] = []
    locked, free = _claimed(2)
    with (
        extensions.outcome_hooks.registered(
            lambda batch: seen.extend(item.claimed.id for item in batch.outcomes)
        ),
        row_locked(locked.id),
        lock_timeout(5.0),
    ):
        landed = apply_transitions("default", [(locked, _success(locked)), (free, _success(free))])
    assert landed == [False, True]
    assert seen == [free.id]
    assert (_status(locked), _status(free)) == ("RUNNING", "SUCCESSFUL")


def test_a_lease_taken_over_is_not_held():
    [claimed] = _claimed(1)
    TaskRecord.objects.filter(pk=claimed.id).update(lease_token="someone-else")
    assert leases_still_held("default", [(claimed.id, claimed.lease_token)]) == set()
    assert leases_still_held("default", []) == set()


def _reporter(persist_deadline: float) -> Reporter:
    reporter = Reporter("default", persist_deadline=persist_deadline, clock=timezone.now)
    reporter.start()
    return reporter


def _submit(reporter: Reporter, claimed: ClaimedTask, landed: dict[str, tuple[bool, float]]):  # type: ignore[no-untyped-def]
    def written(ok: bool) -> None:
        landed[claimed.id] = (ok, time.monotonic())

    reporter.submit(claimed, _success(claimed), written)


def _wait(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_writer_sets_a_locked_outcome_aside_and_writes_it_once_the_lock_is_gone():
    locked, first, later = _claimed(3)
    landed: dict[str, tuple[bool, float]] = {}
    reporter = _reporter(persist_deadline=30.0)
    try:
        with row_locked(locked.id):
            _submit(reporter, locked, landed)
            _submit(reporter, first, landed)
            _wait(lambda: first.id in landed)
            _submit(reporter, later, landed)  # behind the locked one: not held up by it
            _wait(lambda: later.id in landed)
            time.sleep(0.5)
            assert locked.id not in landed  # not given up: set aside
            released = time.monotonic()
        _wait(lambda: locked.id in landed)
    finally:
        reporter.stop()
        reporter.join(10)
    assert landed[first.id][0] and landed[later.id][0]
    ok, at = landed[locked.id]
    assert ok is True
    assert at - released < 1.5  # written again within the longest pause
    assert [_status(c) for c in (locked, first, later)] == ["SUCCESSFUL"] * 3


def test_the_writer_gives_up_on_a_row_locked_past_its_deadline(caplog):
    [locked] = _claimed(1)
    landed: dict[str, tuple[bool, float]] = {}
    reporter = _reporter(persist_deadline=1.0)
    try:
        with row_locked(locked.id):
            began = time.monotonic()
            _submit(reporter, locked, landed)
            _wait(lambda: locked.id in landed, timeout=5.0)
            gave_up = time.monotonic() - began
    finally:
        reporter.stop()
        reporter.join(10)
    assert landed[locked.id][0] is False
    assert 0.9 <= gave_up < 3.0, gave_up
    assert _status(locked) == "RUNNING"  # its lease expires and the reaper returns it
    assert "held its row locked" in caplog.text


def test_a_stopping_writer_still_writes_an_outcome_set_aside():
    [locked] = _claimed(1)
    landed: dict[str, tuple[bool, float]] = {}
    reporter = _reporter(persist_deadline=30.0)
    release = threading.Event()

    def hold() -> None:
        with row_locked(locked.id):
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        _wait(lambda: _locked_by_someone(locked.id))
        _submit(reporter, locked, landed)
        time.sleep(0.3)
        reporter.stop()
        time.sleep(0.3)
        assert reporter.is_alive() and locked.id not in landed
        release.set()
        reporter.join(10)
    finally:
        release.set()
        holder.join(10)
    assert landed[locked.id][0] is True
    assert _status(locked) == "SUCCESSFUL"


def _locked_by_someone(task_id: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {TABLE} WHERE id = %s FOR UPDATE SKIP LOCKED",
            [uuid.UUID(task_id)],
        )
        return not cursor.fetchall()


# -- the lease renewal --------------------------------------------------------------------


def test_a_renewal_skips_a_locked_row_without_calling_its_lease_lost():
    locked, free = _claimed(2, visibility_timeout=5)
    before = {row.pk: row.lease_expires_at for row in TaskRecord.objects.all()}
    leases = [(locked.id, locked.lease_token), (free.id, free.lease_token)]
    with row_locked(locked.id), lock_timeout(5.0):
        began = time.monotonic()
        assert renew_leases("default", leases, 300) == set()
        assert time.monotonic() - began < 1.0
    after = {row.pk: row.lease_expires_at for row in TaskRecord.objects.all()}
    assert after[uuid.UUID(locked.id)] == before[uuid.UUID(locked.id)]  # not renewed yet
    assert after[uuid.UUID(free.id)] > before[uuid.UUID(free.id)] + timedelta(seconds=200)
    # Free again: the next round renews it.
    assert renew_leases("default", leases, 300) == set()
    renewed = TaskRecord.objects.get(pk=locked.id).lease_expires_at
    assert renewed > before[uuid.UUID(locked.id)] + timedelta(seconds=200)


def test_a_renewal_still_reports_a_lease_taken_over():
    mine, taken = _claimed(2)
    TaskRecord.objects.filter(pk=taken.id).update(lease_token="someone-else")
    leases = [(mine.id, mine.lease_token), (taken.id, taken.lease_token)]
    with row_locked(mine.id):
        assert renew_leases("default", leases, 300) == {(taken.id, taken.lease_token)}


# -- the reaper ---------------------------------------------------------------------------


def test_the_reaper_skips_a_locked_expired_row_and_returns_the_others():
    locked, free = _claimed(2, visibility_timeout=-1)  # both leases already expired
    backend = task_backends["default"]
    with row_locked(locked.id), lock_timeout(5.0):
        began = time.monotonic()
        assert reap_expired(backend, timezone.now) == 1
        assert time.monotonic() - began < 1.0
    assert (_status(locked), _status(free)) == (
        TaskResultStatus.RUNNING,
        TaskResultStatus.READY,
    )
    assert reap_expired(backend, timezone.now) == 1  # free again: returned now
    assert _status(locked) == TaskResultStatus.READY


@contextlib.contextmanager
def worker_row_locked(worker_id: str) -> Iterator[psycopg.Connection]:
    """Hold the worker row ``worker_id`` locked in another session's open transaction."""
    from django_tasks_plus.models import WorkerRecord

    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(
            f"SELECT 1 FROM {WorkerRecord._meta.db_table} WHERE worker_id = %s FOR UPDATE",
            [worker_id],
        )
        yield other
        other.execute("COMMIT")
    finally:
        other.close()


def _worker_row(worker_id: str, silent_for: timedelta = timedelta(0)) -> None:
    worker_row(worker_id, silent_for=silent_for, queues=[], visibility_timeout=1)


def test_a_locked_worker_row_costs_the_heartbeat_a_second_and_no_reaping(caplog):
    """A session keeps the worker's own row locked: the touch gives up after
    ``WORKER_ROW_LOCK_WAIT`` rather than the session's lock timeout (a third of the
    lease), and the round still returns a dead worker's expired lease."""
    from django_tasks_plus.db.store import WORKER_ROW_LOCK_WAIT
    from django_tasks_plus.models import WorkerRecord

    _worker_row("beating")
    beaten = WorkerRecord.objects.get(worker_id="beating").last_heartbeat_at
    [expired] = _claimed(1, visibility_timeout=-1)  # a dead worker's lease
    # The session's lock timeout: a third of the lease, 10 s.
    heartbeat = heartbeat_of("beating", visibility_timeout=30)
    try:
        with worker_row_locked("beating"):
            began = time.monotonic()
            heartbeat.beat()
            took = time.monotonic() - began
    finally:
        connection.close()  # the beat bounded this session's statements as a worker's
    assert WORKER_ROW_LOCK_WAIT <= took < WORKER_ROW_LOCK_WAIT + 3
    assert _status(expired) == TaskResultStatus.READY
    assert WorkerRecord.objects.get(worker_id="beating").last_heartbeat_at == beaten
    assert any("touch of the worker row failed" in r.getMessage() for r in caplog.records)
    heartbeat.beat()  # the row is free again: touched
    connection.close()
    assert WorkerRecord.objects.get(worker_id="beating").last_heartbeat_at > beaten


def test_the_leader_forgets_dead_workers_passing_over_a_locked_row():
    """A dead worker's row another session keeps locked (a worker stalled inside its
    touch, an operator) is passed over at once, not waited for on the leader's shared
    session, and the other dead workers are forgotten; the locked one in a later round."""
    from django_tasks_plus.db.store import prune_workers
    from django_tasks_plus.models import WorkerRecord

    for worker_id in ("dead-a", "dead-b", "dead-c"):
        _worker_row(worker_id, silent_for=timedelta(hours=1))
    with worker_row_locked("dead-b"), lock_timeout(5.0):
        began = time.monotonic()
        forgotten = prune_workers("default", timezone.now())
        assert time.monotonic() - began < 1.0
    assert sorted(forgotten) == ["dead-a", "dead-c"]
    assert prune_workers("default", timezone.now()) == ["dead-b"]
    assert not WorkerRecord.objects.exists()


def test_a_workers_own_row_writes_wait_for_a_locked_row_only_so_long():
    """Registering (a reused worker id) and removing at shutdown wait a bounded time for
    a row another session keeps locked, then fail with the database's lock error (the
    start reports it; the shutdown logs it and the leader forgets the row later)."""
    from django.db import OperationalError

    from django_tasks_plus.db.store import (
        WORKER_ROW_LOCK_WAIT,
        WorkerRegistration,
        register_worker,
        remove_worker,
    )

    _worker_row("reused")
    registration = WorkerRegistration(
        worker_id="reused",
        backend_name="default",
        queues=("default",),
        concurrency=1,
        visibility_timeout=30,
        started_at=timezone.now(),
    )
    with worker_row_locked("reused"), lock_timeout(5.0):
        for write in (
            lambda: register_worker("default", registration, timezone.now(), lock_wait=0.5),
            lambda: remove_worker("default", "reused"),
        ):
            began = time.monotonic()
            with pytest.raises(OperationalError, match="lock timeout"):
                write()
            assert time.monotonic() - began < WORKER_ROW_LOCK_WAIT + 1.0
    register_worker("default", registration, timezone.now())  # free again
    remove_worker("default", "reused")


def test_a_release_at_shutdown_leaves_a_locked_row_to_its_lease():
    from django_tasks_plus.db.completions import apply_outcome
    from django_tasks_plus.lifecycle import Released

    locked, free = _claimed(2)
    backend = task_backends["default"]
    released = {
        claimed.id: transition(
            claimed, Released(), policy=backend.settings.retry, now=timezone.now()
        )
        for claimed in (locked, free)
    }
    with row_locked(locked.id), lock_timeout(5.0):
        began = time.monotonic()
        assert apply_outcome("default", locked, released[locked.id], skip_locked=True) is False
        assert time.monotonic() - began < 1.0
        assert apply_outcome("default", free, released[free.id], skip_locked=True) is True
    assert (_status(locked), _status(free)) == (TaskResultStatus.RUNNING, TaskResultStatus.READY)


# -- the scheduler ------------------------------------------------------------------------


def _due_schedules(*names: str):  # type: ignore[no-untyped-def]
    """Runtime schedules of ``tests.tasks.add`` due a second ago; the backend's settings."""
    from django_tasks_plus.models import ScheduleRecord
    from django_tasks_plus.schedules import Every, api

    past = timezone.now() - timedelta(seconds=1)
    rows = [api.create(name, "tests.tasks.add", Every(hours=1), args=[1, 2]) for name in names]
    ScheduleRecord.objects.filter(pk__in=[row.pk for row in rows]).update(next_at=past)
    return task_backends["default"].settings


def test_the_scheduler_skips_a_locked_schedule_and_fires_the_others():
    """A schedule row the application keeps locked (editing it in an open transaction)
    stays due and fires once the lock is gone; the other due schedules fire meanwhile."""
    from django_tasks_plus.models import ScheduleRecord
    from django_tasks_plus.schedules.store import fire_due

    settings = _due_schedules("locked", "free")
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(
            f"SELECT 1 FROM {ScheduleRecord._meta.db_table} WHERE name = 'locked' FOR UPDATE"
        )
        with lock_timeout(5.0):
            began = time.monotonic()
            assert fire_due(settings, timezone.now) == 1
            assert time.monotonic() - began < 1.0
        fired = set(
            ScheduleRecord.objects.filter(last_fired_at__isnull=False).values_list(
                "name", flat=True
            )
        )
        assert fired == {"free"}
        other.execute("COMMIT")
    finally:
        other.close()
    assert fire_due(settings, timezone.now) == 1  # the lock is gone: it fires now
    assert ScheduleRecord.objects.filter(last_fired_at__isnull=True).count() == 0


# -- dedup keys --------------------------------------------------------------------------------

DEDUP_KEYS = "django_tasks_plus_dedupkey"


@contextlib.contextmanager
def key_being_taken(key: str) -> Iterator[psycopg.Connection]:
    """Another session's enqueue of ``key`` that has not committed (its INSERT of the key
    row, in a transaction still open); rolled back at the end."""
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(
            f"INSERT INTO {DEDUP_KEYS} "
            "(backend_name, key, task_ids, expires_at, until_finished, created_at) "
            "VALUES ('default', %s, '[]', now() + interval '1 hour', false, now())",
            [key],
        )
        yield other
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_an_enqueue_waits_for_a_key_being_taken_only_so_long(monkeypatch):
    """The other transaction may commit (the key is held) or roll back (it is free), so
    the enqueue waits for it, but only ``DEDUP_LOCK_WAIT``: then ``DedupKeyLocked``,
    nothing enqueued, and the caller's transaction still usable. Once the other has
    rolled back, the key is taken."""
    from django.db import transaction

    from django_tasks_plus import DedupKeyLocked
    from django_tasks_plus.db import dedup

    monkeypatch.setattr(dedup, "DEDUP_LOCK_WAIT", 0.5)
    with key_being_taken("busy"), lock_timeout(5.0):
        with transaction.atomic():  # in the caller's transaction: bounded in a savepoint
            kept = tasks.add.enqueue(0, 0)
            began = time.monotonic()
            with pytest.raises(DedupKeyLocked) as info:
                tasks.add.using(dedup_key="busy").enqueue(1, 2)
            took = time.monotonic() - began
            assert list(TaskRecord.objects.values_list("pk", flat=True)) == [uuid.UUID(kept.id)]
            assert _session_lock_timeout() == "5s"  # the caller's own bound, given back
        assert 0.5 <= took < 2.0
        began = time.monotonic()  # in the enqueue's own transaction: bounded by its INSERT
        with pytest.raises(DedupKeyLocked):
            tasks.add.using(dedup_key="busy").enqueue(1, 2)
        assert 0.5 <= time.monotonic() - began < 2.0
        assert _session_lock_timeout() == "5s"
    assert info.value.retryable and info.value.key == "busy"
    assert str(info.value).startswith(
        "Dedup key 'busy' of backend 'default': another transaction is taking it and has not ended"
    )
    taken = tasks.add.using(dedup_key="busy").enqueue(1, 2)  # the other rolled back
    assert TaskRecord.objects.get(pk=taken.id).dedup_key == "busy"


def test_a_duplicate_does_not_wait_for_another_duplicates_open_transaction():
    """A held key is read without a lock: a duplicate enqueue answers at once while
    another session (another duplicate, in a transaction still open) holds the key's row
    locked."""
    first = tasks.add.using(dedup_key="held").enqueue(1, 2)
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(f"SELECT 1 FROM {DEDUP_KEYS} WHERE key = 'held' FOR UPDATE")
        with lock_timeout(2.0):
            began = time.monotonic()
            second = tasks.add.using(dedup_key="held").enqueue(3, 4)
            assert time.monotonic() - began < 1.0
    finally:
        other.close()
    assert second.id == first.id
    assert TaskRecord.objects.count() == 1


def test_a_schedule_whose_key_is_being_taken_stays_due_and_holds_up_no_other(monkeypatch, caplog):
    """The scheduler's session is shared with the heartbeat: a firing waits a second at
    most for a dedup key another transaction is taking, leaves that schedule due (not
    recorded as skipped), fires the others, and fires it once the key is free."""
    from django_tasks_plus.models import ScheduleOccurrence, ScheduleRecord
    from django_tasks_plus.schedules import store
    from django_tasks_plus.schedules.store import fire_due

    resolve = store.task_for

    def keyed(definition):  # type: ignore[no-untyped-def]
        task = resolve(definition)
        return task.using(dedup_key="nightly") if definition.name == "keyed" else task

    monkeypatch.setattr(store, "task_for", keyed)
    settings = _due_schedules("keyed", "free")
    with key_being_taken("nightly"), lock_timeout(10.0):
        began = time.monotonic()
        assert fire_due(settings, timezone.now) == 1
        took = time.monotonic() - began
    assert took < store.FIRE_LOCK_WAIT * 2 + 2
    assert set(
        ScheduleRecord.objects.filter(last_fired_at__isnull=False).values_list("name", flat=True)
    ) == {"free"}
    assert not ScheduleOccurrence.objects.filter(schedule__name="keyed").exists()
    assert any("Schedule %s: not fired" in r.msg for r in caplog.records)
    assert fire_due(settings, timezone.now) == 1  # the key is free: it fires now
    assert TaskRecord.objects.filter(dedup_key="nightly").count() == 1


# -- circuit breakers -----------------------------------------------------------------------

BREAKERS = "django_tasks_plus_breakerrecord"


@contextlib.contextmanager
def circuit_locked(name: str, key: str, **columns: object) -> Iterator[None]:
    """A stored circuit whose row another session's open transaction holds locked."""
    from django_tasks_plus.models import BreakerRecord

    BreakerRecord.objects.create(
        backend_name="default", name=name, key=key, updated_at=timezone.now(), **columns
    )
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(
            f"SELECT 1 FROM {BREAKERS} WHERE name = %s AND key = %s FOR UPDATE", [name, key]
        )
        yield
        other.execute("COMMIT")
    finally:
        other.close()


def _session_lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        return cursor.fetchone()[0]


def test_a_circuit_decision_waits_for_a_locked_row_only_so_long(monkeypatch):
    """The decision (or record) then fails with a lock timeout, which its callers turn
    into a short hold or a failure not counted, and the session's setting is as it was."""
    from django.db import OperationalError, transaction

    from django_tasks_plus.db import breakers

    monkeypatch.setattr(breakers, "CIRCUIT_LOCK_WAIT", 0.3)
    with circuit_locked("local", "locked-host"):
        began = time.monotonic()
        with pytest.raises(OperationalError, match="lock timeout"), transaction.atomic():
            breakers.locked_circuit("default", "default", "local", "locked-host", timezone.now())
        took = time.monotonic() - began
        assert 0.25 <= took < 1.5, took
        with transaction.atomic():  # a free row: locked, and the bound undone after it
            before = _session_lock_timeout()
            breakers.locked_circuit("default", "default", "local", "free-host", timezone.now())
            assert _session_lock_timeout() == before
    assert _session_lock_timeout() == "0"


def test_a_shorter_lock_timeout_of_the_session_is_kept():
    from django.db import transaction

    from django_tasks_plus.db import dialect_for

    dialect = dialect_for(connection)
    with lock_timeout(0.2), transaction.atomic():
        with dialect.lock_wait_bounded(connection, 5.0):
            assert _session_lock_timeout() == "200ms"
        with dialect.lock_wait_bounded(connection, 0.05):
            assert _session_lock_timeout() == "50ms"
        assert _session_lock_timeout() == "200ms"


def test_holding_and_releasing_a_keys_tasks_pass_over_a_locked_task():
    from django_tasks_plus.db.breakers import park_tasks, release_tasks

    now = timezone.now()
    ids = [tasks.add.enqueue(n, n).id for n in range(3)]
    TaskRecord.objects.filter(pk__in=ids).update(breaker_key="local/h")  # as if held by it
    with row_locked(ids[0]), lock_timeout(5.0):
        began = time.monotonic()
        assert park_tasks("default", "default", "local/h", now + timedelta(hours=1), now) == 2
        assert release_tasks("default", "default", "local/h", now) == 2
        assert time.monotonic() - began < 1.0
    assert park_tasks("default", "default", "local/h", now + timedelta(hours=1), now) == 3


def test_a_locked_circuit_row_costs_its_task_a_record_not_the_worker(run_worker):
    """A task fails under a circuit whose row a session keeps locked: recording the
    failure gives up after its wait (logged), the attempt's own outcome is written, and
    the worker goes on. Before, the task thread waited for the lock without end."""
    result = tasks.held_past_ttl.enqueue(0)
    with circuit_locked("ttl", "ttl-host"):
        began = time.monotonic()
        proc = run_worker("--burst", "--concurrency", "1", timeout=60)
        took = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert took < 30, took
    log = proc.stdout + proc.stderr
    assert "Circuit breaker ttl/ttl-host: could not record the failure of task" in log
    assert "lock timeout" in log
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.attempt) == ("FAILED", 1)


def test_a_change_to_a_locked_schedule_gives_up_and_changes_nothing():
    """Pause, resume, run now, update and delete wait for a schedule row another session
    keeps locked only so long, then raise ``ScheduleLocked`` (a ``ScheduleError``, which
    the admin's actions and ``manage.py schedules`` report)."""
    from django_tasks_plus.models import ScheduleRecord
    from django_tasks_plus.schedules import Every, ScheduleError, ScheduleLocked, api

    api.create("nightly", "tests.tasks.add", Every(hours=1), args=[1, 2])
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(
            f"SELECT 1 FROM {ScheduleRecord._meta.db_table} WHERE name = 'nightly' FOR UPDATE"
        )
        for change in (api.pause, api.run_now, api.delete):
            began = time.monotonic()
            with pytest.raises(ScheduleLocked, match="another database session holds its row"):
                change("nightly", lock_wait=0.3)
            assert 0.25 <= time.monotonic() - began < 1.5
        other.execute("COMMIT")
    finally:
        other.close()
    assert issubclass(ScheduleLocked, ScheduleError) and ScheduleLocked.retryable
    row = ScheduleRecord.objects.get(name="nightly")
    assert not row.paused and row.last_task_id is None
    assert _session_lock_timeout() == "0"
    api.pause("nightly")  # the lock is gone
    assert ScheduleRecord.objects.get(name="nightly").paused


def test_a_sync_that_meets_a_locked_schedule_does_not_hold_up_firing(caplog):
    """The leader syncs the declared schedules before it fires. A declared schedule's row
    another session keeps locked fails the sync after a second (tried again next tick);
    the due schedules fire in the same tick all the same."""
    from django.test import override_settings

    from django_tasks_plus.models import ScheduleRecord
    from django_tasks_plus.schedules import Every, api
    from django_tasks_plus.schedules.service import Scheduler
    from tests.test_schedules import _tasks, settings_of

    entry = {"task": "tests.tasks.add", "every": 60, "args": [1, 2]}
    api.create("free", "tests.tasks.add", Every(hours=1), args=[3, 4])
    ScheduleRecord.objects.filter(name="free").update(next_at=timezone.now() - timedelta(seconds=1))
    with override_settings(TASKS=_tasks(SCHEDULES={"declared": entry})):
        scheduler = Scheduler(settings_of(), clock=timezone.now, bound_seconds=30)
        scheduler.tick()  # creates the declared row
        assert scheduler.synced
    with override_settings(TASKS=_tasks(SCHEDULES={"declared": {**entry, "every": 120}})):
        scheduler = Scheduler(settings_of(), clock=timezone.now, bound_seconds=30)
        other = _other_session()
        try:
            other.execute("BEGIN")
            other.execute(
                f"SELECT 1 FROM {ScheduleRecord._meta.db_table} WHERE name = 'declared' FOR UPDATE"
            )
            began = time.monotonic()
            scheduler.tick()
            assert time.monotonic() - began < 3.0
            assert not scheduler.synced
            assert ScheduleRecord.objects.get(name="free").last_fired_at is not None
            assert "Scheduler: schedules not synced (canceling statement due to lock" in (
                caplog.text
            )
            other.execute("COMMIT")
        finally:
            other.close()
        scheduler.tick()
        assert scheduler.synced
        assert ScheduleRecord.objects.get(name="declared").every_seconds == 120


# -- the leader's pruner ------------------------------------------------------------------
# It shares the worker's periodic session with the lease renewal, so none of its deletes
# may wait for a row another session holds.


def test_pruning_dedup_keys_passes_over_a_key_another_session_holds():
    """An enqueue taking a lapsed key over, in a transaction still open, keeps its row
    locked; the pruner deletes the other lapsed keys and leaves that one."""
    from django_tasks_plus.db.dedup import prune_keys
    from django_tasks_plus.models import DedupKey

    past = timezone.now() - timedelta(hours=1)
    keys = [
        DedupKey.objects.create(
            backend_name="default", key=f"k{n}", expires_at=past, created_at=past
        )
        for n in range(3)
    ]
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(
            f"SELECT 1 FROM {DedupKey._meta.db_table} WHERE id = %s FOR UPDATE", [keys[0].pk]
        )
        with lock_timeout(5.0):
            began = time.monotonic()
            assert prune_keys("default", "default", timezone.now()) == 2
            assert time.monotonic() - began < 1.0
        other.execute("COMMIT")
    finally:
        other.close()
    assert list(DedupKey.objects.values_list("key", flat=True)) == ["k0"]
    assert prune_keys("default", "default", timezone.now()) == 1


def test_pruning_idle_breakers_passes_over_a_locked_row():
    from django_tasks_plus.db.retention import delete_idle_breakers
    from django_tasks_plus.models import BreakerRecord

    past = timezone.now() - timedelta(days=30)
    for key in ("locked-host", "idle-host"):
        BreakerRecord.objects.create(backend_name="default", name="local", key=key, updated_at=past)
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(f"SELECT 1 FROM {BREAKERS} WHERE key = 'locked-host' FOR UPDATE")
        with lock_timeout(5.0):
            began = time.monotonic()
            assert delete_idle_breakers("default", "default", timezone.now(), 100) == 1
            assert time.monotonic() - began < 1.0
        other.execute("COMMIT")
    finally:
        other.close()
    assert list(BreakerRecord.objects.values_list("key", flat=True)) == ["locked-host"]
