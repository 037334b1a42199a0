"""Metrics: the aggregator, its flushes (one upsert, kept on failure, on emit and at
worker stop), pruning, the query API, and the Prometheus endpoint after a real worker."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_tasks_plus import InvalidBackendOptions, cancel, events, metrics
from django_tasks_plus.compat import TaskResultStatus, task_backends
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.db.metrics import add_metrics
from django_tasks_plus.metrics.aggregate import FOLD_AT, aggregator, rows_for
from django_tasks_plus.metrics.catalog import ALL_TIME, BUCKETS, bucket_name
from django_tasks_plus.metrics.queries import Histogram
from django_tasks_plus.models import MetricRecord, TaskRecord, WorkerRecord
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import Worker
from django_tasks_plus.worker.metrics_flusher import MetricsFlusher
from django_tasks_plus.worker.pruner import Pruner
from tests import tasks

ADD = "tests.tasks.add"
URL = "/tasks/metrics/"
TOKEN = "s3cret-token-for-the-scraper"


def _tasks_with(**metrics_options: Any) -> dict[str, Any]:
    default = settings.TASKS["default"]
    options = {**default.get("OPTIONS", {}), "METRICS": metrics_options}
    return {**settings.TASKS, "default": {**default, "OPTIONS": options}}


@pytest.fixture(autouse=True)
def fresh_aggregator():
    """Counts left over from this module's tests must not leak into the next module's
    (conftest resets the registries before each test)."""
    yield
    aggregator().reset()


def _event(name: str, measurements: dict[str, float], **labels: Any) -> events.Event:
    metadata = {"backend": "default", "queue": "default", "task_path": ADD, **labels}
    return events.Event(name, measurements, metadata, 1_700_000_000.0)


def _stored(**filters: Any) -> dict[str, int]:
    rows = MetricRecord.objects.filter(backend_name="default", **filters)
    found: dict[str, int] = {}
    for row in rows:
        found[row.name] = found.get(row.name, 0) + row.value
    return found


def _parse(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _sample(families: dict[str, Any], sample: str, **labels: str) -> float:
    for family in families.values():
        for found in family.samples:
            if found.name == sample and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    raise AssertionError(f"no sample {sample} {labels}")


# -- settings -----------------------------------------------------------------------------


def test_metrics_settings_defaults_and_validation():
    defaults = parse_settings("default", {}).metrics
    assert defaults.enabled is True
    assert defaults.flush_interval == 10.0
    assert defaults.retention == timedelta(days=1)
    assert defaults.hourly_retention == timedelta(days=90)
    assert defaults.token is None
    chosen = parse_settings(
        "a", {"OPTIONS": {"METRICS": {"RETENTION_DAYS": 1.5, "TOKEN": "t", "ENABLED": False}}}
    ).metrics
    assert (chosen.retention, chosen.token, chosen.enabled) == (timedelta(hours=36), "t", False)
    hours = parse_settings("a", {"OPTIONS": {"METRICS": {"HOURLY_RETENTION_DAYS": 2}}}).metrics
    assert hours.hourly_retention == timedelta(days=2)
    # Left out, the hours' retention never undercuts the minutes' (a 120-day setting
    # from before hourly rows keeps its meaning); given, it must not.
    long = parse_settings("a", {"OPTIONS": {"METRICS": {"RETENTION_DAYS": 120}}}).metrics
    assert long.hourly_retention == timedelta(days=120)
    with pytest.raises(
        InvalidBackendOptions,
        match=r"\['HOURLY_RETENTION_DAYS'\] must be at least RETENTION_DAYS \(3\).*got 2",
    ):
        parse_settings(
            "a", {"OPTIONS": {"METRICS": {"RETENTION_DAYS": 3, "HOURLY_RETENTION_DAYS": 2}}}
        )
    bad = {
        "RETENTON_DAYS": r"unknown key 'RETENTON_DAYS'\. Did you mean 'RETENTION_DAYS'\?",
        "ENABLED": r"\['ENABLED'\] must be True or False, got 'yes'",
        "TOKEN": r"\['TOKEN'\] must be None .* or a non-empty string, got ' '",
        "FLUSH_INTERVAL": r"\['FLUSH_INTERVAL'\] must be a positive number of seconds, got 0",
        "RETENTION_DAYS": r"\['RETENTION_DAYS'\] must be a positive number of days, got -1",
        "HOURLY_RETENTION_DAYS": r"\['HOURLY_RETENTION_DAYS'\] must be a positive number of "
        r"days, got -1",
        "HOURLY_RETENTON_DAYS": r"unknown key 'HOURLY_RETENTON_DAYS'\. Did you mean "
        r"'HOURLY_RETENTION_DAYS'\?",
    }
    values = {
        "RETENTON_DAYS": 3,
        "HOURLY_RETENTON_DAYS": 3,
        "ENABLED": "yes",
        "TOKEN": " ",
        "FLUSH_INTERVAL": 0,
    }
    for key, message in bad.items():
        value = values.get(key, -1)
        with pytest.raises(InvalidBackendOptions, match=message):
            parse_settings("a", {"OPTIONS": {"METRICS": {key: value}}})
    with pytest.raises(InvalidBackendOptions, match=r"\['METRICS'\] must be a dict"):
        parse_settings("a", {"OPTIONS": {"METRICS": True}})


# -- aggregation (pure) ---------------------------------------------------------------------


def test_aggregated_rows_of_one_minute_and_the_all_time_row():
    aggregator().on_count(_event(events.TASK_ENQUEUED, {"count": 5}))
    aggregator().on_started(_event(events.TASK_STARTED, {"attempt": 1, "queue_time": 0.2}))
    aggregator().on_started(_event(events.TASK_STARTED, {"attempt": 1, "queue_time": 7200.0}))
    aggregator().on_outcome(_event(events.TASK_SUCCEEDED, {"attempt": 1, "run_time": 0.003}))
    aggregator().on_outcome(_event(events.TASK_ATTEMPT_FAILED, {"attempt": 1}))  # reaper: no time
    aggregator().on_count(_event(events.BREAKER_PARKED, {"count": 4}, queue=None, task_path=None))
    aggregator().on_count(_event(events.TASK_ENQUEUED, {"count": 1}, backend="not-ours"))
    pending = aggregator().take()
    assert list(pending) == [
        (1_700_000_000 // 60, "default", "default", ADD),
        (1_700_000_000 // 60, "default", "", ""),
    ]
    rows = rows_for("default", {k: v for k, v in pending.items() if k[3] == ADD})
    minute = datetime.fromtimestamp(1_700_000_000 // 60 * 60, UTC)
    by_name = {row[4]: row[5] for row in rows if row[1] == minute}
    assert by_name == {
        "enqueued": 5,
        "started": 2,
        "succeeded": 1,
        "attempt_failed": 1,
        "wait:le=0.25": 1,
        "wait:le=+Inf": 1,
        "wait:sum_us": 7_200_200_000,
        "run:le=0.005": 1,
        "run:sum_us": 3000,
    }
    assert {row[4]: row[5] for row in rows if row[1] == ALL_TIME} == by_name


def test_the_raw_observations_waiting_for_a_fold_stay_few():
    """A busy worker emits thousands of events between two flushes; the raw tuples are
    folded into the per-minute counts as they come, never held by the ten thousand (a
    drain's worker held 50,000 of them, 8 MB that its allocator kept for good)."""
    calls = 3 * FOLD_AT + 7
    assert not aggregator().claimed_by  # as in a web process: enqueues flush when due
    for _ in range(calls):
        aggregator().on_started(_event(events.TASK_STARTED, {"attempt": 1, "queue_time": 0.2}))
        aggregator().on_outcome(_event(events.TASK_SUCCEEDED, {"attempt": 1, "run_time": 0.003}))
        aggregator().on_count(_event(events.TASK_ENQUEUED, {"count": 1}))  # no flush due
        assert len(aggregator().raw) < FOLD_AT
    assert FOLD_AT <= 5_000  # the bound above says little if the threshold grew back
    pending = aggregator().take()
    entry = rows_for("default", {k: v for k, v in pending.items() if k[3] == ADD})
    counts = {row[4]: row[5] for row in entry if row[1] == ALL_TIME}
    assert (counts["started"], counts["succeeded"], counts["enqueued"]) == (calls,) * 3


def test_quantiles_interpolate_within_the_bucket():
    buckets = [0] * (len(BUCKETS) + 1)
    buckets[BUCKETS.index(1)] = 10  # ten observations in (0.5, 1]
    found = Histogram(tuple(buckets), 7.5, 10)
    assert found.quantile(0.5) == pytest.approx(0.75)
    assert found.quantile(1.0) == pytest.approx(1.0)
    assert Histogram((0,) * (len(BUCKETS) + 1), 0, 0).quantile(0.5) is None
    overflow = (0,) * len(BUCKETS) + (3,)
    assert Histogram(overflow, 99999.0, 3).quantile(0.95) == BUCKETS[-1]


# -- the table ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_flushes_add_up_in_one_upsert_and_pruning_keeps_the_totals():
    aggregator().on_count(_event(events.TASK_ENQUEUED, {"count": 2}))
    assert metrics.flush() == 2  # the minute's row and the all-time row
    aggregator().on_count(_event(events.TASK_ENQUEUED, {"count": 3}))
    assert metrics.flush() == 2
    assert _stored(minute=ALL_TIME) == {"enqueued": 5}
    assert _stored(minute__gt=ALL_TIME) == {"enqueued": 5}
    assert MetricRecord.objects.count() == 2

    recent = timezone.now().replace(second=0, microsecond=0)
    add_metrics("default", [("default", recent, "default", ADD, "succeeded", 1)])
    pruner = Pruner(task_backends["default"].settings, clock=timezone.now, bound_seconds=30)
    assert pruner.singleton is True
    pruner.tick()  # the 2023 minute is past the 7-day retention
    assert _stored(minute=ALL_TIME) == {"enqueued": 5}
    assert _stored(minute__gt=ALL_TIME) == {"succeeded": 1}


@pytest.mark.django_db(transaction=True)
def test_a_failed_flush_keeps_the_counts_for_the_next_one(caplog):
    aggregator().on_count(_event(events.TASK_REDRIVEN, {}))
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_tasks_plus_metricrecord RENAME TO dtp_metrics_away")
    try:
        assert metrics.flush() == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE dtp_metrics_away RENAME TO django_tasks_plus_metricrecord")
    assert "Could not write the metrics of backend 'default'" in caplog.text
    assert "kept for the next flush" in caplog.text
    assert metrics.flush() == 2
    assert _stored(minute=ALL_TIME) == {"redriven": 1}


@pytest.mark.django_db(transaction=True)
def test_enqueue_side_events_flush_on_emit_at_most_every_flush_interval():
    aggregator().last_flush = time.monotonic() - 3600  # the last flush was long ago
    first = tasks.add.enqueue(1, 1)  # autocommit: emitted now, and flushed now
    assert _stored(minute=ALL_TIME) == {"enqueued": 1}
    tasks.add.enqueue(1, 2)  # within FLUSH_INTERVAL of that flush: kept in memory
    assert _stored(minute=ALL_TIME) == {"enqueued": 1}
    aggregator().last_flush = time.monotonic() - 3600
    with transaction.atomic():
        cancel(first)
        tasks.add.enqueue(1, 3)
    # On commit, outside the transaction: the first event (the cancel) flushes what was
    # kept; the enqueue right after it waits for the next flush.
    assert _stored(minute=ALL_TIME) == {"enqueued": 2, "cancelled": 1}
    assert metrics.flush() == 2
    assert _stored(minute=ALL_TIME) == {"enqueued": 3, "cancelled": 1}


@pytest.mark.django_db(transaction=True)
def test_disabled_metrics_unsubscribe_and_build_no_services():
    with override_settings(TASKS=_tasks_with(ENABLED=False)):
        assert not events.listened(events.TASK_STARTED)
        tasks.add.enqueue(1, 1)
        assert aggregator().take() == {}
        worker = Worker(WorkerConfig.from_settings("default", burst=True))
        names = [service.name for service in worker.services.services]
        assert "tasks-metrics-flusher" not in names
    assert events.listened(events.TASK_STARTED)
    worker = Worker(WorkerConfig.from_settings("default", burst=True))
    services = worker.services.services
    assert isinstance(services[0], MetricsFlusher)  # first: it stops last
    assert services[0].singleton is False
    assert any(isinstance(s, Pruner) and s.singleton for s in services)


# -- the query API --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_gauges_totals_series_and_percentiles():
    now = timezone.now()
    for status, run_after in [
        (TaskResultStatus.READY, now - timedelta(seconds=90)),
        (TaskResultStatus.READY, now - timedelta(seconds=5)),
        (TaskResultStatus.READY, now + timedelta(hours=1)),
        (TaskResultStatus.RUNNING, now),
        (TaskResultStatus.FAILED, now),
        (TaskResultStatus.SUCCESSFUL, now),
    ]:
        result = tasks.add.using(queue_name="emails").enqueue(1, 1)
        TaskRecord.objects.filter(pk=result.id).update(status=status, run_after=run_after)
    gauges = {gauge.queue: gauge for gauge in metrics.queue_gauges("default", now=now)}
    assert list(gauges) == ["default", "emails", "slow", "other"]
    emails = gauges["emails"]
    assert (emails.ready, emails.scheduled, emails.running, emails.dead) == (2, 1, 1, 1)
    assert emails.oldest_ready_age == pytest.approx(90, abs=1)
    assert gauges["default"].ready == 0 and gauges["default"].oldest_ready_age is None

    minute = now.replace(second=0, microsecond=0)
    add_metrics(
        "default",
        [
            ("default", minute - timedelta(minutes=2), "emails", ADD, "succeeded", 4),
            ("default", minute, "emails", ADD, "succeeded", 6),
            ("default", minute, "default", ADD, "dead_lettered", 1),
            ("default", minute, "emails", ADD, bucket_name("run", BUCKETS.index(0.1)), 10),
            ("default", minute - timedelta(days=1), "emails", ADD, "succeeded", 100),
        ],
    )
    assert metrics.counter_totals("default", timedelta(hours=1), now=now)["succeeded"] == 10
    assert {(t.queue, t.name, t.value) for t in metrics.totals("default", now=now)} == {
        ("emails", "succeeded", 10),
        ("default", "dead_lettered", 1),
    }
    series = metrics.rate_series("default", "succeeded", timedelta(minutes=5), now=now)
    assert [value for _, value in series] == [0, 0, 0, 4, 0, 6]  # 5 minutes back, and now
    assert series[-1][0] == minute
    p = metrics.percentiles("default", "run", timedelta(hours=1), (0.5, 0.95), now=now)
    assert p[0.5] == pytest.approx(0.075) and p[0.95] == pytest.approx(0.0975)
    assert metrics.percentiles("default", "wait", timedelta(hours=1), now=now)[0.5] is None
    with pytest.raises(ValueError, match="Unknown counter 'nope'"):
        metrics.rate_series("default", "nope")


# -- the endpoint, after a real worker ----------------------------------------------------


def _user(username: str, *, staff: bool, perm: bool = False, superuser: bool = False) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=staff)
    user.is_superuser = superuser
    user.save()
    if perm:
        user.user_permissions.add(Permission.objects.get(codename="view_taskrecord"))
    return user


@pytest.mark.django_db(transaction=True)
def test_prometheus_endpoint_after_a_real_burst_worker(run_worker):
    for i in range(5):
        tasks.add.enqueue(i, i)
    tasks.always_fails.enqueue("boom")
    tasks.defers_once.enqueue()
    metrics.flush()  # this process's enqueue counts (a web process flushes on emit)
    proc = run_worker("--burst", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr

    # The worker flushed at its stop; nothing else was needed.
    assert _stored(minute=ALL_TIME, task_path=ADD)["succeeded"] == 5
    client = Client()
    client.force_login(_user("ops", staff=True, perm=True))
    response = client.get(URL)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    text = response.content.decode()
    assert "# HELP django_tasks_plus_succeeded_total Attempts that succeeded." in text
    assert "# TYPE django_tasks_plus_succeeded_total counter" in text
    assert "# TYPE django_tasks_plus_run_seconds histogram" in text
    families = _parse(text)
    add_labels = {"backend": "default", "queue": "default", "task": ADD}
    fails = {**add_labels, "task": "tests.tasks.always_fails"}
    defers = {**add_labels, "task": "tests.tasks.defers_once"}
    assert _sample(families, "django_tasks_plus_enqueued_total", **add_labels) == 5
    assert _sample(families, "django_tasks_plus_started_total", **add_labels) == 5
    assert _sample(families, "django_tasks_plus_succeeded_total", **add_labels) == 5
    assert _sample(families, "django_tasks_plus_attempt_failed_total", **add_labels) == 0
    attempts = TaskRecord.objects.get(task_path="tests.tasks.always_fails").attempt
    assert _sample(families, "django_tasks_plus_attempt_failed_total", **fails) == attempts
    assert _sample(families, "django_tasks_plus_retried_total", **fails) == attempts - 1
    assert _sample(families, "django_tasks_plus_dead_lettered_total", **fails) == 1
    assert _sample(families, "django_tasks_plus_deferred_total", **defers) == 1
    assert _sample(families, "django_tasks_plus_succeeded_total", **defers) == 1
    # Histograms: cumulative buckets ending in +Inf, which equals _count.
    run_count = _sample(families, "django_tasks_plus_run_seconds_count", **add_labels)
    assert run_count == 5
    assert _sample(families, "django_tasks_plus_run_seconds_bucket", **add_labels, le="+Inf") == 5
    buckets = [
        s.value
        for s in families["django_tasks_plus_run_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["task"] == ADD
    ]
    assert buckets == sorted(buckets) and len(buckets) == len(BUCKETS) + 1
    assert 0 < _sample(families, "django_tasks_plus_run_seconds_sum", **add_labels) < 60
    assert _sample(families, "django_tasks_plus_wait_seconds_count", **add_labels) == 5
    # Gauges, counted now.
    assert (
        _sample(families, "django_tasks_plus_dead_tasks", backend="default", queue="default") == 1
    )
    assert (
        _sample(families, "django_tasks_plus_ready_tasks", backend="default", queue="default") == 0
    )
    assert WorkerRecord.objects.count() == 0  # a clean stop unregisters
    assert _sample(families, "django_tasks_plus_workers", backend="default", state="alive") == 0

    # taskstats shows the same numbers (the query API behind both).
    stats = metrics.counter_totals("default", timedelta(hours=1))
    assert stats["succeeded"] == 6 and stats["dead_lettered"] == 1


@pytest.mark.django_db(transaction=True)
def test_endpoint_access_matrix():
    client = Client()
    anonymous = client.get(URL)
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer realm=")
    for name, staff, perm, superuser, expected in [
        ("plain", False, False, False, 403),
        ("plain-with-perm", False, True, False, 403),
        ("staff", True, False, False, 403),
        ("viewer", True, True, False, 200),
        ("root", True, False, True, 200),
    ]:
        client.force_login(_user(name, staff=staff, perm=perm, superuser=superuser))
        assert client.get(URL).status_code == expected, name
        client.logout()
    assert client.post(URL).status_code == 405  # read-only

    # No TOKEN configured: a bearer token is refused.
    assert client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401
    with override_settings(TASKS=_tasks_with(TOKEN=TOKEN)):
        ok = client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        assert "django_tasks_plus_ready_tasks" in ok.content.decode()
        wrong = client.get(URL, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert 'error="invalid_token"' in wrong["WWW-Authenticate"]
