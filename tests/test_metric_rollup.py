"""Hourly rollups (``db.metrics.roll_up_minutes``): minutes older than
``METRICS["RETENTION_DAYS"]`` move into hourly rows, sums unchanged, once only (a re-run
and a crash between the two halves count nothing twice); the pruner and a real leader
worker do it; a week's chart reads hourly rows, not every minute.

Rows are real rows of the test database (SQLite by default, PostgreSQL with
``DATABASE_URL``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus import metrics
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.db.leadership import current_leader
from django_tasks_plus.db.metrics import add_metrics, prune_hours, roll_up_minutes, sums
from django_tasks_plus.metrics.catalog import ALL_TIME, BUCKET_NAMES, sum_name
from django_tasks_plus.metrics.ranges import RANGES, window
from django_tasks_plus.models import MetricHour, MetricRecord
from django_tasks_plus.worker.pruner import Pruner
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DB, BACKEND = "default", "default"
OVERVIEW = "admin:django_tasks_plus_taskrecord_overview"
NAMES = ("succeeded", "attempt_failed", BUCKET_NAMES["run"][3], sum_name("run"))


def _minute(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def _fill(start: datetime, minutes: int, names=NAMES, every: int = 1) -> None:
    """Rows for every ``every``-th minute from ``start``: two queues, two tasks, each
    name a value that differs per minute, plus the all-time rows."""
    rows = []
    for i in range(0, minutes, every):
        minute = start + timedelta(minutes=i)
        for queue, task in (("default", "tests.tasks.add"), ("emails", "tests.tasks.echo")):
            for n, name in enumerate(names):
                rows.append((BACKEND, minute, queue, task, name, 1 + (i + n) % 7))
    rows += [(BACKEND, ALL_TIME, "default", "tests.tasks.add", name, 1000) for name in names]
    add_metrics(DB, rows)


def _everything(since: datetime) -> list[dict[str, Any]]:
    return sums(DB, BACKEND, since=since)


def _roll_all(before: datetime, limit: int = 100) -> int:
    moved = total = limit
    total = 0
    while moved == limit:
        moved = roll_up_minutes(DB, BACKEND, before, ALL_TIME, limit)
        total += moved
    return total


def test_a_rollup_moves_old_minutes_into_hours_with_the_same_sums():
    now = _minute(timezone.now())
    start = (now - timedelta(days=3)).replace(minute=0)  # a window from a whole hour
    _fill(start, 3 * 24 * 60, every=7)
    before = _everything(start)
    histogram = metrics.histogram(BACKEND, "run", start)
    boundary = now - timedelta(days=1)
    old = MetricRecord.objects.filter(minute__lt=boundary).exclude(minute=ALL_TIME).count()

    assert _roll_all(boundary) == old

    # The old minutes are hourly rows now; the all-time rows and young minutes stay.
    assert not MetricRecord.objects.filter(minute__lt=boundary).exclude(minute=ALL_TIME).exists()
    assert MetricRecord.objects.filter(minute=ALL_TIME).count() == len(NAMES)
    assert MetricRecord.objects.filter(minute__gte=boundary).exists()
    hours = list(MetricHour.objects.values_list("hour", flat=True).distinct())
    assert hours and all(h.minute == h.second == 0 and h < boundary for h in hours)
    assert MetricHour.objects.count() < old  # fewer rows: each hour sums up to 60 minutes
    # Every sum over the whole window, and the histogram, are what they were.
    assert _everything(start) == before
    assert metrics.histogram(BACKEND, "run", start) == histogram
    assert metrics.all_time(BACKEND)[("default", "tests.tasks.add")]["counters"]["succeeded"] == (
        1000
    )
    # One hour's row is the sum of its minutes.
    hour = min(hours)
    expected = sum(
        1 + (i + 0) % 7
        for i in range(0, 3 * 24 * 60, 7)
        if start + timedelta(minutes=i) < hour + timedelta(hours=1)
        and start + timedelta(minutes=i) >= hour
    )
    row = MetricHour.objects.get(hour=hour, queue_name="default", name="succeeded")
    assert row.value == expected


def test_a_rerun_moves_nothing_and_counts_nothing_twice():
    now = _minute(timezone.now())
    _fill(now - timedelta(hours=30), 30 * 60, every=3)
    boundary = now - timedelta(days=1)
    _roll_all(boundary)
    before = _everything(now - timedelta(hours=31))
    hours = sorted(MetricHour.objects.values_list("hour", "queue_name", "name", "value"))

    assert roll_up_minutes(DB, BACKEND, boundary, ALL_TIME, 100) == 0
    assert sorted(MetricHour.objects.values_list("hour", "queue_name", "name", "value")) == hours
    assert _everything(now - timedelta(hours=31)) == before


@pytest.mark.parametrize("fail_on", ["INSERT INTO django_tasks_plus_metrichour", "DELETE FROM"])
def test_a_crash_inside_a_batch_rolls_back_both_halves(fail_on: str):
    """The batch fails after its hours were added (or before): nothing moved, nothing
    added; the next run moves everything exactly once."""
    now = _minute(timezone.now())
    start = (now - timedelta(hours=28)).replace(minute=0)
    _fill(start, 28 * 60, every=5)
    boundary = now - timedelta(days=1)
    before = _everything(start)
    minutes = MetricRecord.objects.count()

    def crash(execute, sql, params, many, context):
        if sql.lstrip().startswith(fail_on) or (fail_on in sql and "metricrecord" in sql):
            raise DatabaseError("the server went away")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(crash), pytest.raises(DatabaseError):
        roll_up_minutes(DB, BACKEND, boundary, ALL_TIME, 10_000)

    assert MetricRecord.objects.count() == minutes
    assert not MetricHour.objects.exists()
    assert _everything(start) == before
    assert _roll_all(boundary) > 0
    assert _everything(start) == before


def test_a_late_flush_into_a_rolled_up_hour_is_added_by_the_next_rollup():
    now = _minute(timezone.now())
    hour_start = (now - timedelta(hours=30)).replace(minute=0)
    _fill(hour_start, 60)
    boundary = now - timedelta(days=1)
    _roll_all(boundary)
    hour = MetricHour.objects.get(hour=hour_start, queue_name="default", name=NAMES[0])

    def seen() -> int:
        found = metrics.totals(
            BACKEND, hour_start, until=hour_start + timedelta(hours=1), names=(NAMES[0],)
        )
        return sum(t.value for t in found if t.queue == "default")

    assert seen() == hour.value
    # A process whose flush failed sends its old minute later: a minute row again,
    # counted beside the hour's row at once.
    add_metrics(DB, [(BACKEND, hour_start, "default", "tests.tasks.add", NAMES[0], 5)])
    assert seen() == hour.value + 5

    assert _roll_all(boundary) == 1
    moved = hour.value + 5
    hour.refresh_from_db()
    assert hour.value == moved == seen()


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's row locks")
def test_a_minute_a_flush_holds_is_passed_over_and_its_late_count_kept():
    """A flush adding to an old minute holds that row while the rollup runs: the rollup
    moves the others at once (no wait, no deadlock) and takes that row, with the flush's
    count, in a later batch."""
    import psycopg

    now = _minute(timezone.now())
    hour_start = (now - timedelta(hours=30)).replace(minute=0)
    _fill(hour_start, 10)
    before = _everything(hour_start)
    params = connection.settings_dict
    flush = psycopg.connect(
        dbname=params["NAME"],
        user=params.get("USER") or None,
        host=params.get("HOST") or None,
        port=params.get("PORT") or None,
    )
    try:
        with flush.cursor() as cursor:  # the upsert's DO UPDATE, uncommitted
            cursor.execute(
                "UPDATE django_tasks_plus_metricrecord SET value = value + 5 "
                "WHERE minute = %s AND queue_name = 'default' AND name = %s",
                [hour_start, NAMES[0]],
            )
            assert cursor.rowcount == 1
        moved = roll_up_minutes(DB, BACKEND, now - timedelta(days=1), ALL_TIME, 1000)
        assert moved == 10 * 2 * len(NAMES) - 1
        flush.commit()
    finally:
        flush.close()
    assert _roll_all(now - timedelta(days=1)) == 1
    after = _everything(hour_start)
    added = [
        (b["total"] - a["total"], b["queue_name"], b["name"])
        for a, b in zip(before, after, strict=True)
        if a != b
    ]
    assert added == [(5, "default", NAMES[0])]
    assert not MetricRecord.objects.exclude(minute=ALL_TIME).exists()


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's row locks")
def test_an_hour_another_session_holds_fails_the_batch_soon_and_loses_nothing():
    """The leader's rollup runs on the session the lease renewal shares: an hour's row
    another session keeps locked fails the batch after ``FLUSH_LOCK_WAIT`` (not that
    session's lock timeout), both halves roll back, and a later rollup moves it all."""
    import time

    from django_tasks_plus.db.metrics import FLUSH_LOCK_WAIT
    from tests.test_locked_rows import _other_session, lock_timeout

    now = _minute(timezone.now())
    hour_start = (now - timedelta(hours=30)).replace(minute=0)
    _fill(hour_start, 60)
    boundary = now - timedelta(days=1)
    _roll_all(boundary)
    add_metrics(DB, [(BACKEND, hour_start, "default", "tests.tasks.add", NAMES[0], 5)])
    hour = MetricHour.objects.get(hour=hour_start, queue_name="default", name=NAMES[0])
    other = _other_session()
    try:
        other.execute("BEGIN")
        other.execute(
            "SELECT 1 FROM django_tasks_plus_metrichour WHERE id = %s FOR UPDATE", [hour.pk]
        )
        with lock_timeout(20.0):  # as the leader's session: a third of a 60 s lease
            began = time.monotonic()
            with pytest.raises(DatabaseError, match="lock timeout"):
                roll_up_minutes(DB, BACKEND, boundary, ALL_TIME, 1000)
            assert time.monotonic() - began < FLUSH_LOCK_WAIT + 1.5
    finally:
        other.close()
    assert MetricRecord.objects.exclude(minute=ALL_TIME).count() == 1  # kept for later
    assert MetricHour.objects.get(pk=hour.pk).value == hour.value  # nothing added yet
    assert _roll_all(boundary) == 1
    assert MetricHour.objects.get(pk=hour.pk).value == hour.value + 5


def test_old_hours_are_deleted_a_batch_at_a_time():
    now = _minute(timezone.now())
    for days in (100, 95, 10):
        _fill(now - timedelta(days=days), 1)
    _roll_all(now - timedelta(days=1))
    assert prune_hours(DB, BACKEND, now - timedelta(days=90), limit=3) == 3
    assert prune_hours(DB, BACKEND, now - timedelta(days=90), limit=100) == 2 * 2 * len(NAMES) - 3
    left = set(MetricHour.objects.values_list("hour", flat=True))
    assert left == {(now - timedelta(days=10)).replace(minute=0)}


def test_the_pruner_rolls_minutes_up_and_deletes_old_hours():
    now = _minute(timezone.now())
    _fill(now - timedelta(days=40), 1)  # past HOURLY_RETENTION_DAYS=30: rolled, then gone
    _fill(now - timedelta(days=2), 90)
    _fill(now - timedelta(hours=2), 60)
    before = _everything(now - timedelta(days=3))
    settings = parse_settings(
        "default",
        {
            "OPTIONS": {
                "RETENTION": {"BATCH_SIZE": 50},
                "METRICS": {"RETENTION_DAYS": 1, "HOURLY_RETENTION_DAYS": 30},
            }
        },
    )
    pruner = Pruner(settings, clock=timezone.now, bound_seconds=30)
    pruner.sweep(budget=60)
    connection.close()  # the pruner bounded this session's statements as a worker's

    assert pruner.deleted["metric minutes rolled up"] == (1 + 90) * 2 * len(NAMES)
    assert pruner.deleted["metric hours"] == 2 * len(NAMES)
    assert not MetricRecord.objects.filter(minute__lt=now - timedelta(days=1)).exclude(
        minute=ALL_TIME
    )
    assert _everything(now - timedelta(days=3)) == before
    assert MetricHour.objects.filter(hour__lt=now - timedelta(days=30)).count() == 0


def test_the_leader_worker_rolls_minutes_up_on_its_own(start_worker):
    now = _minute(timezone.now())
    _fill((now - timedelta(days=3)).replace(minute=0), 120, every=2)
    before = _everything(now - timedelta(days=4))
    start_worker("--worker-id", "rolling-leader", "--visibility-timeout", "3", "--queue", "other")
    wait_for(lambda: current_leader("default", "default") == "rolling-leader", timeout=60)
    wait_for(
        lambda: (
            not MetricRecord.objects.filter(minute__lt=now - timedelta(days=1))
            .exclude(minute=ALL_TIME)
            .exists()
        ),
        timeout=60,
    )
    assert MetricHour.objects.values("hour").distinct().count() == 2
    assert _everything(now - timedelta(days=4)) == before


# -- what a chart reads ----------------------------------------------------------------------


def _rows_scanned(queries: list[dict[str, str]]) -> dict[str, int]:
    """Per metrics table: the rows PostgreSQL's scans of it returned in the captured
    statements (EXPLAIN ANALYZE: actual rows times loops)."""
    scanned = {"django_tasks_plus_metricrecord": 0, "django_tasks_plus_metrichour": 0}
    with connection.cursor() as cursor:
        for query in queries:
            if "metric" not in query["sql"] or "SELECT" not in query["sql"]:
                continue
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query["sql"])
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            for node in _nodes(plan[0]["Plan"]):
                if node.get("Relation Name") in scanned:
                    scanned[node["Relation Name"]] += node["Actual Rows"] * node["Actual Loops"]
    return scanned


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def test_a_week_s_chart_reads_hours_past_the_day_not_every_minute(admin_client):
    """A week of one queue's and task's per-minute counts (10,080 minutes a series):
    rolled up, the week's chart reads at most 7 * 24 + 24 * 60 rows a series, and the
    whole overview at ``?range=7d`` no minute older than a day."""
    now = timezone.now()
    start = _minute(now) - timedelta(days=7, hours=2)
    rows = [
        (BACKEND, start + timedelta(minutes=i), "default", "tests.tasks.add", name, 1)
        for i in range((7 * 24 + 2) * 60)
        for name in ("succeeded", "attempt_failed")
    ]
    add_metrics(DB, rows)
    bars = window(RANGES["7d"], now)

    def read() -> tuple[dict[str, list[int]], CaptureQueriesContext]:
        with CaptureQueriesContext(connection) as captured:
            found = metrics.series(BACKEND, ("succeeded", "attempt_failed"), bars)
        return found, captured

    unrolled, captured = read()
    if connection.vendor == "postgresql":
        everything = _rows_scanned(captured.captured_queries)
        assert everything["django_tasks_plus_metricrecord"] > 2 * 9000  # every minute
    _roll_all(now - timedelta(days=1), limit=5000)
    rolled, captured = read()

    assert rolled == unrolled  # the same bars, from hours past the day
    assert sum(rolled["succeeded"]) == (_minute(now) - bars.start).total_seconds() // 60
    per_series = 7 * 24 + 24 * 60
    assert len(captured.captured_queries) == 1  # one statement: one snapshot of both tables
    sql = captured.captured_queries[0]["sql"]
    assert "metricrecord" in sql and "metrichour" in sql
    in_window = MetricRecord.objects.filter(minute__gte=bars.start).count()
    in_window += MetricHour.objects.filter(hour__gte=bars.start).count()
    assert in_window <= 2 * per_series
    if connection.vendor == "postgresql":
        scanned = _rows_scanned(captured.captured_queries)
        assert sum(scanned.values()) <= 2 * per_series, scanned
        print(f"\nweek chart, rows scanned: before rollup {everything}, after {scanned}")

    # The page: the week's charts, and the throughput table's last hour and day.
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get(reverse(OVERVIEW) + "?range=7d")
    assert page.status_code == 200
    assert f"succeeded {sum(rolled['succeeded'])}, failed" in page.content.decode()
    reads = [q["sql"] for q in captured.captured_queries if "metric" in q["sql"]]
    assert reads and all('"minute" >= ' in sql for sql in reads)  # no read of all minutes
    if connection.vendor == "postgresql":
        scanned = _rows_scanned(captured.captured_queries)
        # Chart: 2 series; table: the last day (2 series) and the last hour.
        assert sum(scanned.values()) <= 2 * per_series + 2 * (24 * 60 + 60), scanned
        print(f"overview ?range=7d, rows scanned after rollup: {scanned}")
