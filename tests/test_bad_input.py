"""The bad-input catalogue: one test per row of the table in docs/errors.md.

Each row feeds one kind of bad input to the real backend or a real ``runtasks``
process, checks the exact error type and message, and checks that nothing was written
(enqueue side) or nothing was lost (worker side: the bad row is kept, dead-lettered
with its reason, and the worker goes on to run the good task next to it).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_tasks_plus import (
    CorruptTaskRecord,
    DatabaseUnavailable,
    InvalidBackendOptions,
    InvalidTaskArguments,
    InvalidTaskOptions,
    PayloadTooLarge,
    TaskResultStatus,
    TaskRowLocked,
    TimeOutOfRange,
    cancel,
    task,
)
from django_tasks_plus.compat import InvalidTask, TaskResultDoesNotExist, task_backends
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.models import DedupKey, TaskRecord
from tests import tasks
from tests.conftest import REFUSED_DATABASE, postgres_only

pytestmark = pytest.mark.django_db(transaction=True)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "errors.md"
BACKEND = "django_tasks_plus.backend.DatabaseBackend"
UNSTORABLE = (
    "which cannot be stored (supported types: None, bool, int, float, str, list, tuple, "
    "dict, set, frozenset, bytes, datetime.datetime, datetime.date, datetime.time, "
    "datetime.timedelta, decimal.Decimal, uuid.UUID)."
)


LONE_SURROGATE = (
    "contains the lone surrogate '\\udcff', "
    "which is not valid Unicode and cannot be stored as UTF-8 (text decoded with "
    "os.fsdecode() or errors='surrogateescape' holds such characters). Pass bytes instead, "
    "or decode with errors='replace'."
)


def deep_list(depth: int) -> str:
    """JSON text of ``depth`` nested lists around a 1."""
    return "[" * depth + "1" + "]" * depth


@dataclass(frozen=True)
class Row:
    title: str
    error: str


CATALOGUE: dict[str, Row] = {}


def row(title: str, error: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a test as a catalogue row; the docs table must list it (checked below)."""

    def register(test: Callable[..., Any]) -> Callable[..., Any]:
        CATALOGUE[test.__name__] = Row(title, error)
        return test

    return register


def nothing_written() -> bool:
    return not TaskRecord.objects.exists() and not DedupKey.objects.exists()


def refused(error: type[BaseException], message: str, call: Callable[[], Any]) -> BaseException:
    """Run ``call``; it must raise exactly ``error`` with exactly ``message``, writing nothing."""
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message
    assert nothing_written()
    return info.value


def forge(path: str = "tests.tasks.add", **columns: Any) -> TaskRecord:
    """A READY row written behind the backend's back, as a hand edit or a bug would."""
    now = timezone.now()
    columns.setdefault("args", [1, 2])
    return TaskRecord.objects.create(
        task_path=path, queue_name="default", run_after=now, enqueued_at=now, **columns
    )


def set_raw(record: TaskRecord, column: str, sql_value: str) -> None:
    """Overwrite one column with a raw SQL literal, bypassing the model's JSON encoding."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TaskRecord._meta.db_table} SET {column} = {sql_value} WHERE id = %s",
            [record.pk.hex if connection.vendor == "sqlite" else record.pk],
        )


def run_beside_good_task(run_worker: Callable[..., Any], *args: str) -> TaskRecord:
    """Run a burst worker with one good task queued too; the good task must succeed."""
    good = tasks.add.enqueue(20, 22)
    proc = run_worker("--burst", "--concurrency", "1", *args)
    assert proc.returncode == 0, proc.stderr
    good.refresh()
    assert good.status == TaskResultStatus.SUCCESSFUL
    assert good.return_value == 42
    return TaskRecord.objects.get(pk=good.id)


def dead_lettered(record: TaskRecord) -> TaskRecord:
    record.refresh_from_db()
    assert record.status == TaskResultStatus.FAILED
    assert record.finished_at is not None
    return record


# =======================================================================================
# Enqueue: refused before anything is written
# =======================================================================================


@row("Argument that is not JSON-serializable", "InvalidTaskArguments")
def test_argument_not_serializable():
    exc = refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: args[1]['when'] is a builtins.object, " + UNSTORABLE,
        lambda: tasks.echo.enqueue(1, {"when": object()}),
    )
    assert exc.field_path == ("args", 1, "when")


@row("Keyword argument that is not JSON-serializable", "InvalidTaskArguments")
def test_keyword_argument_not_serializable():
    exc = refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: kwargs['obj'] is a builtins.object, " + UNSTORABLE,
        lambda: tasks.echo.enqueue(obj=object()),
    )
    assert exc.field_path == ("kwargs", "obj")


@row("Dictionary key that is not a string", "InvalidTaskArguments")
def test_non_string_key():
    exc = refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: args[0] has the key 1 (int); only str keys can be "
        "stored.",
        lambda: tasks.echo.enqueue({1: "int key"}),
    )
    assert exc.field_path == ("args", 0)


@row("NaN or infinity", "InvalidTaskArguments")
def test_nan():
    refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: args[0] is nan; only finite numbers can be stored.",
        lambda: tasks.echo.enqueue(float("nan")),
    )


@row("NUL character in a string argument", "InvalidTaskArguments")
def test_nul_in_argument():
    # PostgreSQL's jsonb cannot hold U+0000; the same rule applies on SQLite.
    exc = refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: kwargs['note'] contains a NUL character, which "
        "databases cannot store.",
        lambda: tasks.echo.enqueue(note="a\x00b"),
    )
    assert exc.field_path == ("kwargs", "note")


@row("NUL character in a dictionary key", "InvalidTaskArguments")
def test_nul_in_key():
    refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: args[0] key contains a NUL character, which "
        "databases cannot store.",
        lambda: tasks.echo.enqueue({"k\x00": 1}),
    )


@row("Lone surrogate in a string argument", "InvalidTaskArguments")
def test_lone_surrogate_in_argument():
    # os.fsdecode() of bytes that are not UTF-8 (a file name, say) makes such text.
    exc = refused(
        InvalidTaskArguments,
        f"Cannot enqueue tests.tasks.echo: kwargs['paths'][1] {LONE_SURROGATE}",
        lambda: tasks.echo.enqueue(paths=["ok.txt", os.fsdecode(b"\xff")]),
    )
    assert exc.field_path == ("kwargs", "paths", 1)


@row("Lone surrogate in a dictionary key", "InvalidTaskArguments")
def test_lone_surrogate_in_key():
    exc = refused(
        InvalidTaskArguments,
        f"Cannot enqueue tests.tasks.echo: args[0]['sizes'] key {LONE_SURROGATE}",
        lambda: tasks.echo.enqueue({"sizes": {os.fsdecode(b"\xff"): 3}}),
    )
    assert exc.field_path == ("args", 0, "sizes")


@row("Arguments nested more than 100 levels deep", "InvalidTaskArguments")
def test_arguments_nested_too_deeply():
    # The worker refuses deeper rows too: what enqueue accepts, a worker can read.
    exc = refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: kwargs['tree'] is nested too deeply: more than 100 "
        "levels of lists, tuples, dicts and sets (or it contains itself). Pass flatter data, "
        "or store it elsewhere and pass a reference.",
        lambda: tasks.echo.enqueue(tree=json.loads(deep_list(101))),
    )
    assert exc.field_path == ("kwargs", "tree")


@row("Arguments over `MAX_PAYLOAD_BYTES`", "PayloadTooLarge")
def test_payload_over_the_limit():
    huge = "x" * (1 << 20)
    exc = refused(
        PayloadTooLarge,
        "Cannot enqueue tests.tasks.echo: its encoded arguments are 1,048,582 bytes, over the "
        "limit of 1,048,576 (OPTIONS['MAX_PAYLOAD_BYTES']).",
        lambda: tasks.echo.enqueue(huge),
    )
    assert (exc.size, exc.limit) == (1_048_582, 1_048_576)


@row("Huge string argument under the limit", "none: stored and returned intact")
def test_huge_string_round_trips(run_worker):
    # 900,000 characters, most of them outside ASCII: the byte limit counts UTF-8.
    huge = "é" * 450_000 + "\U0001f600" * 1000 + "z" * 1000
    result = tasks.round_trip.enqueue(huge)
    assert run_worker("--burst").returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"value": huge, "type": "str"}


@row("Wrong number of positional arguments", "InvalidTaskArguments")
def test_too_few_arguments():
    exc = refused(
        InvalidTaskArguments,
        "tests.tasks.add() cannot be called with these arguments: missing a required argument: 'b'",
        lambda: tasks.add.enqueue(1),
    )
    assert exc.field_path == ()


@row("Too many positional arguments", "InvalidTaskArguments")
def test_too_many_arguments():
    refused(
        InvalidTaskArguments,
        "tests.tasks.add() cannot be called with these arguments: too many positional arguments",
        lambda: tasks.add.enqueue(1, 2, 3),
    )


@row("Unknown keyword argument", "InvalidTaskArguments")
def test_unknown_keyword():
    refused(
        InvalidTaskArguments,
        "tests.tasks.add() cannot be called with these arguments: got an unexpected keyword "
        "argument 'c'",
        lambda: tasks.add.enqueue(1, 2, c=3),
    )


@row("Payload that does not match the task's schema", "InvalidTaskArguments")
def test_schema_mismatch_at_enqueue():
    exc = refused(
        InvalidTaskArguments,
        "tests.tasks.send_welcome(): payload['user_id'] must be int, got str ('seven')",
        lambda: tasks.send_welcome.enqueue(user_id="seven"),
    )
    assert exc.field_path == ("user_id",)


@row("One bad call in `enqueue_many`", "InvalidTaskArguments")
def test_one_bad_call_in_a_batch_writes_none():
    refused(
        InvalidTaskArguments,
        "Cannot enqueue tests.tasks.echo: args[0] is a builtins.object, " + UNSTORABLE,
        lambda: tasks.echo.enqueue_many([((1,), {}), ((object(),), {}), ((3,), {})]),
    )


@row("A call in `enqueue_many` that is not an `(args, kwargs)` pair", "InvalidTaskArguments")
def test_batch_item_of_the_wrong_shape():
    refused(
        InvalidTaskArguments,
        "enqueue_many() call #1 must be an (args, kwargs) pair such as ((1, 2), {'x': 3}), got 5.",
        lambda: tasks.echo.enqueue_many([((1,), {}), 5]),
    )


@row("Priority outside -100..100", "InvalidTask")
def test_priority_out_of_range():
    with pytest.raises(InvalidTask) as info:
        tasks.add.using(priority=101).enqueue(1, 2)
    assert str(info.value) == "priority must be a whole number between -100 and 100."
    assert nothing_written()


@row("Priority that is not a whole number", "InvalidTask")
def test_priority_not_an_int():
    with pytest.raises(InvalidTask) as info:
        tasks.add.using(priority=1.5).enqueue(1, 2)
    assert str(info.value) == "priority must be a whole number between -100 and 100."
    assert nothing_written()


@row("Queue not in `QUEUES`", "InvalidTask")
def test_queue_not_served(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "other", "slow"]}}
    with pytest.raises(InvalidTask) as info:  # the default, as in Django
        tasks.add.using(queue_name="nowhere").enqueue(1, 2)
    assert str(info.value) == "Queue 'nowhere' is not valid for backend."
    assert nothing_written()


@row("Naive `run_after`", "InvalidTask")
def test_naive_run_after():
    with pytest.raises(InvalidTask) as info:
        tasks.add.using(run_after=dt.datetime(2030, 1, 1)).enqueue(1, 2)
    assert str(info.value) == "run_after must be an aware datetime."
    assert nothing_written()


@row("`run_after` more than ten years ahead", "TimeOutOfRange")
def test_run_after_absurdly_far():
    far = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
    refused(
        TimeOutOfRange,  # an InvalidTaskOptions, as it always was
        "tests.tasks.add: run_after 9999-01-01T00:00:00+00:00 is more than 3650 days ahead; "
        "a date that far is taken for a mistake.",
        lambda: tasks.add.using(run_after=far).enqueue(1, 2),
    )


@row("Empty dedup key", "InvalidTaskOptions")
def test_dedup_key_empty():
    refused(
        InvalidTaskOptions,
        "tests.tasks.add: dedup_key must be a non-empty string of at most 255 characters, "
        "got '  '.",
        lambda: tasks.add.using(dedup_key="  ").enqueue(1, 2),
    )


@row("Dedup key over 255 characters", "InvalidTaskOptions")
def test_dedup_key_too_long():
    refused(
        InvalidTaskOptions,
        "tests.tasks.add: dedup_key must be a non-empty string of at most 255 characters, "
        "got 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk… (256 characters).",
        lambda: tasks.add.using(dedup_key="k" * 256).enqueue(1, 2),
    )


@row("Ordering key over 255 characters", "InvalidTaskOptions")
def test_ordering_key_too_long():
    refused(
        InvalidTaskOptions,
        "tests.tasks.add: ordering_key must be a non-empty string of at most 255 characters, "
        "got 'ooooooooooooooooooooooooooooooooooooooo… (300 characters).",
        lambda: tasks.add.using(ordering_key="o" * 300).enqueue(1, 2),
    )


@row("Retry option that is not a policy", "InvalidTaskOptions")
def test_retry_not_a_policy():
    with pytest.raises(InvalidTaskOptions) as info:
        task(retry=5)(tasks.not_a_task)
    assert str(info.value) == (
        "tests.tasks.not_a_task: retry must be a callable policy "
        "(attempt, elapsed, exc) -> timedelta | None, such as exponential_backoff(), got 5."
    )


@row("Settings with an unknown key", "InvalidBackendOptions")
def test_settings_unknown_key():
    with pytest.raises(InvalidBackendOptions) as info:
        parse_settings("default", {"BACKEND": BACKEND, "OPTIONS": {"CONCURENCY": 4}})
    assert str(info.value) == (
        "TASKS['default']['OPTIONS'] has an unknown key 'CONCURENCY'. Did you mean "
        "'CONCURRENCY'? Known keys: AUTODISCOVER, CONCURRENCY, DATABASE, DEDUP_TTL, DOER, "
        "ENQUEUE_MIDDLEWARE, MAX_PAYLOAD_BYTES, METRICS, MIDDLEWARE, NOTIFY, POLL_INTERVAL, "
        "PREFETCH, QUEUES_CONFIG, QUEUE_RESOLUTION, RETENTION, RETRY, SCHEDULES, SERVICES, "
        "SHUTDOWN_TIMEOUT, SYNCHRONOUS_CLAIMS, VISIBILITY_TIMEOUT."
    )


@row("Settings with a bad value", "InvalidBackendOptions")
def test_settings_bad_value():
    with pytest.raises(InvalidBackendOptions) as info:
        parse_settings("default", {"BACKEND": BACKEND, "OPTIONS": {"CONCURRENCY": 0}})
    assert str(info.value) == (
        "TASKS['default']['OPTIONS']['CONCURRENCY'] must be a whole number of at least 1, got 0."
    )


@row("Database unavailable at enqueue", "DatabaseUnavailable")
def test_database_unavailable_at_enqueue(tmp_path):
    # Point the connection where nothing answers: a closed port on PostgreSQL, a file in a
    # missing folder on SQLite. Same error path as a server that went down.
    original = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "postgresql":
        connection.settings_dict["PORT"] = "1"
    else:
        connection.settings_dict["NAME"] = str(tmp_path / "missing-folder" / "db.sqlite3")
    try:
        with pytest.raises(DatabaseUnavailable) as info:
            tasks.add.enqueue(1, 2)
    finally:
        connection.close()
        connection.settings_dict.update(original)
    assert str(info.value).startswith(
        "Cannot enqueue tests.tasks.add: database 'default' is unavailable ("
    )
    assert info.value.retryable
    assert info.value.__cause__ is not None
    assert nothing_written()


@row(
    "Cancel, redrive, run now, discard or delete of a task whose row another session keeps locked",
    "TaskRowLocked",
)
@postgres_only  # SQLite has no row locks: it waits for the database's by its busy timeout
def test_an_operators_change_to_a_locked_row():
    from tests.test_locked_rows import row_locked

    task_id = tasks.add.enqueue(1, 2).id
    with row_locked(task_id), transaction.atomic():
        with pytest.raises(TaskRowLocked) as info:
            cancel(task_id, lock_wait=0.2)
        assert TaskRecord.objects.count() == 1  # the caller's transaction is still usable
    assert str(info.value).startswith(
        f"Task {task_id}: another database session holds its row locked (a transaction "
        "still open in task code, a script or a psql session); waited 0."
    )
    assert str(info.value).endswith(" s and changed nothing. Try again once that transaction ends.")
    assert info.value.retryable and info.value.task_id == task_id
    assert TaskRecord.objects.get(pk=task_id).status == "READY"


@row(
    "Enqueue with a dedup key that another transaction, still open, is taking",
    "DedupKeyLocked",
)
@postgres_only  # SQLite serializes writers: it waits for the database by its busy timeout
def test_an_enqueue_of_a_key_another_transaction_is_taking(monkeypatch):
    from django_tasks_plus import DedupKeyLocked
    from django_tasks_plus.db import dedup
    from tests.test_locked_rows import key_being_taken

    monkeypatch.setattr(dedup, "DEDUP_LOCK_WAIT", 0.2)
    with key_being_taken("report:7"), transaction.atomic():
        with pytest.raises(DedupKeyLocked) as info:
            tasks.add.using(dedup_key="report:7").enqueue(1, 2)
        assert nothing_written()  # the caller's transaction is still usable
    assert str(info.value).endswith(
        " s and enqueued nothing. Try again once that transaction ends."
    )
    assert info.value.retryable and info.value.key == "report:7"
    assert nothing_written()


@row("Enqueue fails inside the caller's transaction", "InvalidTaskArguments")
def test_failed_enqueue_keeps_the_callers_transaction():
    # The error is raised before any SQL, so the caller's transaction is intact: it can
    # catch the error, go on and commit what it wrote before.
    with transaction.atomic():
        kept = tasks.add.enqueue(1, 2)
        with pytest.raises(InvalidTaskArguments):
            tasks.echo.enqueue(object())
        also_kept = tasks.add.enqueue(3, 4)
    assert set(TaskRecord.objects.values_list("id", flat=True)) == {
        uuid.UUID(kept.id),
        uuid.UUID(also_kept.id),
    }


@row("Result id that is not a task", "TaskResultDoesNotExist")
def test_unknown_result_id():
    backend = task_backends["default"]
    for bad in ("8d7a5d0e-0c36-4a59-8d2e-4d3c3f3f9a11", "not-a-uuid"):
        with pytest.raises(TaskResultDoesNotExist) as info:
            backend.get_result(bad)
        assert str(info.value) == bad


# =======================================================================================
# Stored rows: corrupt or forged, met by get_result() and by a real worker
# =======================================================================================


@row("Stored return value that cannot be decoded", "CorruptTaskRecord")
def test_corrupt_return_value():
    now = timezone.now()
    record = forge(
        status=TaskResultStatus.SUCCESSFUL,
        return_value={"__dtp__": "datetime", "v": "not a date"},
        finished_at=now,
    )
    with pytest.raises(CorruptTaskRecord) as info:
        task_backends["default"].get_result(str(record.pk))
    assert str(info.value) == (
        f"Task {record.pk}: the stored return value is a 'datetime' tag with the invalid "
        "value 'not a date'. The row is left as it is; fix or discard it."
    )
    assert (info.value.task_id, info.value.column) == (str(record.pk), "return_value")
    record.refresh_from_db()
    assert record.return_value == {"__dtp__": "datetime", "v": "not a date"}


@row("`errors` column that is not a list of errors", "CorruptTaskRecord (kept as an entry)")
def test_corrupt_errors_column(run_worker):
    record = forge("tests.tasks.fails_first_attempt", args=[7], errors={"oops": 1})
    shown = task_backends["default"].get_result(str(record.pk))
    assert [e.exception_class_path for e in shown.errors] == [
        "django_tasks_plus.exceptions.CorruptTaskRecord"
    ]
    assert shown.errors[0].traceback.endswith("kept here as it was: {'oops': 1}")

    run_beside_good_task(run_worker)
    record.refresh_from_db()
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.return_value == 7
    # The corrupt value is kept as the first entry; the real failure follows it.
    assert [e["exception_class_path"] for e in record.errors] == [
        "django_tasks_plus.exceptions.CorruptTaskRecord",
        "builtins.RuntimeError",
    ]


@row("`worker_ids` column that is not a list", "none: the claim starts a new list")
def test_corrupt_worker_ids(run_worker):
    record = forge(worker_ids="not a list")
    run_beside_good_task(run_worker)
    record.refresh_from_db()
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert record.return_value == 3
    assert len(record.worker_ids) == 1


def test_worker_ids_read_the_same_whether_their_text_is_cached_or_not():
    """A claim decodes each distinct short ``worker_ids`` text once (a cache); the values
    a corrupt or long text reads as are those of the uncached path."""
    from django_tasks_plus.stored import _CACHED_TEXT_LIMIT, worker_id_list

    many = json.dumps([f"worker-{n}" for n in range(200)])
    assert len(many) > _CACHED_TEXT_LIMIT
    cases = {
        '["w-0"]': ("w-0",),
        '["w-0", "w-1"]': ("w-0", "w-1"),
        "[]": (),
        "not json": (),
        '{"a": 1}': (),
        "[1, 2]": (),
        many: tuple(f"worker-{n}" for n in range(200)),
    }
    for text, expected in cases.items():
        assert worker_id_list(text) == expected
        assert worker_id_list(text) == expected  # the second read: from the cache
        assert worker_id_list(text.encode()) == expected  # bytes: never cached
    assert worker_id_list(["w-0"]) == ("w-0",)  # a value the driver already decoded


@row("Text that is not JSON written into a JSON column", "IntegrityError or DataError")
def test_database_refuses_text_that_is_not_json():
    # Both databases guard the JSON columns themselves (a CHECK (JSON_VALID(...)) on
    # SQLite, the jsonb type on PostgreSQL), so such a row cannot exist.
    from django.db import DataError, IntegrityError

    record = forge()
    with pytest.raises((IntegrityError, DataError)), transaction.atomic():
        set_raw(record, "args", "'[1, 2'")
    record.refresh_from_db()
    assert record.args == [1, 2]


def _claim_row(**columns: object) -> dict[str, object]:
    """A claimed row's values by column name: a plain first attempt, with ``columns``
    instead of the defaults."""
    return {
        "id": str(uuid.uuid4()),
        "task_path": "tests.tasks.add",
        "queue_name": "default",
        "priority": 0,
        "args": "[1, 2]",
        "kwargs": "{}",
        "attempt": 1,
        "worker_ids": "[]",
        "errors": "[]",
        "enqueued_at": timezone.now(),
        "run_after": timezone.now(),
        "started_at": None,
        "lease_token": "t",
        "backend_name": "default",
        "ordering_key": None,
        "requested_run_after": None,
        "held_since": None,
        "breaker_key": None,
        "metadata": "{}",
        **columns,
    }


def test_a_claimed_row_with_text_that_is_not_json_is_dead_lettered_not_crashed():
    # Behind that guard (a table restored without its constraints, say), the claim still
    # never raises for one bad row: the worker dead-letters it with the parser's message.
    from django_tasks_plus.db.base import CLAIM_COLUMNS, claimed_from_row
    from django_tasks_plus.worker.execution import prepare_call

    raw = _claim_row(args="[1, 2", worker_ids="not json", errors="{also not json")
    claimed = claimed_from_row([raw[name] for name in CLAIM_COLUMNS])
    assert claimed.worker_ids == ()
    assert claimed.errors[0]["exception_class_path"] == (
        "django_tasks_plus.exceptions.CorruptTaskRecord"
    )
    assert claimed.errors[0]["traceback"].endswith("kept here as it was: {also not json")
    with pytest.raises(ValueError) as info:
        prepare_call(tasks.add, claimed)
    assert str(info.value) == (
        "args cannot be read as JSON (Expecting ',' delimiter: line 1 column 6 (char 5))."
    )


def test_a_claimed_row_fills_each_field_from_its_own_column():
    """``claimed_from_row`` builds the ``ClaimedTask`` by position: each column's value
    lands in the field of its name (a field added to ``ClaimedTask`` out of step with
    the builder fails here)."""
    from datetime import timedelta

    from django_tasks_plus.db.base import CLAIM_COLUMNS, claimed_from_row
    from django_tasks_plus.lifecycle import ClaimedTask

    now = timezone.now()
    timed = ("enqueued_at", "run_after", "started_at", "requested_run_after", "held_since")
    times = {name: now - timedelta(minutes=place) for place, name in enumerate(timed, 1)}
    raw = _claim_row(
        queue_name="emails",
        priority=7,
        args="[1, 2]",
        kwargs='{"x": 3}',
        attempt=4,
        worker_ids='["w1", "w2"]',
        lease_token="lease",
        backend_name="other",
        ordering_key="key",
        breaker_key="breaker/key",
        metadata='{"m": 1}',
        **times,
    )
    claimed = claimed_from_row([raw[name] for name in CLAIM_COLUMNS], claimed_at=now)
    decoded = {
        "args": [1, 2],
        "kwargs": {"x": 3},
        "worker_ids": ("w1", "w2"),
        "errors": (),
        "metadata": {"m": 1},
    }
    for name in CLAIM_COLUMNS:
        assert getattr(claimed, name) == decoded.get(name, raw[name]), name
    assert claimed.claimed_at == now
    assert claimed.stored_size == len("[1, 2]") + len('{"x": 3}')
    assert len(claimed) == len(ClaimedTask._fields)


@row("`args` column of the wrong shape", "InvalidTaskArguments (dead-lettered)")
def test_args_wrong_shape(run_worker):
    record = forge(args={"not": "a list"})
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason == "stored arguments are corrupt: args is a dict, not a list."
    assert record.args == {"not": "a list"}


@row("`args` holding a tag that cannot be decoded", "InvalidTaskArguments (dead-lettered)")
def test_args_bad_tag(run_worker):
    record = forge(args=[{"__dtp__": "uuid", "v": "zzz"}, 2])
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason == (
        "stored arguments are corrupt: args[0] is a 'uuid' tag with the invalid value 'zzz'."
    )


@pytest.mark.parametrize(
    ("depth", "problem"),
    [
        (
            101,
            "args[0] is nested too deeply: more than 100 levels of lists and objects, "
            "which no enqueue writes.",
        ),
        (
            700,  # parses (on 3.11 too), but would exhaust the stack of a decoder without a limit
            "args[0] is nested too deeply: more than 100 levels of lists and objects, "
            "which no enqueue writes.",
        ),
        (1999, "args cannot be read as JSON (nested too deeply to parse)."),
    ],
)
@row("`args` nested too deeply", "InvalidTaskArguments (dead-lettered)")
def test_args_nested_too_deeply(run_worker, depth, problem):
    # 2,000 levels in all: valid for jsonb (~12,000) and SQLite (2,000), too deep for
    # Python's parser (~1,500), so the claim itself must not fail on it.
    record = forge()
    set_raw(record, "args", f"'[{deep_list(depth)}]'")
    run_beside_good_task(run_worker)
    status, reason = TaskRecord.objects.values_list("status", "dead_letter_reason").get(
        pk=record.pk
    )
    assert (status, reason) == (TaskResultStatus.FAILED, f"stored arguments are corrupt: {problem}")


@row("Reading a row whose JSON is nested too deeply to parse", "CorruptTaskRecord")
def test_get_result_of_a_row_too_deep_to_parse():
    record = forge()
    set_raw(record, "args", f"'[{deep_list(1999)}]'")
    with pytest.raises(CorruptTaskRecord) as info:
        task_backends["default"].get_result(str(record.pk))
    assert str(info.value) == (
        f"Task {record.pk}: the stored args is JSON nested too deeply to be read. The row is "
        "left as it is; fix or discard it."
    )
    assert (info.value.task_id, info.value.column) == (str(record.pk), "args")
    # A row deep enough to refuse but not too deep to parse shows empty arguments.
    set_raw(record, "args", f"'[{deep_list(700)}]'")
    shown = task_backends["default"].get_result(str(record.pk))
    assert (shown.args, shown.kwargs) == ([], {})


@row("Stored payload that no longer matches the schema", "InvalidTaskArguments (dead-lettered)")
def test_schema_mismatch_at_run_time(run_worker):
    record = forge("tests.tasks.send_welcome", args=[], kwargs={"user_id": "seven"})
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason == (
        "payload no longer matches the task's schema: tests.tasks.send_welcome(): "
        "payload['user_id'] must be int, got str ('seven')"
    )
    assert len(record.errors) == 1  # not retried: it would fail the same way


@row("Task path that does not exist", "TaskNotRegistered (dead-lettered)")
def test_unknown_task_path(run_worker):
    record = forge("tests.tasks.no_such_task")
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason.startswith("'tests.tasks.no_such_task' cannot be imported: ")
    assert record.errors[0]["exception_class_path"] == (
        "django_tasks_plus.exceptions.TaskNotRegistered"
    )


@row("Task path naming a plain function", "TaskNotRegistered (dead-lettered, never run)")
def test_path_naming_a_plain_function(run_worker, markers):
    record = forge("tests.tasks.not_a_task", args=[])
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason == (
        "'tests.tasks.not_a_task' is a function, not a task; only functions decorated with "
        "@task are run."
    )
    assert not (markers / "not-a-task-ran").exists()


@row("Task path `os.system`", "TaskNotRegistered (dead-lettered, never run)")
def test_path_naming_os_system(run_worker, tmp_path):
    target = tmp_path / "os-system-ran"
    record = forge("os.system", args=[f"touch {target}"])
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason == (
        "'os.system' is a builtin_function_or_method, not a task; only functions decorated "
        "with @task are run."
    )
    assert not target.exists()


OUTSIDE_APPS = (
    "is not imported and is not part of an installed app; a worker runs only tasks "
    "defined in an installed app or in a module imported at startup."
)


@row(
    "Task path into a module that is neither imported nor in an installed app",
    "TaskNotRegistered (dead-lettered, nothing imported)",
)
def test_path_into_a_module_outside_installed_apps(run_worker):
    record = forge("this.x", args=[])
    good = tasks.add.enqueue(20, 22)
    proc = run_worker("--burst", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    assert "Beautiful is better than ugly" not in proc.stdout + proc.stderr  # `this` not run
    good.refresh()
    assert good.status == TaskResultStatus.SUCCESSFUL
    record = dead_lettered(record)
    assert record.dead_letter_reason == f"'this.x' cannot be imported: module 'this' {OUTSIDE_APPS}"


@row(
    "Task path into a module that exits the process on import",
    "TaskNotRegistered (dead-lettered, nothing imported)",
)
def test_path_into_a_module_that_exits_on_import(run_worker, markers):
    record = forge("tests.exits_on_import.boom", args=[])
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason == (
        f"'tests.exits_on_import.boom' cannot be imported: module 'tests.exits_on_import' "
        f"{OUTSIDE_APPS}"
    )
    assert not (markers / "exits-on-import-ran").exists()


@row("Task path naming a missing module of an installed app", "TaskNotRegistered (dead-lettered)")
def test_path_naming_a_missing_module_of_an_installed_app(run_worker):
    record = forge("example.no_such_module.run", args=[])
    run_beside_good_task(run_worker)
    record = dead_lettered(record)
    assert record.dead_letter_reason == (
        "'example.no_such_module.run' cannot be imported: importing 'example.no_such_module' "
        "raised ModuleNotFoundError: No module named 'example.no_such_module'"
    )


@row("Retry policy returning a negative delay", "InvalidRetryPolicy (dead-lettered)")
def test_retry_policy_negative_delay(run_worker):
    result = tasks.fails_with_broken_policy.enqueue()
    run_beside_good_task(run_worker)
    record = dead_lettered(TaskRecord.objects.get(pk=result.id))
    assert re.fullmatch(
        r"retry policy failed: retry policy <function negative_delay at 0x[0-9a-f]+> "
        r"returned a negative delay \(-1 day, 23:59:55\)\.",
        record.dead_letter_reason,
    )
    assert record.errors[0]["exception_class_path"] == "builtins.RuntimeError"


@row("Task returning a value that cannot be stored", "ReturnValueNotSerializable")
def test_return_value_not_serializable(run_worker):
    result = tasks.returns_unstorable.enqueue()
    run_beside_good_task(run_worker)
    record = dead_lettered(TaskRecord.objects.get(pk=result.id))
    assert record.dead_letter_reason == (
        "django_tasks_plus.exceptions.ReturnValueNotSerializable: tests.tasks."
        "returns_unstorable returned a value that cannot be stored: return value is a "
        "builtins.object, " + UNSTORABLE
    )
    assert len(record.errors) == 1  # not retried: it would fail the same way


@row("Task returning text with a lone surrogate", "ReturnValueNotSerializable")
def test_return_value_with_a_lone_surrogate(run_worker):
    result = tasks.returns_lone_surrogate.enqueue()
    run_beside_good_task(run_worker)
    record = dead_lettered(TaskRecord.objects.get(pk=result.id))
    assert record.dead_letter_reason == (
        "django_tasks_plus.exceptions.ReturnValueNotSerializable: tests.tasks."
        "returns_lone_surrogate returned a value that cannot be stored: return value['name'] "
        + LONE_SURROGATE.replace("udcff", "udce9")
    )
    assert len(record.errors) == 1  # not retried: it would fail the same way
    assert record.return_value is None


@pytest.mark.parametrize(
    ("task_name", "exception_path", "message"),
    [
        ("raises_system_exit", "builtins.SystemExit", "3"),
        ("raises_keyboard_interrupt", "builtins.KeyboardInterrupt", "from task code"),
        ("raises_base_exception", "tests.tasks.NotAnException", "from task code"),
    ],
)
@row(
    "Task raising `SystemExit`, `KeyboardInterrupt` or another `BaseException`",
    "a failed attempt",
)
def test_task_raising_base_exceptions(run_worker, task_name, exception_path, message):
    result = getattr(tasks, task_name).enqueue()
    run_beside_good_task(run_worker)
    record = dead_lettered(TaskRecord.objects.get(pk=result.id))
    assert [e["exception_class_path"] for e in record.errors] == [exception_path] * 3
    assert record.dead_letter_reason == (
        f"gave up after 3 attempt(s); last error {exception_path}: {message}"
    )


@row("Task that never returns", "TaskTimeout")
def test_task_that_never_returns(run_worker):
    result = tasks.spins_forever.enqueue()
    run_beside_good_task(run_worker)
    record = dead_lettered(TaskRecord.objects.get(pk=result.id))
    assert record.dead_letter_reason == (
        "gave up after 1 attempt(s); last error django_tasks_plus.exceptions.TaskTimeout: "
        "attempt ran longer than 0.5 s"
    )


# =======================================================================================
# The worker's own command line
# =======================================================================================


@row("Worker started for a queue the backend does not have", "CommandError")
def test_worker_unknown_queue(run_worker):
    kept = tasks.add.enqueue(1, 2)
    proc = run_worker("--queue", "nope")
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        "CommandError: Unknown queue(s) 'nope' for backend 'default'; it serves: default, "
        "emails, other, slow."
    )
    assert TaskRecord.objects.get(pk=kept.id).status == TaskResultStatus.READY


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ("--concurrency", "0"),
            "argument --concurrency: must be a whole number of at least 1, got 0",
        ),
        (("--concurrency", "many"), "argument --concurrency: expected a whole number, got 'many'"),
        (
            ("--poll-interval", "0"),
            "argument --poll-interval: must be a positive number of seconds, got 0.0",
        ),
        (("--backend", "missing"), "Unknown task backend 'missing'; TASKS configures: default."),
    ],
)
@row("Worker started with bad options", "CommandError")
def test_worker_bad_options(run_worker, arguments, message):
    kept = tasks.add.enqueue(1, 2)
    proc = run_worker(*arguments)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert TaskRecord.objects.get(pk=kept.id).status == TaskResultStatus.READY


def _start_refusal(proc: Any) -> str:
    """The one line a worker that cannot start prints, checked to be the only one."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "cannot start" in line]
    return str(line)


@pytest.mark.parametrize("database", ["refused", "never migrated"])
@row(
    "Worker started against a database that refuses connections, or was never migrated",
    "CommandError",
)
def test_worker_database_unusable_at_start(run_worker, tmp_path, database):
    if database == "refused":
        url, cause = REFUSED_DATABASE, "Connection refused"
    else:
        url = f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}"
        cause = "no such table: django_tasks_plus_workerrecord"
    line = _start_refusal(run_worker("--burst", "-v", "0", timeout=60, env={"DATABASE_URL": url}))
    assert line.startswith("CommandError: Worker ")
    assert "its first statement on database 'default' failed (OperationalError: " in line
    assert cause in line
    assert line.endswith("and migrated (manage.py migrate).")


# =======================================================================================
# The catalogue and its docs table agree
# =======================================================================================


def _docs_rows() -> dict[str, str]:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Bad-input catalogue", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] not in ("Bad input", "") and not cells[0].startswith("-"):
            rows[cells[0]] = cells[1].replace("`", "")
    return rows


def test_the_docs_table_lists_every_row():
    documented = _docs_rows()
    assert len(CATALOGUE) >= 25
    for name, entry in CATALOGUE.items():
        assert entry.title in documented, f"{name}: {entry.title!r} is missing from the docs"
        assert documented[entry.title] == entry.error, name
    assert set(documented) == {entry.title for entry in CATALOGUE.values()}
