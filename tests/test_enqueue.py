"""The backend in the caller's process: enqueue, results, transactions, bad input."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.utils import timezone

from django_tasks_plus import (
    InvalidTaskOptions,
    Task,
    TaskResultStatus,
    compat,
    exponential_backoff,
)
from django_tasks_plus.compat import task_backends, task_enqueued
from django_tasks_plus.models import TaskRecord
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_backend_features():
    backend = task_backends["default"]
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority
    assert backend.task_class is Task
    assert isinstance(tasks.add, Task)


def test_enqueue_writes_one_ready_row():
    result = tasks.echo.enqueue(1, "two", (3, 4), key={"nested": [None, True, 1.5]})
    record = TaskRecord.objects.get(pk=result.id)
    assert record.status == TaskResultStatus.READY
    assert record.task_path == "tests.tasks.echo"
    assert record.queue_name == "other"
    assert record.priority == 5
    assert record.args == [1, "two", {"__dtp__": "tuple", "v": [3, 4]}]  # tuples survive
    assert record.kwargs == {"key": {"nested": [None, True, 1.5]}}
    assert record.attempt == 0
    assert record.worker_ids == []
    assert record.run_after == record.enqueued_at
    assert result.status == TaskResultStatus.READY
    assert result.args == [1, "two", [3, 4]]
    assert result.errors == []
    assert result.worker_ids == []


def test_enqueue_many_results_match_their_rows():
    results = tasks.echo.enqueue_many([((n,), {"k": n}) for n in range(3)])
    assert len({result.id for result in results}) == 3
    for n, result in enumerate(results):
        assert (result.args, result.kwargs) == ([n], {"k": n})
        assert result.errors == [] and result.worker_ids == []
        assert result.task.queue_name == "other"
        stored = task_backends["default"].get_result(result.id)
        assert (stored.args, stored.kwargs, stored.status) == (result.args, result.kwargs, "READY")
    results[0].errors.append("x")  # each result owns its lists
    assert results[1].errors == []


def test_get_result_and_refresh_read_the_row():
    result = tasks.add.enqueue(1, 2)
    fetched = tasks.add.get_result(result.id)
    assert fetched.id == result.id
    assert fetched.status == TaskResultStatus.READY
    assert fetched.enqueued_at == result.enqueued_at
    assert fetched.task.func is tasks.add.func

    TaskRecord.objects.filter(pk=result.id).update(
        status=TaskResultStatus.SUCCESSFUL, return_value=3, finished_at=timezone.now()
    )
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3


def test_async_enqueue_and_get_result():
    async def scenario():
        result = await tasks.add.aenqueue(5, 6)
        fetched = await tasks.add.aget_result(result.id)
        await result.arefresh()
        # The async API ran on asgiref's shared thread: close the connection it opened.
        await sync_to_async(connections.close_all)()
        return result, fetched

    result, fetched = asyncio.run(scenario())
    assert fetched.id == result.id
    assert TaskRecord.objects.filter(pk=result.id).exists()


def test_using_overrides_are_stored():
    when = timezone.now() + dt.timedelta(minutes=5)
    result = tasks.add.using(priority=-7, queue_name="emails", run_after=when).enqueue(1, 1)
    record = TaskRecord.objects.get(pk=result.id)
    assert (record.priority, record.queue_name, record.run_after) == (-7, "emails", when)
    fetched = tasks.add.get_result(result.id)
    assert fetched.task.priority == -7
    assert fetched.task.queue_name == "emails"
    assert fetched.task.run_after == when


def test_rollback_means_the_task_never_existed():
    seen = []
    task_enqueued.connect(
        lambda sender, task_result, **kw: seen.append(task_result.id),
        weak=False,
        dispatch_uid="test-rollback",
    )
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            result = tasks.add.enqueue(1, 1)
            assert TaskRecord.objects.filter(pk=result.id).exists()
            raise RuntimeError("roll back")
        assert not TaskRecord.objects.filter(pk=result.id).exists()
        assert result.id not in seen  # task_enqueued waits for the commit

        with transaction.atomic():
            committed = tasks.add.enqueue(2, 2)
            assert committed.id not in seen
        assert committed.id in seen
    finally:
        task_enqueued.disconnect(dispatch_uid="test-rollback")


def test_uncommitted_task_is_invisible_to_a_worker(start_worker, markers):
    """A worker runs the task only once the enqueuing transaction commits."""
    with transaction.atomic():
        result = tasks.add.enqueue(3, 4)
        worker = start_worker("--max-tasks", "1", "--poll-interval", "0.1")
        # Long enough for the worker to start and poll many times (on SQLite its claim
        # waits for our write lock; on PostgreSQL it simply does not see the row).
        threading.Event().wait(3)
        assert worker.poll() is None, "worker exited before the task was committed"
    worker.wait(timeout=60)
    assert worker.returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 7


# -- bad input: a clear typed error, and no row ---------------------------------------


def _no_rows() -> bool:
    return not TaskRecord.objects.exists()


def test_bad_task_options_are_refused_at_definition():
    from django_tasks_plus import task

    with pytest.raises(InvalidTaskOptions, match="retry must be a callable policy"):
        task(retry=5)(tasks.not_a_task)
    with pytest.raises(InvalidTaskOptions, match=r"Did you mean to call a factory"):
        task(retry=exponential_backoff)(tasks.not_a_task)
    with pytest.raises(InvalidTaskOptions, match="timeout must be a positive number"):
        task(timeout=-1)(tasks.not_a_task)
    with pytest.raises(InvalidTaskOptions, match="timeout must be a positive number"):
        task(timeout="10")(tasks.not_a_task)


def test_get_result_for_a_row_naming_a_removed_task():
    from django_tasks_plus import TaskNotRegistered

    now = timezone.now()
    row = TaskRecord.objects.create(
        task_path="tests.tasks.was_removed", run_after=now, enqueued_at=now
    )
    with pytest.raises(TaskNotRegistered, match="not a task in this codebase"):
        task_backends["default"].get_result(str(row.pk))


def test_the_results_of_a_batch_are_clones_of_its_first_with_their_own_call():
    """``clone_results`` (each slot set through its descriptor) sets every slot: the
    call's id and arguments, fresh error and worker lists, the rest the template's."""
    import dataclasses

    from django_tasks_plus.results import _slot_setters, clone_results, make_result

    template = make_result(
        tasks.add,
        id="first",
        status="READY",
        backend="default",
        args=[1, 2],
        kwargs={},
        enqueued_at=timezone.now(),
        started_at=None,
        finished_at=timezone.now(),
        last_attempted_at=None,
        errors=[{"exception_class_path": "x.Y", "traceback": "t"}],
        worker_ids=["w1"],
        return_value={"kept": True},
    )
    clone, other = clone_results(template, [("second", [3], {"k": 4}), ("third", [], {})])
    assert type(clone) is type(template) and _slot_setters(type(template)) is not None
    assert (other.id, other.args, other.errors) == ("third", [], [])
    assert other.errors is not clone.errors and other.worker_ids is not clone.worker_ids
    assert (clone.id, clone.args, clone.kwargs) == ("second", [3], {"k": 4})
    assert clone.errors == [] and clone.worker_ids == []
    assert clone.errors is not template.errors and clone.worker_ids is not template.worker_ids
    per_call = {"id", "args", "kwargs", "errors", "worker_ids"}
    for field in dataclasses.fields(template):
        if field.name not in per_call:
            assert getattr(clone, field.name) is getattr(template, field.name), field.name
    assert clone._return_value is template._return_value  # not a dataclass init field
    assert template.id == "first" and len(template.errors) == 1  # the template untouched

    @dataclasses.dataclass(frozen=True)
    class WithoutSlots:
        id: str

    assert _slot_setters(WithoutSlots) is None  # clone_results uses dataclasses.replace


@pytest.mark.parametrize(
    "errors, worker_ids, return_value",
    [
        ((), (), None),
        ([{"exception_class_path": "x.Y", "traceback": "t"}], ["w1", "w2"], {"kept": [1]}),
        ("not a list", [], 3),  # a corrupt errors column shows as one entry
    ],
)
def test_a_result_built_slot_by_slot_equals_the_one_django_builds(errors, worker_ids, return_value):
    """``make_result`` sets the slots itself (no ``__init__``/``__post_init__``): on this
    Django it takes that road, and what it builds equals, field for field and type for
    type, the ``TaskResult`` Django's constructor builds from the same values."""
    import dataclasses

    from django_tasks_plus.results import _result_builder, make_result, task_errors

    now = timezone.now()
    values = {
        "id": "abc",
        "status": "RUNNING",
        "backend": "default",
        "args": [1, {"a": [2, None]}],
        "kwargs": {"k": "v"},
        "enqueued_at": now,
        "started_at": now,
        "finished_at": None,
        "last_attempted_at": now,
    }
    ours = make_result(
        tasks.add, errors=errors, worker_ids=worker_ids, return_value=return_value, **values
    )
    django = compat.TaskResult(
        task=tasks.add,
        **{**values, "status": compat.TaskResultStatus.RUNNING},
        errors=task_errors(errors),
        worker_ids=list(worker_ids),
    )
    object.__setattr__(django, "_return_value", return_value)
    assert _result_builder(compat.TaskResult) is not None  # the slot road was taken
    for field in dataclasses.fields(django):
        mine, theirs = getattr(ours, field.name), getattr(django, field.name)
        assert (mine, type(mine)) == (theirs, type(theirs)), field.name
    assert ours._return_value == return_value
    assert ours.args is not values["args"]  # the caller's list is not shared


def test_a_big_batch_is_built_with_the_cyclic_collector_paused_and_restored():
    """``collector.py``: from 64 calls the collector is off while the batch is built and
    written (seen here by task_enqueued receivers, which run at once in autocommit), and
    on again afterwards, also when a call is refused; never turned on if it was off."""
    import gc

    from django_tasks_plus.exceptions import InvalidTaskArguments

    seen: list[bool] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(gc.isenabled())

    task_enqueued.connect(receiver, weak=False, dispatch_uid="test-collector-paused")
    try:
        assert gc.isenabled()
        tasks.add.enqueue_many([((n, n), {}) for n in range(64)])
        assert seen == [False] * 64 and gc.isenabled()
        seen.clear()
        tasks.add.enqueue_many(((n, n), {}) for n in range(63))  # a generator, below 64
        assert seen == [True] * 63 and gc.isenabled()

        calls: list[Any] = [((n, n), {}) for n in range(100)]
        calls[70] = ((object(), 1), {})
        with pytest.raises(InvalidTaskArguments):
            tasks.add.enqueue_many(calls)
        assert gc.isenabled() and TaskRecord.objects.count() == 127

        gc.disable()
        try:
            seen.clear()
            tasks.add.enqueue_many([((n, n), {}) for n in range(64)])
            assert seen == [False] * 64 and not gc.isenabled()  # left as it was
        finally:
            gc.enable()
    finally:
        task_enqueued.disconnect(dispatch_uid="test-collector-paused")


def test_result_ids_are_uuids():
    result = tasks.add.enqueue(1, 2)
    assert str(uuid.UUID(result.id)) == result.id


def test_task_ids_are_random_version_4_uuids():
    from django_tasks_plus.envelope import new_task_ids

    ids = new_task_ids(5000)
    assert len(set(ids)) == 5000
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)
    assert new_task_ids(0) == []
