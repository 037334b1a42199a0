"""An operator's change to a task whose row another session holds locked.

Cancel, redrive, run now, discard and delete change one row each. Task code, a script or
a ``psql`` session can keep that row locked for as long as its transaction stays open;
the change then waits a bounded time and raises ``TaskRowLocked`` having changed
nothing, and the admin's bulk actions and the commands bound their waiting for a whole
selection, report the locked rows and act on every other one. PostgreSQL only: SQLite
locks the whole database, never one row (it waits by its busy timeout, as before).
"""

from __future__ import annotations

import threading
import time
import uuid
from functools import partial

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus import TaskRowLocked, operations
from django_tasks_plus.admin import actions
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db.rowlock import LockPatience
from django_tasks_plus.management import selecting
from django_tasks_plus.models import TaskRecord
from tests import tasks
from tests.conftest import admin_client_for, claim_one, postgres_only
from tests.test_locked_rows import _other_session, row_locked

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

TABLE = TaskRecord._meta.db_table
CHANGELIST = "admin:django_tasks_plus_taskrecord_changelist"


def _dead(queue: str = "default") -> str:
    """A dead-lettered task, as a worker leaves one."""
    now = timezone.now()
    return str(
        TaskRecord.objects.create(
            task_path="tests.tasks.add",
            args=[1, 2],
            queue_name=queue,
            status=TaskResultStatus.FAILED,
            attempt=3,
            run_after=now,
            enqueued_at=now,
            finished_at=now - timezone.timedelta(days=1),
            dead_letter_reason="gave up after 3 attempt(s)",
        ).pk
    )


def _status(task_id: str) -> str:
    return TaskRecord.objects.get(pk=task_id).status


def _waiting() -> str:
    return tasks.add.using(run_after=timezone.now() + timezone.timedelta(hours=1)).enqueue(1, 1).id


def _running() -> str:
    tasks.add.enqueue(1, 1)
    return claim_one().id


# What each change needs to find, and the state it must leave a locked row in.
CHANGES = {
    "cancel a waiting task": (lambda: tasks.add.enqueue(1, 1).id, operations.cancel, "READY"),
    "cancel a running task": (_running, operations.cancel, "RUNNING"),
    "redrive": (_dead, operations.redrive, "FAILED"),
    "run now": (_waiting, operations.run_now, "READY"),
    "delete": (_dead, operations.delete, "FAILED"),
    "discard": (_dead, operations.discard, "FAILED"),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_each_change_gives_up_on_a_locked_row_and_changes_nothing(name):
    make, change, status = CHANGES[name]
    task_id = make()
    if change is operations.discard:
        TaskRecord.objects.filter(pk=task_id).update(ordering_blocked=True)
    before = TaskRecord.objects.filter(pk=task_id).values().get()
    with row_locked(task_id):
        began = time.monotonic()
        with pytest.raises(TaskRowLocked) as caught:
            change(task_id, lock_wait=0.3)
        took = time.monotonic() - began
    assert 0.2 <= took < 1.5, took
    assert caught.value.task_id == task_id and caught.value.retryable
    assert "another database session holds its row locked" in str(caught.value)
    assert TaskRecord.objects.filter(pk=task_id).values().get() == before
    assert _status(task_id) == status


def test_a_change_waits_out_a_lock_that_ends_within_its_wait():
    task_id = _dead()
    other = _other_session()
    other.execute("BEGIN")
    other.execute(f"SELECT 1 FROM {TABLE} WHERE id = %s FOR UPDATE", [uuid.UUID(task_id)])
    release = threading.Timer(0.4, lambda: other.execute("COMMIT"))
    release.start()
    try:
        began = time.monotonic()
        assert operations.redrive(task_id, lock_wait=5.0) is True
        took = time.monotonic() - began
    finally:
        release.join()
        other.close()
    assert 0.35 <= took < 2.0, took
    assert _status(task_id) == "READY"


def test_a_refused_lock_leaves_the_callers_transaction_usable():
    """Inside app code's own transaction the lock is tried in a savepoint: after
    ``TaskRowLocked`` the transaction goes on, and its other writes commit."""
    locked, free = _dead(), _dead()
    with row_locked(locked), transaction.atomic():
        with pytest.raises(TaskRowLocked):
            operations.redrive(locked, lock_wait=0)
        assert operations.redrive(free) is True
    assert (_status(locked), _status(free)) == ("FAILED", "READY")


def test_the_lock_is_held_until_the_callers_transaction_commits():
    """A redrive inside app code's transaction keeps the row locked until that commits,
    as the UPDATE's own lock would, so another operator's change waits for it."""
    task_id = _dead()
    with transaction.atomic():
        assert operations.redrive(task_id) is True
        other = _other_session()
        try:
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(
                    f"SELECT 1 FROM {TABLE} WHERE id = %s FOR UPDATE NOWAIT", [uuid.UUID(task_id)]
                )
        finally:
            other.close()
    assert _status(task_id) == "READY"


def test_patience_gives_each_row_its_wait_until_the_total_is_spent():
    patience = LockPatience(per_row=5.0, total=8.0)
    assert patience.wait() == 5.0
    patience.gave_up(5.01)
    assert patience.wait() == pytest.approx(2.99)
    patience.gave_up(3.0)
    assert patience.wait() == 0.0  # one try each from now on


# -- the admin and the commands, on a selection with locked rows ------------------------


@pytest.fixture
def held_rows():
    """Two dead tasks locked by one other session's open transaction, and three free
    ones; yields (locked ids, free ids) and commits the other session at the end."""
    locked = [_dead("mail") for _ in range(2)]
    free = [_dead("mail") for _ in range(3)]
    other = _other_session()
    other.execute("BEGIN")
    other.execute(
        f"SELECT 1 FROM {TABLE} WHERE id = ANY(%s) FOR UPDATE", [[uuid.UUID(i) for i in locked]]
    )
    try:
        yield locked, free
    finally:
        other.execute("COMMIT")
        other.close()


SHORT_PATIENCE = partial(LockPatience, per_row=0.3, total=0.4)


def test_an_admin_bulk_action_acts_on_the_free_rows_and_names_the_locked(
    held_rows, django_user_model, monkeypatch
):
    locked, free = held_rows
    monkeypatch.setattr(actions, "LockPatience", SHORT_PATIENCE)
    client = admin_client_for("superuser", django_user_model, view=(), actions=())
    began = time.monotonic()
    response = client.post(
        reverse(CHANGELIST),
        {"action": "redrive_tasks", "_selected_action": [*locked, *free], "index": 0},
        follow=True,
    )
    took = time.monotonic() - began
    text = response.content.decode()
    assert took < 3.0, took  # 0.3 s for the first locked row, 0.1 s for the second
    assert "3 tasks redriven." in text
    assert "2 tasks were left unchanged: another database session held their rows locked" in text
    for task_id in locked:  # each linked to its page
        assert f'href="/admin/django_tasks_plus/taskrecord/{task_id}/change/"' in text
        assert _status(task_id) == "FAILED"
    assert [_status(task_id) for task_id in free] == ["READY"] * 3


def test_a_command_acts_on_the_free_rows_and_fails_naming_the_locked(held_rows, monkeypatch):
    locked, free = held_rows
    monkeypatch.setattr(selecting, "LockPatience", SHORT_PATIENCE)
    began = time.monotonic()
    with pytest.raises(CommandError) as caught:
        call_command("redrivetasks", "--queue", "mail", "--yes")
    took = time.monotonic() - began
    message = str(caught.value)
    assert took < 3.0, took
    assert message.startswith("Redriven 3 tasks."), message
    assert "Left 2 tasks unchanged: another database session held their rows locked" in message
    assert all(task_id in message for task_id in locked)
    assert [_status(task_id) for task_id in locked] == ["FAILED"] * 2
    assert [_status(task_id) for task_id in free] == ["READY"] * 3


def test_prunetasks_passes_over_locked_rows_and_names_them(held_rows):
    locked, _free = held_rows
    began = time.monotonic()
    with pytest.raises(CommandError) as caught:
        call_command("prunetasks", "--queue", "mail", "--finished-before", "1h", "--yes")
    took = time.monotonic() - began
    message = str(caught.value)
    assert took < 3.0, took  # passed over, not waited for
    assert message.startswith("Deleted 3 tasks (3 FAILED)"), message
    assert "Left 2 tasks unchanged: another database session held their rows locked" in message
    assert set(TaskRecord.objects.values_list("pk", flat=True)) == {uuid.UUID(i) for i in locked}
    assert not connection.in_atomic_block


# -- schedules and circuits -------------------------------------------------------------------


@pytest.fixture
def other_session_locks():  # type: ignore[no-untyped-def]
    """Lock rows from another session's open transaction: call with a table and a
    WHERE clause; everything is committed and closed at the end."""
    other = _other_session()
    other.execute("BEGIN")

    def lock(table: str, where: str, params: list[object]) -> None:
        other.execute(f"SELECT 1 FROM {table} WHERE {where} FOR UPDATE", params)

    try:
        yield lock
    finally:
        other.execute("COMMIT")
        other.close()


def test_forcing_a_locked_circuit_says_so_and_changes_nothing(other_session_locks):
    from django_tasks_plus import CircuitLocked, circuits
    from django_tasks_plus.models import BreakerRecord

    BreakerRecord.objects.create(
        backend_name="default", name="http", key="api.example.com", state="open",
        updated_at=timezone.now(),
    )  # fmt: skip
    other_session_locks(BreakerRecord._meta.db_table, "key = %s", ["api.example.com"])
    for force in (circuits.force_close, circuits.force_open):
        began = time.monotonic()
        with pytest.raises(CircuitLocked) as info:
            force("api.example.com", name="http", lock_wait=0.3)
        assert time.monotonic() - began < 2.0
        assert info.value.retryable and info.value.waited == 0.3
        assert str(info.value).startswith(
            "Circuit 'http/api.example.com' of backend 'default': another database session "
            "holds its row locked"
        )
    assert BreakerRecord.objects.get().state == "open"


@pytest.mark.parametrize("page", ("schedules", "circuits"))
def test_a_bulk_action_on_locked_schedules_or_circuits_costs_seconds_in_all(
    page, other_session_locks, django_user_model, monkeypatch
):
    """Four selected rows another session keeps locked: each may wait within one
    ``LockPatience`` for the whole action (not 5 s each), each is named in an error
    message, and nothing is changed."""
    from django_tasks_plus.admin import breakers as breaker_admin
    from django_tasks_plus.admin import schedules as schedule_admin
    from django_tasks_plus.models import BreakerRecord, ScheduleRecord
    from django_tasks_plus.schedules import Every, api

    if page == "schedules":
        rows = [api.create(f"s{n}", "tests.tasks.add", Every(hours=1)) for n in range(4)]
        model, action, admin_module = ScheduleRecord, "pause", schedule_admin
    else:
        rows = [
            BreakerRecord.objects.create(
                backend_name="default",
                name="http",
                key=f"h{n}.example.com",
                state="open",
                updated_at=timezone.now(),
            )
            for n in range(4)
        ]
        model, action, admin_module = BreakerRecord, "force_close", breaker_admin
    other_session_locks(model._meta.db_table, "id = ANY(%s)", [[row.pk for row in rows]])
    monkeypatch.setattr(admin_module, "LockPatience", SHORT_PATIENCE)
    client = admin_client_for("superuser", django_user_model, view=(), actions=())
    began = time.monotonic()
    response = client.post(
        reverse(f"admin:django_tasks_plus_{model._meta.model_name}_changelist"),
        {"action": action, "_selected_action": [row.pk for row in rows], "index": 0},
        follow=True,
    )
    took = time.monotonic() - began
    text = response.content.decode()
    assert took < 3.0, took  # 0.3 s, 0.1 s, then one try each
    assert text.count("holds its row locked") == 4
    if page == "schedules":
        assert not ScheduleRecord.objects.filter(paused=True).exists()
    else:
        assert set(BreakerRecord.objects.values_list("state", flat=True)) == {"open"}
