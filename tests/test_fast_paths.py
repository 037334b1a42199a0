"""The drain's cheaper forms give what the plain forms gave.

Each per-task step the worker takes thousands of times a second was made cheaper in a
way that could drift from its plain form: the claim's order (two sorts by C key
getters), the values a claim's rows repeat kept once, the outcome batch's JSON (msgspec,
falling back to the standard encoder) and the check for a coroutine function (cached
per function). These pin them to the plain
forms, including the inputs where a fast form refuses and the plain one must take over.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_tasks_plus.db.base import CLAIM_COLUMNS, claimed_from_row, sort_claimed
from django_tasks_plus.db.postgresql import _RECORDS, _records
from django_tasks_plus.lifecycle import ClaimedTask, Transition
from django_tasks_plus.worker.execution import _is_async

START = datetime(2026, 1, 1, tzinfo=UTC)


def _claim_row(**values: Any) -> list[Any]:
    """A claim's RETURNING row (``CLAIM_COLUMNS``) of a first attempt, ``values`` over it."""
    row: dict[str, Any] = dict.fromkeys(CLAIM_COLUMNS)
    row.update(
        task_path="tests.tasks.add",
        queue_name="default",
        priority=0,
        args="[]",
        kwargs="{}",
        attempt=1,
        worker_ids="[]",
        errors="[]",
        enqueued_at=START,
        run_after=START,
        lease_token="lease",
        backend_name="default",
        metadata="{}",
    )
    row.update(values)
    return [row[name] for name in CLAIM_COLUMNS]


def _claimed(task_id: str, priority: int, due_minute: int) -> ClaimedTask:
    row = _claim_row(id=task_id, priority=priority, run_after=START + timedelta(minutes=due_minute))
    return claimed_from_row(row, START)


@given(
    st.lists(
        st.tuples(st.integers(-100, 100), st.integers(0, 5), st.uuids().map(str)),
        max_size=40,
    )
)
def test_claimed_tasks_are_ordered_by_priority_then_due_time_then_id(
    keys: list[tuple[int, int, str]],
) -> None:
    claimed = [_claimed(task_id, priority, due) for priority, due, task_id in keys]
    random.shuffle(claimed)
    expected = sorted(claimed, key=lambda task: (-task.priority, task.run_after, task.id))
    assert sort_claimed(list(claimed)) == expected


def test_an_id_printed_by_the_database_is_kept_and_any_other_is_made_canonical() -> None:
    task_id = uuid.uuid4()
    row: dict[str, Any] = dict.fromkeys(CLAIM_COLUMNS, None)
    row.update(priority=0, attempt=1, args="[]", kwargs="{}", metadata="{}")
    for raw in (task_id.hex, task_id, str(task_id).upper()):
        row["id"] = raw
        assert claimed_from_row([row[name] for name in CLAIM_COLUMNS]).id == str(task_id)
    row["id"] = str(task_id)
    kept = claimed_from_row([row[name] for name in CLAIM_COLUMNS], id_is_canonical=True)
    assert kept.id == str(task_id)


def test_the_values_a_claims_rows_repeat_are_kept_once_and_equal_the_rows_own() -> None:
    """With a claim's ``shared``, the rows' task path, queue, lease token, backend,
    claim time and a first attempt's start time are one object each (a worker holds up
    to a thousand claimed tasks); every field still equals what the row held."""
    claimed_at = datetime(2026, 1, 1, tzinfo=UTC)

    def row(index: int) -> list[Any]:
        return _claim_row(
            id=str(uuid.uuid4()),
            task_path="".join(["tests.tasks.", "add"]),  # a new string object per row
            queue_name="".join(["def", "ault"]),
            args=f"[{index}]",
            # a first attempt's start is the claim's time; a retry's is its own
            started_at=claimed_at.replace() if index else START - timedelta(days=1),
            lease_token="".join(["lea", "se"]),
            backend_name="".join(["defa", "ult"]),
        )

    rows = [row(index) for index in range(3)]
    shared = {}.setdefault
    kept = [claimed_from_row(r, claimed_at.replace(), shared=shared) for r in rows]
    plain = [claimed_from_row(r, claimed_at.replace()) for r in rows]
    assert kept == plain
    for name in ("task_path", "queue_name", "lease_token", "backend_name", "claimed_at"):
        assert len({id(getattr(task, name)) for task in kept}) == 1, name
        assert len({id(getattr(task, name)) for task in plain}) == 3, name
    assert kept[1].started_at is kept[2].started_at is kept[0].claimed_at
    assert kept[0].started_at == START - timedelta(days=1)


def _completion(task_id: str, values: dict[str, Any]) -> tuple[ClaimedTask, Transition]:
    return _claimed(task_id, 0, 0), Transition(status="SUCCESSFUL", values=values)


def _plain(names: tuple[str, ...], members: list[tuple[ClaimedTask, Transition]]) -> str:
    """What the standard encoder alone writes for the same records."""
    records = []
    for claimed, outcome in members:
        record = {"id": claimed.id, "lease_token": claimed.lease_token, "status": "SUCCESSFUL"}
        for name in names:
            value = outcome.values[name]
            if isinstance(value, datetime):
                value = (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
            record[name] = value
        records.append(record)
    return _RECORDS.encode(records)


RETURN_VALUES: list[Any] = [
    None,
    2,
    2**70,  # beyond 64 bits: the codec stores any int
    -(2**70),
    0.1,
    1e300,
    "naïve text, ✓, \u0000 escaped",
    {"nested": [1, {"deep": [True, False, None]}]},
    [[[[[[[[[[[]]]]]]]]]]],
]


@pytest.mark.parametrize("return_value", RETURN_VALUES, ids=repr)
def test_outcome_records_hold_what_the_standard_encoder_would_write(return_value: Any) -> None:
    names = ("finished_at", "return_value", "worker_ids")
    values = {
        "finished_at": START + timedelta(microseconds=123_456),
        "return_value": return_value,
        "worker_ids": ["w-1"],
    }
    members = [_completion(str(uuid.uuid4()), values) for _ in range(3)]
    written = _records(names, members, "UTC")
    assert json.loads(written) == json.loads(_plain(names, members))


def test_values_msgspec_refuses_are_written_by_the_standard_encoder() -> None:
    class Label(str):
        """A str subclass: msgspec refuses it, the standard encoder writes the text."""

    names = ("return_value",)
    members = [_completion(str(uuid.uuid4()), {"return_value": Label("kept")})]
    assert json.loads(_records(names, members, "UTC"))[0]["return_value"] == "kept"

    # A lone surrogate: msgspec cannot encode it; the standard encoder's text is what was
    # always sent (and PostgreSQL's driver then refuses it, as before).
    members = [_completion(str(uuid.uuid4()), {"return_value": "\ud800"})]
    assert _records(names, members, "UTC") == _plain(names, members)


def test_a_coroutine_function_is_told_apart_and_so_is_an_unhashable_callable() -> None:
    def plain() -> None: ...

    async def coroutine() -> None: ...

    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self) -> None: ...

    assert _is_async(plain) is False
    assert _is_async(coroutine) is True
    assert _is_async(coroutine) is True  # the second answer: from the cache
    assert _is_async(Unhashable()) is False
