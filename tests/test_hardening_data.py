"""Issue 9, enqueue-side data hardening: unstorable text, nesting depth, hostile deep rows,
a connection lost mid-enqueue, and dedup keys pruned while others enqueue.

Real databases and real ``runtasks`` processes throughout; PostgreSQL-only tests skip on
SQLite. The user-visible cases are rows of the bad-input catalogue (test_bad_input.py):
a task returning a lone surrogate, and rows nested too deeply for the codec or for
Python's JSON parser, each dead-lettered alone by a real worker beside a good task.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_tasks_plus import (
    DatabaseUnavailable,
    InvalidTaskArguments,
    TaskResultStatus,
    prune_dedup_keys,
)
from django_tasks_plus.codec import (
    MAX_DEPTH,
    DecodeError,
    EncodeError,
    dumps,
    from_json,
    loads,
    to_json,
)
from django_tasks_plus.db.postgresql import COPY_THRESHOLD
from django_tasks_plus.models import DedupKey, TaskRecord
from django_tasks_plus.stored import CorruptJson, parse_column
from tests import tasks
from tests.conftest import database_url

if TYPE_CHECKING:
    import psycopg

pytestmark = pytest.mark.django_db(transaction=True)

SURROGATE = os.fsdecode(b"\xff")  # '\udcff'


def nested(depth: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``depth`` lists: ``nested(2) == [[1]]``."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_json(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# =======================================================================================
# Item 3: lone surrogates are refused at enqueue; returning one dead-letters the task
# =======================================================================================


@pytest.mark.parametrize(
    ("args", "kwargs", "path", "field_path"),
    [
        ((SURROGATE,), {}, "args[0]", ("args", 0)),
        ((1, ["ok", ("x", "caf" + SURROGATE)]), {}, "args[1][1][1]", ("args", 1, 1, 1)),
        ((), {"note": {"deep": [{"k": SURROGATE}]}}, "kwargs['note']['deep'][0]['k']", None),
        (({"ok": {SURROGATE + "key": 1}},), {}, "args[0]['ok'] key", ("args", 0, "ok")),
        ((), {SURROGATE: 1}, "kwargs key", ("kwargs",)),
        (({"a", SURROGATE},), {}, "args[0] member", ("args", 0)),
        (({"__dtp__": SURROGATE},), {}, "args[0]['__dtp__']", ("args", 0, "__dtp__")),
    ],
)
def test_enqueue_refuses_lone_surrogates_anywhere(args, kwargs, path, field_path):
    with pytest.raises(InvalidTaskArguments) as info:
        tasks.echo.enqueue(*args, **kwargs)
    assert str(info.value) == (
        f"Cannot enqueue tests.tasks.echo: {path} contains the lone surrogate '\\udcff', "
        "which is not valid Unicode and cannot be stored as UTF-8 (text decoded with "
        "os.fsdecode() or errors='surrogateescape' holds such characters). Pass bytes "
        "instead, or decode with errors='replace'."
    )
    if field_path is not None:
        assert info.value.field_path == field_path
    assert not TaskRecord.objects.exists()


def test_lone_surrogates_are_refused_without_a_payload_limit_too(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": "django_tasks_plus.backend.DatabaseBackend",
            "QUEUES": ["default", "other"],
            "OPTIONS": {"MAX_PAYLOAD_BYTES": None},
        }
    }
    with pytest.raises(InvalidTaskArguments) as info:
        tasks.echo.enqueue("fine", note="caf" + SURROGATE)
    assert info.value.field_path == ("kwargs", "note")
    assert not TaskRecord.objects.exists()


def test_one_lone_surrogate_in_a_bulk_enqueue_writes_nothing():
    calls = [((n, f"name-{n}"), {}) for n in range(COPY_THRESHOLD * 2)]
    calls[77] = ((77, "caf" + SURROGATE), {})
    with pytest.raises(InvalidTaskArguments) as info:
        tasks.echo.enqueue_many(calls)
    assert info.value.field_path == ("args", 1)
    assert not TaskRecord.objects.exists()


def test_other_non_ascii_text_still_round_trips(run_worker):
    # Only lone surrogates are refused: accents, emoji, CJK and U+FFFD are all fine.
    text = "caf\u00e9 \U0001f600 \u4e2d\u6587 \ufffd"
    result = tasks.round_trip.enqueue(text)
    assert run_worker("--burst").returncode == 0
    result.refresh()
    assert result.return_value == {"value": text, "type": "str"}


def test_to_json_refuses_a_lone_surrogate_in_a_return_value():
    with pytest.raises(EncodeError) as info:
        to_json({"files": ["a.txt", os.fsdecode(b"b\xe9.txt")]}, "return value")
    assert info.value.path == "return value['files'][1]"
    assert "lone surrogate '\\udce9'" in str(info.value)
    assert to_json("caf\u00e9", "return value") == "caf\u00e9"


# =======================================================================================
# Item 7: one nesting limit, the same at enqueue and in the worker
# =======================================================================================


def test_enqueue_and_worker_accept_exactly_the_same_depth(run_worker):
    # Before, depth 495 passed enqueue and was dead-lettered by the worker.
    accepted = tasks.nesting_depth.enqueue(nested(MAX_DEPTH))
    accepted_kw = tasks.nesting_depth.enqueue(value=(nested(MAX_DEPTH - 1),))  # a tag too
    for depth in (MAX_DEPTH + 1, 495, 5000):
        with pytest.raises(InvalidTaskArguments) as info:
            tasks.nesting_depth.enqueue(nested(depth))
        assert str(info.value) == (
            "Cannot enqueue tests.tasks.nesting_depth: args[0] is nested too deeply: more "
            f"than {MAX_DEPTH} levels of lists, tuples, dicts and sets (or it contains "
            "itself). Pass flatter data, or store it elsewhere and pass a reference."
        )
        assert info.value.field_path == ("args", 0)
    assert run_worker("--burst").returncode == 0
    accepted.refresh()
    accepted_kw.refresh()
    assert (accepted.status, accepted.return_value) == (TaskResultStatus.SUCCESSFUL, MAX_DEPTH)
    assert accepted_kw.return_value == MAX_DEPTH
    assert TaskRecord.objects.count() == 2


def test_the_codec_decodes_what_it_encodes_at_the_limit_and_refuses_one_more():
    # Lists, a dict, a tuple and a set: MAX_DEPTH levels in all.
    value = nested(MAX_DEPTH - 3, {"k": ({1, 2}, dt.date(2026, 1, 2))})
    assert from_json(loads(dumps(to_json(value, "value")))) == value
    too_deep = loads(deep_json(MAX_DEPTH + 1))
    with pytest.raises(DecodeError) as info:
        from_json(too_deep, "return value")
    assert str(info.value) == (
        f"return value is nested too deeply: more than {MAX_DEPTH} levels of lists and "
        "objects, which no enqueue writes."
    )


def test_parse_column_turns_a_parser_recursion_error_into_corrupt_json():
    parsed = parse_column(deep_json(20_000))
    assert isinstance(parsed, CorruptJson)
    assert parsed.problem == "nested too deeply to parse"
    assert parse_column(deep_json(3)) == [[[1]]]


def test_parse_column_never_raises_on_a_worker_thread():
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(parse_column(deep_json(50_000))))
    thread.start()
    thread.join()
    assert isinstance(outcome[0], CorruptJson)


# =======================================================================================
# Item 9: a connection lost during enqueue is DatabaseUnavailable, on every path
# =======================================================================================


def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def _terminate_while_waiting(pid: int, locker: psycopg.Connection, stop: threading.Event) -> None:
    """Kill backend ``pid`` as soon as it waits for ``locker``'s lock, then free the lock."""
    import psycopg

    with psycopg.connect(database_url(), autocommit=True) as admin:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not stop.is_set():
            waiting = admin.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            if waiting and waiting[0] == "Lock":
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
                break
            time.sleep(0.01)
    locker.rollback()


@pytest.fixture
def lost_connection() -> Iterator[Callable[[], None]]:
    """Arm: the next statement on the test's connection that touches the task table
    waits for a lock, and its backend is terminated while it waits."""
    _postgres_only()
    import psycopg

    threads: list[threading.Thread] = []
    stop = threading.Event()
    locker = psycopg.connect(database_url())

    def arm() -> None:
        connection.ensure_connection()
        pid = connection.connection.info.backend_pid
        locker.execute(f"LOCK TABLE {TaskRecord._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        thread = threading.Thread(target=_terminate_while_waiting, args=(pid, locker, stop))
        thread.start()
        threads.append(thread)

    yield arm
    stop.set()
    for thread in threads:
        thread.join()
    locker.close()
    connection.close()  # the terminated connection: Django opens a new one when asked


@pytest.mark.parametrize("count", [1, 10, COPY_THRESHOLD, 500])
def test_connection_lost_during_enqueue_is_database_unavailable(lost_connection, count):
    # 1: a single INSERT; 10: a multi-row INSERT in a transaction; 64 and 500: COPY.
    lost_connection()
    with pytest.raises(DatabaseUnavailable) as info:
        tasks.add.enqueue_many([((n, n), {}) for n in range(count)])
    assert str(info.value).startswith(
        "Cannot enqueue tests.tasks.add: database 'default' is unavailable ("
    )
    assert info.value.retryable
    assert type(info.value.__cause__).__module__ == "django.db.utils"
    connection.close()
    assert not TaskRecord.objects.exists()


def test_session_ended_by_the_server_is_database_unavailable_whatever_its_error_class():
    # PostgreSQL reports this one as an InternalError (SQLSTATE 25P03), not as an
    # OperationalError; the connection is gone all the same.
    _postgres_only()
    with pytest.raises(DatabaseUnavailable) as info, transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '50ms'")
        time.sleep(0.5)
        tasks.add.enqueue(1, 2)
    assert "idle-in-transaction timeout" in str(info.value)
    connection.close()
    assert not TaskRecord.objects.exists()


# =======================================================================================
# Item 10: dedup keys pruned while others enqueue
# =======================================================================================


def test_prune_deletes_only_lapsed_keys():
    now = timezone.now()
    held_ttl = tasks.add.using(dedup_key="ttl:held", dedup_ttl=3600).enqueue(1, 1)
    lapsed_ttl = tasks.add.using(dedup_key="ttl:lapsed", dedup_ttl=1).enqueue(1, 1)
    pending = tasks.add.using(dedup_key="fin:pending", dedup_until="finished").enqueue(1, 1)
    finished = tasks.add.using(dedup_key="fin:done", dedup_until="finished").enqueue(2, 2)
    TaskRecord.objects.filter(pk=finished.id).update(status=TaskResultStatus.SUCCESSFUL)
    gone = tasks.add.using(dedup_key="fin:gone", dedup_until="finished").enqueue(3, 3)
    TaskRecord.objects.filter(pk=gone.id).delete()

    assert prune_dedup_keys(now=now + dt.timedelta(seconds=5)) == 3
    assert set(DedupKey.objects.values_list("key", flat=True)) == {"ttl:held", "fin:pending"}
    assert prune_dedup_keys(now=now + dt.timedelta(seconds=5)) == 0
    # The held keys still hold; the pruned ones are free again.
    assert tasks.add.using(dedup_key="ttl:held").enqueue(9, 9).id == held_ttl.id
    pending_key = tasks.add.using(dedup_key="fin:pending", dedup_until="finished")
    assert pending_key.enqueue(9, 9).id == pending.id
    assert tasks.add.using(dedup_key="ttl:lapsed").enqueue(9, 9).id != lapsed_ttl.id
    assert prune_dedup_keys("default") == 0


def test_prune_reads_keys_in_pages_and_keeps_other_backends_keys():
    now = timezone.now()
    DedupKey.objects.bulk_create(
        DedupKey(
            backend_name="default" if n % 10 else "elsewhere",
            key=f"bulk:{n}",
            task_ids=[],
            expires_at=now - dt.timedelta(seconds=1),
            created_at=now - dt.timedelta(hours=1),
        )
        for n in range(1000)
    )
    assert prune_dedup_keys(now=now) == 900
    assert DedupKey.objects.filter(backend_name="elsewhere").count() == 100


def test_enqueue_while_keys_are_pruned_never_fails_and_keeps_held_keys():
    # Before: the docs' cleanup deleted a lapsed key between take_key's INSERT and its
    # read of the holder, and enqueue() raised DedupKey.DoesNotExist.
    _postgres_only()
    stop = threading.Event()
    errors: list[BaseException] = []
    admitted: dict[str, set[str]] = {}
    lock = threading.Lock()

    def enqueue(worker: int) -> None:
        try:
            for n in range(150):
                # Short-lived keys, lapsing and pruned all the time...
                tasks.add.using(dedup_key=f"short:{n % 3}", dedup_ttl=0.005).enqueue(worker, n)
                # ...and keys that hold for the whole test: one task each, ever.
                for key, options in (
                    (f"ttl:{n % 5}", {"dedup_ttl": 3600}),
                    (f"fin:{n % 5}", {"dedup_until": "finished"}),
                ):
                    result = tasks.add.using(dedup_key=key, **options).enqueue(worker, n)
                    with lock:
                        admitted.setdefault(key, set()).add(result.id)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def prune() -> None:
        try:
            while not stop.is_set():
                prune_dedup_keys()
                # The cleanup the docs used to show must be safe too.
                DedupKey.objects.filter(
                    until_finished=False, expires_at__lt=timezone.now()
                ).delete()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    pruner = threading.Thread(target=prune)
    pruner.start()
    workers = [threading.Thread(target=enqueue, args=(w,)) for w in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    pruner.join()

    assert errors == []
    assert all(len(ids) == 1 for ids in admitted.values()), admitted
    for key in admitted:
        assert TaskRecord.objects.filter(dedup_key=key).count() == 1
    assert TaskRecord.objects.filter(dedup_key__startswith="short:").count() > 3
