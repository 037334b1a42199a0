"""The enqueue INSERT's shortcut past Django's field machinery gives Django's values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection

from django_tasks_plus.db import base
from django_tasks_plus.db.values import JsonText
from django_tasks_plus.models import TaskRecord

pytestmark = pytest.mark.django_db

SAMPLES = {
    "text": ["", "READY", "é ünï", "x" * 300],
    "bool": [True, False],
    "int": [0, 1, -5, 2**31 - 1],
    "datetime": [
        datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-7))),
    ],
    "uuid": [str(uuid.uuid4())],
}


def _kind(name: str) -> str:
    field = base._fields()[name]
    internal = field.get_internal_type()
    if internal in ("CharField", "TextField"):
        return "text"
    if internal == "BooleanField":
        return "bool"
    if internal == "UUIDField":
        return "uuid"
    if internal == "DateTimeField":
        return "datetime"
    return "int"


def test_every_shortcut_column_gets_what_django_would_send():
    shortcuts = base._shortcuts(connection)
    # The columns an enqueue fills with plain values take the shortcut.
    assert {"task_path", "queue_name", "status", "ordering_blocked"} <= set(shortcuts)
    # JSON is encoded once by the codec and never reaches prep's field machinery.
    assert not {"args", "kwargs", "metadata"} & set(shortcuts)
    if connection.vendor == "postgresql":
        # There the driver takes dates, UUIDs as text and psycopg's typed integers too.
        assert {"priority", "id", "run_after", "enqueued_at", "attempt"} <= set(shortcuts)
    else:
        assert not {"priority", "id", "run_after", "enqueued_at"} & set(shortcuts)
    fields = base._fields()
    for name in shortcuts:
        kind = _kind(name)
        for value in [None, *SAMPLES[kind]]:
            expected = fields[name].get_db_prep_save(value, connection)
            got = base.prep(name, value, connection)
            if kind == "uuid" and value is not None:
                # Text PostgreSQL reads into its uuid type: the value Django would send.
                assert uuid.UUID(got) == expected, (name, value)
            else:
                assert got == expected and type(got) is type(expected), (name, value)


def test_other_values_still_take_djangos_path():
    # A lazy string and a str subclass are converted by Django, not passed through.
    from django.utils.functional import lazystr

    assert type(base.prep("queue_name", lazystr("default"), connection)) is str
    assert base.prep("status", 1, connection) == "1"  # an int in a text column
    # A naive datetime gets Django's treatment (a warning and the current time zone),
    # a UUID object and a bool in an integer column too.
    naive = datetime(2026, 1, 2, 3, 4, 5)
    with pytest.warns(RuntimeWarning, match="naive datetime"):
        got = base.prep("run_after", naive, connection)
    with pytest.warns(RuntimeWarning, match="naive datetime"):
        assert got == base._fields()["run_after"].get_db_prep_save(naive, connection)
    task_id = uuid.uuid4()
    assert base.prep("id", task_id, connection) == base._fields()["id"].get_db_prep_save(
        task_id, connection
    )
    assert base.prep("priority", True, connection) == 1


def test_the_shortcut_values_round_trip_through_the_insert():
    """What the shortcuts send is stored as what the model reads back."""
    from django_tasks_plus.db import dialect_for

    when = datetime(2026, 5, 6, 7, 8, 9, 123000, tzinfo=timezone(timedelta(hours=2)))
    row = _row(when)
    task_id = row["id"]
    dialect_for(connection).insert_tasks(connection, [row], notify=False)
    stored = TaskRecord.objects.get(id=task_id)
    assert str(stored.id) == task_id
    assert stored.priority == -7 and stored.attempt == 0
    assert stored.run_after == when and stored.enqueued_at == when
    assert stored.args == [1, 2] and stored.ordering_blocked is False
    # The constants a single row writes as literals are stored as Django would store them.
    assert stored.requested_run_after is None and stored.ordering_key is None
    assert stored.worker_ids == [] and stored.errors == [] and stored.metadata == {}
    assert stored.kwargs == {} and stored.dead_letter_reason == ""
    assert stored.cancel_requested is False and stored.breaker_key is None


def test_a_single_rows_constants_are_literals_and_the_rest_parameters():
    """Constants (NULL, booleans, '', empty JSON) go into the text: fewer values for the
    driver to adapt per enqueue; everything else stays a parameter."""
    row = _row(datetime(2026, 1, 1, tzinfo=UTC))
    row["kwargs"] = JsonText('{"user": "O\'Brien; DROP TABLE x"}')
    row["dead_letter_reason"] = "x"
    [(text, params)] = base.insert_statements(
        [row], connection, json_placeholder="%s", sequence_sql=None
    )
    assert text.count("%s") == len(params)
    assert "NULL" in text and "FALSE" in text and "'[]'" in text and "'{}'" in text
    assert row["id"] in params or uuid.UUID(row["id"]).hex in params
    assert str(row["kwargs"]) in params and "x" in params  # non-empty values: parameters
    assert len(params) < len(row) / 2 + 3
    # Two rows: every value is a parameter (one text per row count, not per mix).
    [(text, params)] = base.insert_statements(
        [row, _row(datetime(2026, 1, 1, tzinfo=UTC))],
        connection,
        json_placeholder="%s",
        sequence_sql=None,
    )
    assert "NULL" not in text and len(params) == 2 * len(row)


def test_several_rows_with_mixed_constants_store_each_value():
    from django_tasks_plus.db import dialect_for

    first, second = _row(datetime(2026, 1, 1, tzinfo=UTC)), _row(datetime(2026, 1, 2, tzinfo=UTC))
    second.update(
        ordering_key="k", ordering_blocked=True, breaker_key="b", metadata=JsonText('{"a": 1}')
    )
    dialect_for(connection).insert_tasks(connection, [first, second], notify=False)
    one, two = TaskRecord.objects.get(id=first["id"]), TaskRecord.objects.get(id=second["id"])
    assert (one.ordering_key, one.ordering_blocked, one.breaker_key, one.metadata) == (
        None,
        False,
        None,
        {},
    )
    assert (two.ordering_key, two.ordering_blocked, two.breaker_key, two.metadata) == (
        "k",
        True,
        "b",
        {"a": 1},
    )


def test_execute_wrappers_see_the_enqueue_statement():
    """Execute wrappers (APM, query counters) see the enqueue's INSERT with its values,
    whatever binding the dialect uses for it."""
    from tests.tasks import add

    seen: list[tuple[str, Any]] = []

    def spy(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    assert not connection.queries_logged  # the fast path, not the logging one
    with connection.execute_wrapper(spy):
        result = add.enqueue(1, 2)
    inserts = [(sql, params) for sql, params in seen if "INSERT INTO" in sql]
    assert len(inserts) == 1 and "django_tasks_plus_taskrecord" in inserts[0][0]
    sent = [str(value) for value in inserts[0][1]]
    assert result.id in sent or uuid.UUID(result.id).hex in sent  # SQLite: hex digits


def test_the_query_log_shows_the_enqueue_with_its_values():
    """``assertNumQueries``, ``DEBUG`` and debug toolbars read the log: the INSERT is
    there, readable, with its values rather than placeholders."""
    from django.test.utils import CaptureQueriesContext

    from tests.tasks import add

    with CaptureQueriesContext(connection) as queries:
        result = add.enqueue(1, 2)
    logged = [query["sql"] for query in queries.captured_queries if "INSERT INTO" in query["sql"]]
    assert len(logged) == 1
    # SQLite stores a UUID as its hex digits.
    assert result.id in logged[0] or uuid.UUID(result.id).hex in logged[0]
    assert "$1" not in logged[0]


def test_a_failing_insert_raises_djangos_error_type():
    """The statement's driver errors reach the caller as ``django.db`` exceptions."""
    from django.db import IntegrityError

    from django_tasks_plus.db import dialect_for

    row = _row(datetime.now(UTC))
    dialect_for(connection).insert_tasks(connection, [row], notify=False)
    with pytest.raises(IntegrityError):
        dialect_for(connection).insert_tasks(connection, [row], notify=False)


def _row(when: datetime) -> dict[str, Any]:
    """A task row as the envelope builds it, every column the enqueue sends."""
    return {
        "id": str(uuid.uuid4()),
        "task_path": "example.tasks.add",
        "backend_name": "default",
        "queue_name": "default",
        "priority": -7,
        "status": "READY",
        "run_after": when,
        "requested_run_after": None,
        "attempt": 0,
        "worker_ids": JsonText("[]"),
        "errors": JsonText("[]"),
        "enqueued_at": when,
        "dead_letter_reason": "",
        "ordering_key": None,
        "ordering_blocked": False,
        "dedup_key": None,
        "cancel_requested": False,
        "metadata": JsonText("{}"),
        "args": JsonText("[1, 2]"),
        "kwargs": JsonText("{}"),
        "breaker_key": None,
    }


def test_with_prepare_threshold_the_insert_is_prepared_once():
    """The INSERT's text is the same on every call of a shape, so a project that sets
    ``OPTIONS["prepare_threshold"]`` gets it prepared: one server-side statement, reused."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: prepared statements")
    from tests.tasks import add

    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold
    raw.prepare_threshold = 0  # what OPTIONS["prepare_threshold"] = 0 sets
    try:
        for n in range(3):
            add.enqueue(n, n)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements "
                "WHERE statement LIKE %s AND statement LIKE %s",
                ["%INSERT INTO%", "%django_tasks_plus_taskrecord%"],
            )
            (prepared,) = cursor.fetchone()
    finally:
        raw.prepare_threshold = before
    assert prepared == 1
