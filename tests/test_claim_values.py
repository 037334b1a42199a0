"""A claimed row's values are those Django reads from the same row, whatever loaders the
claim's cursor uses to read them faster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from django_tasks_plus.models import TaskRecord
from tests import tasks
from tests.conftest import claim_one

pytestmark = pytest.mark.django_db


def _stored(task_id: str) -> TaskRecord:
    return TaskRecord.objects.get(id=task_id)


def test_claimed_timestamps_are_djangos_values():
    due = datetime(2020, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)
    result = tasks.add.using(run_after=due).enqueue(1, 2)
    claimed = claim_one("w-values", visibility_timeout=60)
    stored = _stored(result.id)
    for name in ("enqueued_at", "run_after", "claimed_at"):
        got = getattr(claimed, name)
        expected = stored.last_attempted_at if name == "claimed_at" else getattr(stored, name)
        assert got == expected, name
        assert got.tzinfo is UTC, name  # the same time zone object Django stamps
    assert claimed.run_after == due
    assert claimed.started_at == stored.started_at


def test_a_session_in_another_time_zone_still_reads_the_right_instants():
    """With the session's time zone changed (a pooler or a stray ``SET`` may leave it so),
    the claim still reads the instants stored (Django's own loader would shift them by
    the zone's offset, as it assumes the UTC session it sets up)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: the session time zone")
    due = datetime(2021, 6, 7, 8, 9, 10, tzinfo=UTC) + timedelta(microseconds=5)
    result = tasks.add.using(run_after=due).enqueue(1, 2)
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'Asia/Kolkata'")
    try:
        claimed = claim_one("w-values", visibility_timeout=60)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
    stored = _stored(result.id)
    assert claimed.id == result.id
    assert claimed.run_after == stored.run_after == due
    assert claimed.enqueued_at == stored.enqueued_at
