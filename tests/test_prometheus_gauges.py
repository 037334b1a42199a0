"""The gauges an operator alerts on, scraped from the real endpoint: each circuit's state,
held tasks and opening time (after a real worker held tasks behind an open circuit), the
per-breaker counts past the cap on named circuits, and the oldest age of a READY task
that could run now (not one blocked by its ordering key, held, retrying or scheduled)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_tasks_plus import metrics
from django_tasks_plus.circuits import breaker_states, force_close, force_open
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.metrics.breakers import breaker_gauges
from django_tasks_plus.models import BreakerRecord, TaskRecord
from tests import tasks
from tests.conftest import assert_index_migration_runs_concurrently

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/tasks/metrics/"
P = "django_tasks_plus_"


def _scrape() -> list[Any]:
    """Every sample of a staff user's scrape of the real endpoint."""
    user = User.objects.create_user(f"ops{User.objects.count()}", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_taskrecord"))
    client = Client()
    client.force_login(user)
    response = client.get(URL)
    assert response.status_code == 200
    text = response.content.decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _values(samples: list[Any], name: str, **labels: str) -> list[float]:
    return [
        s.value
        for s in samples
        if s.name == P + name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def _one(samples: list[Any], name: str, **labels: str) -> float:
    [value] = _values(samples, name, **labels)
    return value


def _states(samples: list[Any], breaker: str, key: str) -> dict[str, float]:
    return {
        s.labels["state"]: s.value
        for s in samples
        if s.name == P + "breaker_state"
        and (s.labels["breaker"], s.labels["key"]) == (breaker, key)
    }


def test_an_open_circuit_and_its_held_tasks_read_so_and_a_closed_one_reads_0(run_worker, markers):
    # A circuit that opened and closed again: stored, closed.
    force_open("calm", name="park")
    force_close("calm", name="park")
    # An open circuit whose tasks a real worker holds back (no attempt spent).
    force_open("ops", name="park")
    for n in range(5):
        tasks.call_parked_host.enqueue("ops", n)
    proc = run_worker("--burst", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    [opened] = [s for s in breaker_states() if s.key == "ops"]
    assert (opened.state, opened.held) == ("open", 5)

    samples = _scrape()
    ops = {"backend": "default", "breaker": "park", "key": "ops"}
    calm = {**ops, "key": "calm"}
    assert _states(samples, "park", "ops") == {"closed": 0, "open": 1, "half-open": 0}
    assert _one(samples, "breaker_held_tasks", **ops) == 5
    assert opened.opened_at is not None
    assert _one(samples, "breaker_opened_timestamp_seconds", **ops) == pytest.approx(
        opened.opened_at.timestamp()
    )
    assert _states(samples, "park", "calm") == {"closed": 1, "open": 0, "half-open": 0}
    assert _one(samples, "breaker_held_tasks", **calm) == 0
    assert _values(samples, "breaker_opened_timestamp_seconds", **calm) == []
    counts = {"backend": "default", "breaker": "park"}
    assert _one(samples, "breaker_circuits", **counts, state="open") == 1
    assert _one(samples, "breaker_circuits", **counts, state="closed") == 1
    assert _one(samples, "breaker_circuits", **counts, state="half-open") == 0

    # Closed by the operator: its tasks are released, and every gauge says so.
    assert force_close("ops", name="park") == 5
    samples = _scrape()
    assert _states(samples, "park", "ops") == {"closed": 1, "open": 0, "half-open": 0}
    assert _one(samples, "breaker_held_tasks", **ops) == 0
    assert _values(samples, "breaker_opened_timestamp_seconds", **ops) == []
    assert _one(samples, "breaker_circuits", **counts, state="open") == 0
    assert _one(samples, "breaker_circuits", **counts, state="closed") == 2

    # The counters per breaker name: no key (a series per host would stay forever), and
    # no empty queue or task label. The worker flushed its parks at its stop.
    metrics.flush()  # this process's force_open/close and release
    samples = _scrape()
    assert _one(samples, "breaker_transitions_total", **counts, new="open") == 2
    assert _one(samples, "breaker_transitions_total", **counts, new="closed") == 2
    assert _one(samples, "breaker_released_total", **counts) == 5
    assert 1 <= _one(samples, "breaker_parked_total", **counts) <= 5
    named = {P + f"breaker_{name}_total" for name in ("transitions", "released", "parked")}
    for sample in samples:
        if sample.name in named:
            assert set(sample.labels) <= {"backend", "breaker", "new"}, sample


def test_named_circuits_are_capped_the_open_first_and_the_counts_cover_every_one():
    now = timezone.now()
    for key in ("c1", "c2"):
        force_open(key, name="hosts", create=True)
        force_close(key, name="hosts")
    for key in ("o1", "o2", "o3"):
        force_open(key, name="hosts", create=True)
    # Opened a minute apart: SQLite's clock reads milliseconds, and two opens within one
    # tie on opened_at (the order then falls to the key), which is not what this reads.
    for minutes, key in enumerate(("o3", "o2", "o1")):
        BreakerRecord.objects.filter(key=key).update(opened_at=now - timedelta(minutes=minutes))
    for n in range(7):  # seven tasks held by o3 (the held count reads at most cap + 1 rows)
        result = tasks.add.enqueue(n, n)
        TaskRecord.objects.filter(pk=result.id).update(
            breaker_key="hosts/o3", held_since=now, run_after=now + timedelta(minutes=5)
        )

    # A probe runs on o1 (half-open); c2's row is corrupt: it works, and reads, as closed.
    BreakerRecord.objects.filter(key="o1").update(state="half-open", probe_task_id="t-1")
    BreakerRecord.objects.filter(key="c2").update(state="bogus")

    found = breaker_gauges(limit=3, cap=4)
    # The three circuits not closed, the most recently opened first; no closed one fits.
    assert [c.key for c in found.circuits] == ["o3", "o2", "o1"]
    assert [c.state for c in found.circuits] == ["open", "open", "half-open"]
    assert found.circuits[2].opened_at is not None
    assert (found.circuits[0].held, found.circuits[0].held_capped) == (4, True)
    assert (found.circuits[1].held, found.circuits[1].held_capped) == (0, False)
    assert found.counts == {("hosts", "open"): 2, ("hosts", "half-open"): 1, ("hosts", "closed"): 2}
    assert found.stored == 5
    exact = breaker_gauges(cap=10)
    assert [(c.key, c.state) for c in exact.circuits][3:] == [("c2", "closed"), ("c1", "closed")]
    assert (exact.circuits[0].held, exact.circuits[0].held_capped) == (7, False)


def test_the_oldest_ready_age_counts_only_a_task_that_could_run_now():
    """Blocked by its ordering key (20 min), held by a breaker, retrying or scheduled:
    none counts. The answer is the lower priority level's task due 10 min ago: each
    level is read from its own head."""
    now = timezone.now()
    for minutes, key, columns in (
        (30, "acct", {"status": TaskResultStatus.RUNNING}),
        (20, "acct", {}),
        (2, None, {}),
        (10, None, {"priority": -5}),
        (-5, None, {"attempt": 1, "held_since": now, "breaker_key": "http/api"}),
        (-5, None, {"attempt": 2}),
        (-60, None, {}),
    ):
        using = {"queue_name": "emails", **({"ordering_key": key} if key else {})}
        result = tasks.add.using(**using).enqueue(1, 1)
        run_after = now - timedelta(minutes=minutes)
        TaskRecord.objects.filter(pk=result.id).update(run_after=run_after, **columns)

    samples = _scrape()
    emails = {"backend": "default", "queue": "emails"}
    assert 590 < _one(samples, "oldest_ready_age_seconds", **emails) < 700
    assert _one(samples, "ready_tasks", **emails) == 3  # due, blocked one included
    assert _one(samples, "oldest_ready_age_seconds", backend="default", queue="default") == 0

    # With every due task blocked, nothing could run: the age is 0, not the blocked one's.
    TaskRecord.objects.filter(queue_name="emails", ordering_key__isnull=True).delete()
    samples = _scrape()
    assert _one(samples, "oldest_ready_age_seconds", **emails) == 0


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="EXPLAIN of PostgreSQL plans")
def test_the_scrape_reads_of_held_tasks_and_the_oldest_age_walk_indexes():
    """On 20,000 READY tasks, 5,000 of them held by an open circuit: the held count and
    the oldest-runnable read EXPLAIN as index scans, never a sequential scan of tasks."""
    force_open("big", name="hosts", create=True)
    tasks.add.enqueue_many([((n, n), {}) for n in range(20_000)])
    now = timezone.now()
    held = TaskRecord.objects.order_by("id").values("pk")[:5_000]
    TaskRecord.objects.filter(pk__in=held).update(
        breaker_key="hosts/big", held_since=now, run_after=now + timedelta(minutes=5)
    )
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
    with CaptureQueriesContext(connection) as captured:
        found = breaker_gauges(cap=10_000)
        metrics.queue_gauges()
    assert [(c.key, c.held, c.held_capped) for c in found.circuits] == [("big", 5_000, False)]
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if "breaker_key = " in q["sql"] or "EXISTS" in q["sql"]
    ]
    assert len(statements) == 2, statements  # the held counts, the default queue's head
    for sql in statements:
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert f"Seq Scan on {table}" not in plan, plan
        assert "dtp_task_breaker_idx" in plan or "dtp_task_claim_idx" in plan, plan


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL plans")
def test_the_gauges_count_each_status_through_its_own_partial_index():
    """READY, RUNNING and FAILED tasks are counted per queue, each status through a
    partial index only its rows enter (0020 dropped the ``(status, queue_name)`` index,
    which took an entry for every version of every task), never a sequential scan."""
    tasks.add.enqueue_many([((n, n), {}) for n in range(20_000)])
    now = timezone.now()
    ids = list(TaskRecord.objects.order_by("id").values_list("pk", flat=True))
    TaskRecord.objects.filter(pk__in=ids[:15_000]).update(
        status=TaskResultStatus.SUCCESSFUL, finished_at=now
    )
    TaskRecord.objects.filter(pk__in=ids[15_000:16_000]).update(
        status=TaskResultStatus.FAILED, finished_at=now
    )
    TaskRecord.objects.filter(pk__in=ids[16_000:16_010]).update(
        status=TaskResultStatus.RUNNING, lease_expires_at=now + timedelta(minutes=1)
    )
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {table}")
    with CaptureQueriesContext(connection) as captured:
        gauges = {gauge.queue: gauge for gauge in metrics.queue_gauges()}
    default = gauges["default"]
    assert (default.ready, default.running, default.dead) == (3_990, 10, 1_000)
    indexes = {
        "READY": ("dtp_task_claim_idx",),
        "RUNNING": ("dtp_task_lease_idx",),
        "FAILED": ("dtp_task_dead_idx",),
    }
    for status, names in indexes.items():
        [sql] = [
            q["sql"]
            for q in captured.captured_queries
            if f"\"status\" = '{status}'" in q["sql"] and "GROUP BY" in q["sql"]
        ]
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert f"Seq Scan on {table}" not in plan, plan
        assert any(name in plan for name in names), plan
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('dtp_task_status_queue_idx')")
        assert cursor.fetchone() == (None,)


def test_the_dead_letters_index_is_built_and_the_old_one_dropped_without_blocking_writes():
    """0020 builds ``dtp_task_dead_idx``, then drops the ``(status, queue_name)`` index,
    CONCURRENTLY on PostgreSQL."""
    assert_index_migration_runs_concurrently("0020_task_dead_index", "dtp_task_dead_idx")
