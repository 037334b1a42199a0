"""Delivery semantics: dedup keys, ordering keys, schemas, bulk enqueue, limits, cancel."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import uuid
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_tasks_plus import (
    InvalidTaskArguments,
    InvalidTaskOptions,
    PayloadTooLarge,
    QueueFull,
    TaskResultStatus,
    cancel,
    discard,
    enqueue_many,
    redrive,
)
from django_tasks_plus.compat import task_enqueued
from django_tasks_plus.models import DedupKey, TaskRecord
from tests import tasks
from tests.conftest import assert_index_migration_runs_concurrently, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_tasks_plus.backend.DatabaseBackend"


def _rows() -> int:
    return TaskRecord.objects.count()


@pytest.fixture
def enqueued_ids():
    seen: list[str] = []

    def receiver(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(task_result.id)

    task_enqueued.connect(receiver, weak=False, dispatch_uid="test-delivery-enqueued")
    yield seen
    task_enqueued.disconnect(dispatch_uid="test-delivery-enqueued")


def _tasks_setting(**options):  # type: ignore[no-untyped-def]
    return {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "emails", "slow", "other"],
            "OPTIONS": options,
        }
    }


# -- dedup keys --------------------------------------------------------------------------


def test_duplicate_enqueue_returns_the_existing_task(enqueued_ids):
    first = tasks.add.using(dedup_key="digest:42").enqueue(1, 2)
    second = tasks.add.using(dedup_key="digest:42").enqueue(3, 4)
    assert second.id == first.id
    assert second.args == [1, 2]  # the existing task, not the new call
    assert _rows() == 1
    assert enqueued_ids == [first.id]  # no task_enqueued for the skipped call
    assert TaskRecord.objects.get(pk=first.id).dedup_key == "digest:42"


def test_dedup_key_can_be_taken_again_after_expiry():
    first = tasks.add.using(dedup_key="k", dedup_ttl=60).enqueue(1, 1)
    DedupKey.objects.filter(key="k").update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    second = tasks.add.using(dedup_key="k").enqueue(2, 2)
    assert second.id != first.id
    assert _rows() == 2
    key = DedupKey.objects.get(key="k")
    assert key.task_ids == [second.id]
    assert key.expires_at > timezone.now() + dt.timedelta(minutes=59)  # default TTL: 1 h


def test_key_whose_tasks_were_deleted_is_free_again():
    first = tasks.add.using(dedup_key="pruned").enqueue(1, 1)
    TaskRecord.objects.filter(pk=first.id).delete()
    second = tasks.add.using(dedup_key="pruned").enqueue(2, 2)
    assert second.id != first.id
    assert TaskRecord.objects.filter(pk=second.id).exists()


def test_rolled_back_enqueue_releases_the_key():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.using(dedup_key="rollback").enqueue(1, 1)
        raise RuntimeError
    again = tasks.add.using(dedup_key="rollback").enqueue(2, 2)
    assert TaskRecord.objects.get().pk == uuid.UUID(again.id)


def test_dedup_until_finished_releases_when_the_task_finishes(run_worker):
    first = tasks.add.using(dedup_key="pending", dedup_until="finished", dedup_ttl=3600).enqueue(
        1, 1
    )
    assert tasks.add.using(dedup_key="pending", dedup_until="finished").enqueue(5, 5).id == first.id
    assert run_worker("--burst").returncode == 0
    second = tasks.add.using(dedup_key="pending", dedup_until="finished").enqueue(2, 2)
    assert second.id != first.id


def test_sixteen_threads_racing_for_one_key_make_one_task():
    barrier = threading.Barrier(16)
    ids: list[str] = []
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            barrier.wait()
            ids.append(tasks.add.using(dedup_key="race").enqueue(1, 1).id)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(ids) == 16
    assert len(set(ids)) == 1
    assert _rows() == 1


@pytest.mark.postgres
def test_processes_racing_for_the_same_keys_make_one_task_per_key(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    import subprocess
    import sys

    from tests.conftest import REPO, worker_env

    env = worker_env(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.enqueue_keys", "--keys", "100", "--seed", str(seed)],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(4)
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    assert _rows() == 100
    assert TaskRecord.objects.values("dedup_key").distinct().count() == 100
    assert DedupKey.objects.filter(key__startswith="multi:").count() == 100


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dedup_key": ""}, "dedup_key must be a non-empty string"),
        ({"dedup_key": "x" * 256}, "at most 255 characters"),
        ({"ordering_key": "  "}, "ordering_key must be a non-empty string"),
        ({"ordering_key": "y" * 300}, r"at most 255 characters, got 'yyy.*\(300 characters\)"),
        ({"ordering_key": 10**80}, r"must be a non-empty string.*\(int\)"),
        ({"dedup_ttl": -5}, "dedup_ttl must be a positive timedelta"),
        ({"dedup_until": "forever"}, "dedup_until must be 'ttl' or 'finished'"),
    ],
)
def test_bad_keys_are_refused(options, message):
    with pytest.raises(InvalidTaskOptions, match=message):
        tasks.add.using(**options).enqueue(1, 1)
    assert _rows() == 0


# -- ordering keys -----------------------------------------------------------------------


def _by_sequence(key: str) -> list[TaskRecord]:
    return list(TaskRecord.objects.filter(ordering_key=key).order_by("sequence"))


@pytest.fixture
def steps():
    """The table where ``tasks.step`` logs when each body ran (wall clock, one host)."""
    real = "double precision" if connection.vendor == "postgresql" else "real"
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {tasks.STEPS_TABLE} (key varchar(100), n integer, "
            f"started {real}, finished {real})"
        )
    yield tasks.STEPS_TABLE
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {tasks.STEPS_TABLE}")


def _assert_one_at_a_time_in_order(key: str, expected: int) -> None:
    rows = _by_sequence(key)
    assert all(row.status == TaskResultStatus.SUCCESSFUL for row in rows)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT n, started, finished FROM {tasks.STEPS_TABLE} WHERE key = %s ORDER BY n",
            [key],
        )
        bodies = cursor.fetchall()
    assert [n for n, _, _ in bodies] == list(range(expected))  # each ran exactly once
    for (_, _, finished), (n, started, _) in itertools.pairwise(bodies):
        assert finished <= started, f"{key}: task {n} started before task {n - 1} finished"


def test_ordering_key_runs_one_at_a_time_in_order(run_worker, steps):
    for n in range(15):
        tasks.step.using(ordering_key="user:1").enqueue("user:1", n)
        tasks.step.using(ordering_key="user:2").enqueue("user:2", n)
    proc = run_worker("--burst", "--concurrency", "8")
    assert proc.returncode == 0, proc.stderr
    _assert_one_at_a_time_in_order("user:1", 15)
    _assert_one_at_a_time_in_order("user:2", 15)
    assert [r.return_value for r in _by_sequence("user:1")] == list(range(15))


def test_retried_head_keeps_its_place(run_worker, steps):
    first = tasks.fails_first_attempt.using(ordering_key="k").enqueue(1)
    second = tasks.step.using(ordering_key="k").enqueue("k", 2)
    assert run_worker("--burst", "--concurrency", "4").returncode == 0
    first.refresh()
    second.refresh()
    assert first.status == second.status == TaskResultStatus.SUCCESSFUL
    assert len(first.errors) == 1
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT started FROM {tasks.STEPS_TABLE} WHERE n = 2")
        [(second_body_started,)] = cursor.fetchall()
    assert first.finished_at.timestamp() <= second_body_started


def test_continue_policy_releases_the_key_after_a_dead_task(run_worker, steps):
    dead = tasks.dies_and_continues.using(ordering_key="c").enqueue(1)
    after = tasks.step.using(ordering_key="c").enqueue("c", 2)
    assert run_worker("--burst").returncode == 0
    dead.refresh()
    after.refresh()
    assert dead.status == TaskResultStatus.FAILED
    assert after.status == TaskResultStatus.SUCCESSFUL


def test_block_policy_holds_the_key_until_redrive_or_discard(run_worker, steps):
    dead = tasks.dies_and_blocks.using(ordering_key="b").enqueue(1)
    waiting = tasks.step.using(ordering_key="b").enqueue("b", 2)
    other_key = tasks.step.using(ordering_key="other").enqueue("other", 3)
    assert run_worker("--burst").returncode == 0
    dead.refresh()
    waiting.refresh()
    other_key.refresh()
    assert dead.status == TaskResultStatus.FAILED
    assert TaskRecord.objects.get(pk=dead.id).ordering_blocked
    assert waiting.status == TaskResultStatus.READY  # blocked behind the dead task
    assert other_key.status == TaskResultStatus.SUCCESSFUL

    assert discard(dead) is True
    assert run_worker("--burst").returncode == 0
    waiting.refresh()
    assert waiting.status == TaskResultStatus.SUCCESSFUL

    # Redrive: the dead task runs again (and, failing again, blocks again).
    later = tasks.step.using(ordering_key="b").enqueue("b", 4)
    dead2 = tasks.dies_and_blocks.using(ordering_key="b2").enqueue(5)
    assert run_worker("--burst").returncode == 0
    later.refresh()
    assert later.status == TaskResultStatus.SUCCESSFUL
    assert redrive(dead2) is True
    assert TaskRecord.objects.get(pk=dead2.id).status == TaskResultStatus.READY
    assert redrive(dead2) is False  # only FAILED tasks can be redriven
    assert run_worker("--burst").returncode == 0
    row = TaskRecord.objects.get(pk=dead2.id)
    assert row.status == TaskResultStatus.FAILED
    assert row.attempt == 1  # a fresh budget: one attempt again
    assert len(row.errors) == 2


def test_future_head_holds_its_key(run_worker, steps):
    later = timezone.now() + dt.timedelta(hours=1)
    head = tasks.step.using(ordering_key="f", run_after=later).enqueue("f", 1)
    behind = tasks.step.using(ordering_key="f").enqueue("f", 2)
    assert run_worker("--burst").returncode == 0
    head.refresh()
    behind.refresh()
    assert head.status == TaskResultStatus.READY
    assert behind.status == TaskResultStatus.READY


@pytest.mark.postgres
def test_ordering_across_four_processes(run_worker, steps):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    keys = [f"key-{k}" for k in range(50)]
    calls = []
    for n in range(40):
        for key in keys:
            calls.append((key, n))
    for key, n in calls:
        tasks.step.using(ordering_key=key).enqueue(key, n)
    # A small fixed prefetch spreads the keys over all four processes (adaptive prefetch
    # would let the first process to start claim most of this short backlog).
    proc = run_worker(
        "--burst", "--processes", "4", "--concurrency", "8", "--prefetch", "2", timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    for key in keys:
        _assert_one_at_a_time_in_order(key, 40)
        assert [r.return_value for r in _by_sequence(key)] == list(range(40))
    workers = {ids[0] for ids in TaskRecord.objects.values_list("worker_ids", flat=True)}
    assert len(workers) == 4


def test_the_database_holds_one_running_task_per_key_and_indexes_keyed_tasks_only():
    """The unique index behind the claim's one-running-per-key rule refuses a second
    running task of a key, and takes no entry for running tasks without a key (0021: one
    index entry less per claim), built and swapped concurrently on PostgreSQL."""
    from django.db import IntegrityError

    now = timezone.now()

    def running(key: str | None) -> TaskRecord:
        return TaskRecord.objects.create(
            task_path="tests.tasks.add",
            queue_name="default",
            run_after=now,
            enqueued_at=now,
            status=TaskResultStatus.RUNNING,
            ordering_key=key,
        )

    running(None)
    running(None)  # any number of unkeyed tasks run at once
    running("k")
    running("other")
    with pytest.raises(IntegrityError), transaction.atomic():
        running("k")
    assert TaskRecord.objects.filter(ordering_key="k").count() == 1
    assert_index_migration_runs_concurrently(
        "0021_one_running_key", "dtp_task_one_running_key", constraint=True
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_get_indexdef(indexrelid) FROM pg_index "
                "WHERE indexrelid = 'dtp_task_one_running_key'::regclass"
            )
            (definition,) = cursor.fetchone()
            cursor.execute("SELECT to_regclass('dtp_task_one_running_per_key')")
            assert cursor.fetchone() == (None,)
        assert "UNIQUE" in definition
        assert "ordering_key IS NOT NULL" in definition, definition


# -- schemas -----------------------------------------------------------------------------


def test_schema_validates_at_enqueue():
    result = tasks.send_welcome.enqueue(42, tags=["new"])
    assert TaskRecord.objects.get(pk=result.id).kwargs == {
        "user_id": 42,
        "lang": "en",
        "tags": ["new"],
    }
    with pytest.raises(InvalidTaskArguments, match=r"payload\['user_id'\] must be int"):
        tasks.send_welcome.enqueue("42")
    with pytest.raises(InvalidTaskArguments, match=r"payload\['tags'\]\[1\] must be str"):
        tasks.send_welcome.enqueue(1, tags=["a", 2])
    with pytest.raises(InvalidTaskArguments, match="cannot be called with these arguments"):
        tasks.send_welcome.enqueue()
    assert _rows() == 1


def test_schema_is_checked_again_in_the_worker(run_worker):
    good = tasks.send_welcome.enqueue(7, lang="fr")
    drifted = tasks.send_welcome.enqueue(8)
    # A payload stored by an older deploy that the schema no longer accepts.
    TaskRecord.objects.filter(pk=drifted.id).update(kwargs={"user_id": "eight", "lang": "en"})
    assert run_worker("--burst").returncode == 0
    good.refresh()
    assert good.return_value == "7:fr:"
    row = TaskRecord.objects.get(pk=drifted.id)
    assert row.status == TaskResultStatus.FAILED
    assert "payload no longer matches the task's schema" in row.dead_letter_reason
    assert "payload['user_id'] must be int" in row.dead_letter_reason


# -- codec through the database ---------------------------------------------------------

VALUES = [
    dt.datetime(2026, 5, 1, 12, 30, tzinfo=dt.UTC),
    dt.datetime(2026, 5, 1, 12, 30),
    dt.date(2026, 5, 1),
    dt.time(7, 15, 3),
    dt.timedelta(days=2, microseconds=5),
    Decimal("10.10"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    {1, 2, 3},
    frozenset({"a"}),
    (1, (2, 3)),
    b"\x00\xffbytes",
    {"__dtp__": "looks like a tag"},
]


def test_tagged_types_survive_enqueue_run_and_result(run_worker):
    results = [tasks.round_trip.enqueue(value) for value in VALUES]
    assert run_worker("--burst").returncode == 0
    for value, result in zip(VALUES, results, strict=True):
        fetched = tasks.round_trip.get_result(result.id)
        assert fetched.status == TaskResultStatus.SUCCESSFUL
        returned = fetched.return_value
        assert returned["value"] == value
        assert type(returned["value"]) is type(value)
        assert returned["type"] == type(value).__name__
    # What Django's TaskResult shows stays plain JSON.
    assert tasks.round_trip.get_result(results[0].id).args == ["2026-05-01T12:30:00+00:00"]


# -- bulk enqueue -------------------------------------------------------------------------


def test_enqueue_many_returns_results_in_order(enqueued_ids):
    results = enqueue_many(tasks.add, [((i, i), {}) for i in range(250)])
    assert [r.args for r in results] == [[i, i] for i in range(250)]
    assert _rows() == 250
    assert enqueued_ids == [r.id for r in results]
    sequences = [
        TaskRecord.objects.get(pk=r.id).sequence for r in (results[0], results[1], results[-1])
    ]
    assert sequences == sorted(sequences)


def test_enqueue_many_is_atomic():
    with pytest.raises(InvalidTaskArguments, match="call #2"):
        tasks.add.enqueue_many([((1, 2), {}), ((3, 4), {}), "oops"])
    with pytest.raises(InvalidTaskArguments, match=r"args\[0\] is a builtins.object"):
        tasks.add.enqueue_many([((1, 2), {}), ((object(), 4), {})])
    assert _rows() == 0


def test_enqueue_many_with_one_dedup_key_for_the_batch():
    batch = tasks.add.using(dedup_key="batch").enqueue_many([((1, 1), {}), ((2, 2), {})])
    again = tasks.add.using(dedup_key="batch").enqueue_many([((9, 9), {})])
    assert [r.id for r in again] == [r.id for r in batch]
    assert _rows() == 2


def test_aenqueue_many():
    import asyncio

    from asgiref.sync import sync_to_async

    async def scenario():  # type: ignore[no-untyped-def]
        results = await tasks.add.aenqueue_many([((1, 2), {})])
        await sync_to_async(connections.close_all)()
        return results

    [result] = asyncio.run(scenario())
    assert TaskRecord.objects.filter(pk=result.id).exists()


# -- capacity limits and queue resolution ------------------------------------------------


def test_payload_over_the_limit_is_refused(settings):
    settings.TASKS = _tasks_setting(MAX_PAYLOAD_BYTES=100)
    tasks.echo.enqueue("x" * 50)
    with pytest.raises(
        PayloadTooLarge, match=r"encoded arguments are 1\d\d bytes, over the limit of 100"
    ) as info:
        tasks.echo.enqueue("x" * 100)
    assert (info.value.limit, info.value.retryable) == (100, False)
    assert info.value.size > 100
    assert _rows() == 1


def test_full_queue_is_refused(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "other"],
            "OPTIONS": {"QUEUES_CONFIG": {"default": {"max_depth": 3}}},
        }
    }
    for n in range(3):
        tasks.add.enqueue(n, n)
    with pytest.raises(
        QueueFull, match=r"Queue 'default' holds 3 READY task.*max_depth of 3"
    ) as info:
        tasks.add.enqueue(9, 9)
    assert info.value.retryable
    with pytest.raises(QueueFull):
        tasks.add.enqueue_many([((1, 1), {})])
    tasks.echo.enqueue("other queue has no limit")
    assert _rows() == 4


def test_unserved_queue_falls_back_to_default(settings, caplog):
    settings.TASKS = _tasks_setting(QUEUE_RESOLUTION="fallback")  # an opt-in
    result = tasks.add.using(queue_name="nowhere").enqueue(1, 1)
    assert TaskRecord.objects.get(pk=result.id).queue_name == "default"
    assert result.task.queue_name == "default"
    tasks.add.using(queue_name="nowhere").enqueue(2, 2)
    warnings = [r for r in caplog.records if "does not serve" in r.getMessage()]
    assert len(warnings) <= 1  # logged once per task and queue (maybe by an earlier test)


# -- cancel ------------------------------------------------------------------------------


def test_cancel_a_ready_task(run_worker):
    result = tasks.add.enqueue(1, 1)
    outcome = cancel(result)
    assert outcome.outcome == "cancelled"
    assert run_worker("--burst").returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_tasks_plus.exceptions.Cancelled"
    assert result.worker_ids == []  # it never ran
    assert cancel(result.id).outcome == "already_finished"


def test_cancel_a_running_task_cooperatively(start_worker, markers):
    result = tasks.waits_for_cancel.enqueue()
    worker = start_worker("--max-tasks", "1", "--queue", "slow")
    wait_for(lambda: (markers / f"waiting-{result.id}").exists())
    outcome = cancel(result)
    assert outcome.outcome == "cancel_requested"
    assert worker.wait(timeout=30) == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "django_tasks_plus.exceptions.Cancelled"
    assert TaskRecord.objects.get(pk=result.id).dead_letter_reason.endswith("stopped on request")


def test_cancelled_task_that_then_fails_is_not_retried_and_blocks_nothing(
    start_worker, markers, run_worker, steps
):
    result = tasks.fails_once_cancelled.using(ordering_key="cx").enqueue()
    behind = tasks.step.using(ordering_key="cx").enqueue("cx", 1)
    worker = start_worker("--max-tasks", "1", "--queue", "slow")
    wait_for(lambda: (markers / f"waiting-{result.id}").exists())
    assert cancel(result).outcome == "cancel_requested"
    assert worker.wait(timeout=30) == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1  # not retried, although its policy allows 3 attempts
    assert result.errors[0].exception_class_path == "django_tasks_plus.exceptions.Cancelled"
    assert not TaskRecord.objects.get(pk=result.id).ordering_blocked
    assert run_worker("--burst").returncode == 0
    behind.refresh()
    assert behind.status == TaskResultStatus.SUCCESSFUL


def test_cancel_a_finished_task_says_so(run_worker):
    result = tasks.add.enqueue(1, 1)
    assert run_worker("--burst").returncode == 0
    outcome = cancel(result)
    assert outcome.outcome == "already_finished"
    assert "SUCCESSFUL" in outcome.message
