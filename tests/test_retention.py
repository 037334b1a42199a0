"""Retention: ``manage.py prunetasks``, the leader's pruner and ``OPTIONS["RETENTION"]``.

Rows are real rows of the test database (SQLite by default, PostgreSQL with
``DATABASE_URL``); the service is also run inside a real leader worker.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_tasks_plus.compat import task_backends
from django_tasks_plus.conf import RetentionSettings, parse_settings
from django_tasks_plus.db.leadership import current_leader
from django_tasks_plus.db.retention import delete_finished, delete_idle_breakers
from django_tasks_plus.exceptions import InvalidBackendOptions
from django_tasks_plus.models import (
    BreakerRecord,
    DedupKey,
    ScheduleOccurrence,
    ScheduleRecord,
    TaskRecord,
    WorkerRecord,
)
from django_tasks_plus.worker.pruner import Pruner, Sweep, sweeps_for
from tests import tasks
from tests.conftest import wait_for, worker_row

pytestmark = pytest.mark.django_db(transaction=True)

SUCCESSFUL, FAILED, READY = "SUCCESSFUL", "FAILED", "READY"


def _task(status: str, age: timedelta | None, **fields: object) -> str:
    """A task row of ``status`` that finished ``age`` ago (None: not finished)."""
    now = timezone.now()
    row = TaskRecord.objects.create(
        task_path="tests.tasks.add",
        status=status,
        run_after=now,
        enqueued_at=now - (age or timedelta(0)) - timedelta(seconds=1),
        finished_at=None if age is None else now - age,
        **fields,
    )
    return str(row.pk)


def _ids() -> set[str]:
    return {str(pk) for pk in TaskRecord.objects.values_list("pk", flat=True)}


def command(*args: str, **options: object) -> str:
    out = StringIO()
    call_command("prunetasks", *args, stdout=out, **options)
    return out.getvalue()


def _pruner(**retention: object) -> Pruner:
    settings = parse_settings("default", {"OPTIONS": {"RETENTION": retention}})
    return Pruner(settings, clock=timezone.now, bound_seconds=30)


def _sweep(pruner: Pruner) -> None:
    pruner.sweep(budget=60)
    connection.close()  # the pruner bounded this session's statements as a worker's


# -- the setting ---------------------------------------------------------------------------


def test_retention_defaults_and_overrides():
    assert parse_settings("a", {}).retention == RetentionSettings()
    assert RetentionSettings().by_status() == {
        SUCCESSFUL: timedelta(days=7),
        FAILED: timedelta(days=30),
    }
    settings = parse_settings(
        "a", {"OPTIONS": {"RETENTION": {"SUCCESSFUL": 60, "FAILED": None, "BATCH_SIZE": 10}}}
    )
    assert settings.retention.by_status() == {SUCCESSFUL: timedelta(seconds=60)}
    assert settings.retention.batch_size == 10
    assert settings.retention.breakers == timedelta(days=7)  # untouched keys keep defaults


@pytest.mark.parametrize(
    ("retention", "message"),
    [
        ({"READY": 60}, "READY tasks have not finished and are never pruned"),
        ({"running": 60}, "RUNNING tasks have not finished and are never pruned"),
        ({"SUCCESFUL": 60}, "unknown key 'SUCCESFUL'. Did you mean 'SUCCESSFUL'?"),
        ({"FAILED": "7d"}, "['FAILED'] must be a duration (a timedelta or a number of"),
        ({"FAILED": -1}, "['FAILED'] must be a duration"),
        ({"BATCH_SIZE": 0}, "['BATCH_SIZE'] must be a whole number of at least 1"),
        ({"INTERVAL": "soon"}, "['INTERVAL'] must be a positive number of seconds"),
        ([], "['RETENTION'] must be a dict"),
    ],
)
def test_bad_retention_settings_are_refused(retention: object, message: str):
    with pytest.raises(InvalidBackendOptions) as refused:
        parse_settings("a", {"OPTIONS": {"RETENTION": retention}})
    assert message in str(refused.value)


# -- the batched delete --------------------------------------------------------------------


def test_a_batch_deletes_at_most_its_limit_of_one_status_past_the_age():
    old = [_task(SUCCESSFUL, timedelta(days=10)) for _ in range(5)]
    recent = _task(SUCCESSFUL, timedelta(days=1))
    failed = _task(FAILED, timedelta(days=10))
    ready = _task(READY, None)
    other = _task(SUCCESSFUL, timedelta(days=10), backend_name="other")
    before = timezone.now() - timedelta(days=7)

    assert delete_finished("default", "default", SUCCESSFUL, before, 2) == 2
    assert len(_ids() & set(old)) == 3
    assert delete_finished("default", "default", SUCCESSFUL, before, 10) == 3
    assert delete_finished("default", "default", SUCCESSFUL, before, 10) == 0
    assert _ids() == {recent, failed, ready, other}
    with pytest.raises(ValueError, match="Only finished tasks are pruned"):
        delete_finished("default", "default", READY, before, 10)


def test_a_failed_task_blocking_its_ordering_key_is_kept():
    blocking = _task(FAILED, timedelta(days=60), ordering_key="k", ordering_blocked=True)
    plain = _task(FAILED, timedelta(days=60), ordering_key="k2")
    assert delete_finished("default", "default", FAILED, timezone.now(), 10) == 1
    assert _ids() == {blocking}
    assert plain not in _ids()


# -- manage.py prunetasks ------------------------------------------------------------------


def test_prunetasks_selects_like_the_other_commands_and_deletes_in_batches():
    old = [_task(SUCCESSFUL, timedelta(days=10)) for _ in range(5)]
    recent = _task(SUCCESSFUL, timedelta(hours=1))
    failed = _task(FAILED, timedelta(days=10))
    other_queue = _task(SUCCESSFUL, timedelta(days=10), queue_name="other")
    ready = _task(READY, None)

    shown = command("--finished-before", "7d", "--status", "successful", "--dry-run")
    assert shown.startswith("Would prune 6 tasks (dry run: nothing changed).")
    assert old[0] in shown
    assert len(_ids()) == 9

    with CaptureQueriesContext(connection) as queries:
        out = command(
            "--finished-before", "7d", "--status", "SUCCESSFUL", "--queue", "default",
            "--batch-size", "2", "--yes",
        )  # fmt: skip
    assert out.strip() == "Deleted 5 tasks (5 SUCCESSFUL) in 3 batches."
    deletes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("DELETE")]
    assert len(deletes) == 3  # 2 + 2 + 1: no statement took more than --batch-size
    assert _ids() == {recent, failed, other_queue, ready}


def test_prunetasks_refuses_unfinished_statuses_and_skips_named_unfinished_tasks():
    ready = _task(READY, None)
    done = _task(SUCCESSFUL, timedelta(days=1))
    with pytest.raises(CommandError, match="READY tasks have not finished and are never pruned"):
        command("--status", "ready", "--all")
    with pytest.raises(CommandError, match="RUNNING tasks have not finished"):
        command("--status", "Running", "--queue", "default")
    with pytest.raises(CommandError, match="--batch-size must be a whole number"):
        command("--all", "--batch-size", "0")
    with pytest.raises(CommandError, match=r"Which tasks\?"):
        command()
    # Named by id, an unfinished task is looked at and skipped, with why.
    with pytest.raises(CommandError) as refused:
        command(ready[:8])
    assert f"Deleted 0 tasks in 1 batch. Skipped 1 not deleted: {ready} (READY)." in str(
        refused.value
    )
    out = command(ready, done)
    assert out.startswith("Deleted 1 task (1 SUCCESSFUL) in 1 batch. Skipped 1 not deleted")
    assert _ids() == {ready}


def test_prunetasks_keeps_a_task_blocking_its_ordering_key(run_worker):
    """Dead letters from a real worker; one of them blocks its ordering key."""
    blocked = tasks.dies_and_blocks.using(ordering_key="acct:1").enqueue(1).id
    loose = tasks.always_fails.enqueue("no").id
    done = run_worker("--burst", "--queue", "*", "-v", "0")
    assert done.returncode == 0, done.stderr
    statuses = dict(TaskRecord.objects.values_list("pk", "ordering_blocked"))
    assert statuses[uuid.UUID(blocked)] is True
    out = command("--status", "failed", "--queue", "default", "--yes")
    assert out.startswith("Deleted 1 task (1 FAILED) in 1 batch. Skipped 1 not deleted:")
    assert f"{blocked} (blocks its ordering key)" in out
    assert _ids() == {blocked}
    assert loose not in _ids()


# -- the pruner ----------------------------------------------------------------------------


def test_the_pruner_sweeps_each_kind_of_spent_row():
    now = timezone.now()
    old_ok = _task(SUCCESSFUL, timedelta(days=8))
    young_ok = _task(SUCCESSFUL, timedelta(days=6))
    old_failed = _task(FAILED, timedelta(days=31))
    young_failed = _task(FAILED, timedelta(days=8))
    ready = _task(READY, None)
    # Dedup keys: one lapsed (its window passed), one still held.
    lapsed = tasks.add.using(dedup_key="lapsed", dedup_ttl=1).enqueue(1, 1)
    held = tasks.add.using(dedup_key="held", dedup_ttl=3600).enqueue(1, 1)
    DedupKey.objects.filter(key="lapsed").update(expires_at=now - timedelta(seconds=1))
    # Breakers: only a closed, failure-free, idle row holding no task goes.
    idle = _breaker("idle", updated=now - timedelta(days=8))
    _breaker("recent", updated=now - timedelta(days=1))
    _breaker("open", updated=now - timedelta(days=8), state="open", opened_at=now)
    _breaker("failing", updated=now - timedelta(days=8), failures=f'["{now.isoformat()}"]')
    _breaker("holding", updated=now - timedelta(days=8))
    _task(READY, None, breaker_key="api/holding")
    # Schedule occurrences: the old ones go, except each schedule's latest.
    schedule = ScheduleRecord.objects.create(
        backend_name="default", name="nightly", task_path="tests.tasks.add", every_seconds=86400
    )
    for days in (90, 60, 40):
        ScheduleOccurrence.objects.create(schedule=schedule, at=now - timedelta(days=days))
    quiet = ScheduleRecord.objects.create(
        backend_name="default", name="quiet", task_path="tests.tasks.add", every_seconds=86400
    )
    ScheduleOccurrence.objects.create(schedule=quiet, at=now - timedelta(days=400))
    # Recorded at their time (a catch-up records old occurrences now: those stay).
    ScheduleOccurrence.objects.update(created_at=F("at"))
    caught_up = ScheduleOccurrence.objects.create(schedule=quiet, at=now - timedelta(days=300))

    pruner = _pruner(BATCH_SIZE=2)
    _sweep(pruner)

    left = _ids()
    assert {old_ok, old_failed} & left == set()
    assert {young_ok, young_failed, ready, lapsed.id, held.id} <= left
    assert set(DedupKey.objects.values_list("key", flat=True)) == {"held"}
    assert set(BreakerRecord.objects.values_list("key", flat=True)) == {
        "recent", "open", "failing", "holding",
    }  # fmt: skip
    assert idle.key == "idle"
    kept = ScheduleOccurrence.objects.order_by("at").values_list("schedule__name", "at")
    assert [name for name, _ in kept] == ["quiet", "nightly"]
    assert kept.filter(pk=caught_up.pk).exists()
    assert pruner.deleted["SUCCESSFUL tasks"] == 1
    assert pruner.deleted["breaker rows"] == 1


def _breaker(key: str, *, updated: datetime, **fields: object) -> BreakerRecord:
    return BreakerRecord.objects.create(
        backend_name="default", name="api", key=key, updated_at=updated, **fields
    )


def test_idle_breakers_go_a_batch_at_a_time():
    old = timezone.now() - timedelta(days=30)
    for n in range(5):
        _breaker(f"k{n}", updated=old)
    before = timezone.now() - timedelta(days=7)
    assert delete_idle_breakers("default", "default", before, 2) == 2
    assert delete_idle_breakers("default", "default", before, 10) == 3
    assert BreakerRecord.objects.count() == 0


def test_retention_none_keeps_those_rows_for_ever():
    kept = _task(FAILED, timedelta(days=3000))
    _breaker("idle", updated=timezone.now() - timedelta(days=3000))
    pruner = _pruner(FAILED=None, BREAKERS=None)
    assert [sweep.name for sweep in pruner.sweeps][:2] == ["SUCCESSFUL tasks", "dedup keys"]
    _sweep(pruner)
    assert _ids() == {kept}
    assert BreakerRecord.objects.count() == 1


def test_a_failing_sweep_never_stops_the_others_or_the_service(caplog):
    """A sweep that raises is logged and skipped for the round; a database error ends
    the round (the connection is dropped) and the next round sweeps again."""
    settings = task_backends["default"].settings
    old = _task(SUCCESSFUL, timedelta(days=8))
    calls: list[str] = []

    def broken(now: datetime, limit: int) -> int:
        calls.append("broken")
        raise RuntimeError("a row the sweep cannot handle")

    def lost(now: datetime, limit: int) -> int:
        calls.append("lost")
        if calls.count("lost") == 1:
            raise DatabaseError("server closed the connection unexpectedly")
        return 0

    sweeps = [Sweep("broken", broken), Sweep("lost", lost), *sweeps_for(settings)]
    pruner = Pruner(settings, clock=timezone.now, bound_seconds=30, sweeps=sweeps)
    with caplog.at_level(logging.WARNING, logger="django_tasks_plus.worker"):
        _sweep(pruner)
        assert old in _ids()  # the round ended at the lost connection
        _sweep(pruner)
    assert calls == ["broken", "lost", "broken", "lost"]
    assert old not in _ids()
    assert "Pruning broken failed unexpectedly" in caplog.text
    assert "Pruning lost failed (server closed the connection unexpectedly)" in caplog.text


def test_a_sweep_resumes_where_the_round_s_time_ran_out():
    for _ in range(6):
        _task(SUCCESSFUL, timedelta(days=8))
    pruner = _pruner(BATCH_SIZE=2)
    pruner.sweep(budget=0)  # one batch, then no time left
    connection.close()
    assert TaskRecord.objects.count() == 4
    assert pruner._next_sweep == 0.0  # unfinished: swept again next round
    _sweep(pruner)
    assert TaskRecord.objects.count() == 0
    assert pruner._next_sweep > 0


def test_the_leader_worker_prunes_on_its_own(start_worker):
    """A real worker becomes leader and its pruner forgets dead workers and deletes
    finished tasks past retention at once; a follower runs no pruner."""
    old = [_task(SUCCESSFUL, timedelta(days=8)) for _ in range(3)]
    old_failed = _task(FAILED, timedelta(days=31))
    young = _task(SUCCESSFUL, timedelta(hours=1))
    worker_row("long-dead", silent_for=timedelta(days=1), hostname="gone")
    start_worker("--worker-id", "pruning-leader", "--visibility-timeout", "3", "--queue", "other")
    wait_for(lambda: current_leader("default", "default") == "pruning-leader", timeout=60)
    wait_for(lambda: not TaskRecord.objects.filter(pk__in=[*old, old_failed]).exists())
    wait_for(lambda: not WorkerRecord.objects.filter(worker_id="long-dead").exists())
    assert young in _ids()
