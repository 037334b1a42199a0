"""``db/copytext.py``: task rows as COPY text, and what a bulk enqueue stores through it.

The pure part checks every kind of value a row holds and the characters COPY's text format
reads specially; the database part enqueues hostile text through COPY (64 calls or more)
and through single INSERTs and requires the same stored values.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_tasks_plus.compat import task_backends
from django_tasks_plus.db import dialect_for
from django_tasks_plus.db.copytext import CHUNK_LINES, NULL, RowsUnwritable, copy_text, field
from django_tasks_plus.db.postgresql import COPY_THRESHOLD
from django_tasks_plus.db.values import JsonText
from django_tasks_plus.envelope import build, rows
from django_tasks_plus.models import TaskRecord
from tests import tasks

# Text that COPY's text format would misread if written as is.
HOSTILE = ["back\\slash", "tab\there", "new\nline", "cr\rhere", "\\.", "\\N", "\\\\t", ""]
HOSTILE += ["caf\u00e9 \U0001f600 \u4e2d\u6587", "end\\"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, NULL),
        (True, "t"),
        (False, "f"),
        (0, "0"),
        (-7, "-7"),
        (2**62, str(2**62)),
        ("plain", "plain"),
        ("", ""),
        ("a\\b\tc\nd\re", "a\\\\b\\tc\\nd\\re"),
        ("\\N", "\\\\N"),
        (JsonText('{"k": "a\\"b"}'), '{"k": "a\\\\"b"}'),
        (
            dt.datetime(2026, 12, 4, 19, 0, 0, 123456, tzinfo=dt.UTC),
            "2026-12-04T19:00:00.123456+00:00",
        ),
        (
            dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
            "2026-01-02T03:04:05+05:30",
        ),
        (dt.datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    ],
)
def test_each_kind_of_row_value_is_written_as_copy_reads_it(value: Any, text: str):
    assert field(value) == text
    assert type(field(value)) is str


ODD = ["nul\x00inside", 1.5, Decimal("1"), b"bytes", [1]]


@pytest.mark.parametrize("odd", ODD)
def test_a_shared_value_it_does_not_write_sends_the_whole_batch_back_to_the_driver(odd: Any):
    batch = [{"id": str(n), "value": odd} for n in range(5)]
    assert copy_text(batch) is None


@pytest.mark.parametrize("odd", ODD)
def test_a_row_value_it_does_not_write_ends_the_text_at_that_rows_chunk(odd: Any):
    batch = [{"id": str(n), "value": "fine"} for n in range(CHUNK_LINES + 5)]
    batch[CHUNK_LINES + 3] = {"id": "odd", "value": odd}
    columns, chunks = copy_text(batch)  # type: ignore[misc]
    assert columns == ["id", "value"]
    first = next(chunks)  # the chunk before the odd row's is rendered as usual
    assert first.splitlines() == [f"{n}\tfine" for n in range(CHUNK_LINES)]
    with pytest.raises(RowsUnwritable) as raised:
        next(chunks)
    assert raised.value.start == CHUNK_LINES  # the first row not rendered: the driver's


def test_chunks_are_rendered_as_they_are_taken():
    batch = [{"id": f"{n}", "same": "x"} for n in range(CHUNK_LINES + 1)]
    _, chunks = copy_text(batch)  # type: ignore[misc]
    batch[CHUNK_LINES]["id"] = "changed"  # after copy_text returned, before the 2nd chunk
    assert list(chunks)[1] == "changed\tx\n"


def test_shared_columns_are_written_once_after_each_rows_own():
    when = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    queue = "de\tfault"
    batch = [
        {"queue": queue, "id": f"id-{n}", "at": when, "args": JsonText(f"[{n}]"), "flag": n == 1}
        for n in range(3)
    ]
    # The booleans are the same two objects, but not the same in every row: per row.
    columns, chunks = copy_text(batch)  # type: ignore[misc]
    assert columns == ["id", "args", "flag", "queue", "at"]
    assert "".join(chunks) == (
        "id-0\t[0]\tf\tde\\tfault\t2026-12-04T00:00:00+00:00\n"
        "id-1\t[1]\tt\tde\\tfault\t2026-12-04T00:00:00+00:00\n"
        "id-2\t[2]\tf\tde\\tfault\t2026-12-04T00:00:00+00:00\n"
    )


def test_long_batches_come_in_chunks_of_whole_lines():
    batch = [{"id": f"{n}", "same": "x"} for n in range(CHUNK_LINES * 2 + 1)]
    columns, rendered = copy_text(batch)  # type: ignore[misc]
    chunks = list(rendered)
    assert columns == ["id", "same"]
    assert [chunk.count("\n") for chunk in chunks] == [CHUNK_LINES, CHUNK_LINES, 1]
    assert all(chunk.endswith("\n") for chunk in chunks)
    assert "".join(chunks).splitlines() == [f"{n}\tx" for n in range(CHUNK_LINES * 2 + 1)]


# -- through the database ---------------------------------------------------------------

STORED = ("task_path", "queue_name", "priority", "status", "args", "kwargs", "metadata")
STORED += ("breaker_key", "dedup_key", "ordering_key", "attempt", "worker_ids", "errors")
STORED += ("dead_letter_reason", "ordering_blocked", "cancel_requested", "requested_run_after")


def _stored(ids: list[str]) -> list[tuple[Any, ...]]:
    by_id = {str(row["id"]): row for row in TaskRecord.objects.filter(pk__in=ids).values()}
    return [tuple(by_id[task_id][name] for name in STORED) for task_id in ids]


@pytest.mark.django_db(transaction=True)
def test_hostile_text_stores_the_same_through_copy_as_through_insert():
    calls = [
        ((text, n), {"note": text, "nested": {text: [text]}})
        for n in range(COPY_THRESHOLD + 6)
        for text in [HOSTILE[n % len(HOSTILE)]]
    ]
    backend = task_backends["default"]
    metadata = {"origin": "\\ \t \n \r \\N \\.", "cafe": ["\\", "caf\u00e9"]}
    bulk = backend.enqueue_many(tasks.echo, calls, metadata=metadata)
    singles = [backend.enqueue_many(tasks.echo, [call], metadata=metadata)[0] for call in calls]
    assert _stored([r.id for r in bulk]) == _stored([r.id for r in singles])
    assert [row[4:6] for row in _stored([r.id for r in bulk])][: len(HOSTILE)] == [
        ([text, n], {"note": text, "nested": {text: [text]}}) for n, text in enumerate(HOSTILE)
    ]
    enqueued = TaskRecord.objects.filter(pk__in=[r.id for r in bulk]).values_list(
        "enqueued_at", "run_after"
    )
    assert {times for times in enqueued} == {(bulk[0].enqueued_at, bulk[0].enqueued_at)}


@pytest.mark.django_db(transaction=True)
def test_a_batch_with_a_value_copytext_does_not_write_is_copied_by_the_driver():
    class Moment(dt.datetime):
        """A datetime subclass (as some time libraries' are): psycopg adapts it."""

    backend = task_backends["default"]
    envelope = build(
        backend.settings,
        tasks.add,
        [((n, n), {}) for n in range(COPY_THRESHOLD)],
        now=timezone.now(),
    )
    values = rows(backend.settings, envelope)
    later = Moment(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    values = [{**row, "run_after": later} for row in values]
    assert copy_text(values) is None
    dialect_for(connection).insert_tasks(connection, values, notify=False)
    stored = TaskRecord.objects.filter(pk__in=[row["id"] for row in values])
    assert stored.count() == COPY_THRESHOLD
    assert set(stored.values_list("run_after", flat=True)) == {later}


@pytest.mark.django_db(transaction=True)
def test_rows_from_the_first_odd_value_on_are_copied_by_the_driver_in_the_same_copy():
    class Moment(dt.datetime):
        """A datetime subclass (as some time libraries' are): psycopg adapts it."""

    backend = task_backends["default"]
    count = CHUNK_LINES + 10
    envelope = build(
        backend.settings, tasks.add, [((n, n), {}) for n in range(count)], now=timezone.now()
    )
    values = rows(backend.settings, envelope)
    later = Moment(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    odd = CHUNK_LINES + 4
    values[odd] = {**values[odd], "run_after": later}
    dialect_for(connection).insert_tasks(connection, values, notify=False)
    stored = {
        str(task_id): run_after
        for task_id, run_after in TaskRecord.objects.filter(
            pk__in=[row["id"] for row in values]
        ).values_list("id", "run_after")
    }
    assert len(stored) == count
    assert stored[values[odd]["id"]] == later
    assert {stored[row["id"]] for i, row in enumerate(values) if i != odd} == {envelope.enqueued_at}
    assert not TaskRecord.objects.filter(pk__in=list(stored), sequence=None).exists()


def _statement_state() -> str:
    """What the driver says the session is doing: ACTIVE while a statement (the COPY)
    is still running on the server."""
    if connection.vendor != "postgresql":
        return "n/a"
    return connection.connection.info.transaction_status.name


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("count", [1, COPY_THRESHOLD])
def test_meanwhile_runs_once_on_every_insert_path_and_its_error_stores_nothing(count: int):
    backend = task_backends["default"]

    def values() -> list[dict[str, Any]]:
        calls = [((n, n), {}) for n in range(count)]
        return rows(backend.settings, build(backend.settings, tasks.add, calls, now=timezone.now()))

    first = values()
    states: list[str] = []
    dialect_for(connection).insert_tasks(
        connection, first, meanwhile=lambda: states.append(_statement_state())
    )
    assert TaskRecord.objects.filter(pk__in=[row["id"] for row in first]).count() == count
    if connection.vendor == "postgresql" and count >= COPY_THRESHOLD:
        assert states == ["ACTIVE"]  # the rows sent, the COPY not yet ended: the overlap
    else:
        assert len(states) == 1

    class Refused(Exception):
        pass

    def refuse() -> None:
        raise Refused

    second = values()
    with pytest.raises(Refused), transaction.atomic():
        dialect_for(connection).insert_tasks(connection, second, meanwhile=refuse)
    assert not TaskRecord.objects.filter(pk__in=[row["id"] for row in second]).exists()
