"""``manage.py taskstats``: text and JSON, once and with --watch, after a real worker."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_tasks_plus import metrics
from django_tasks_plus.metrics.aggregate import aggregator
from tests import tasks
from tests.conftest import wait_for


@pytest.fixture(autouse=True)
def fresh_aggregator():
    yield
    aggregator().reset()


def _run(*args: str) -> str:
    out = StringIO()
    call_command("taskstats", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_taskstats_text_and_json_after_a_real_worker(run_worker, start_worker):
    for i in range(4):
        tasks.add.enqueue(i, i)
    tasks.always_fails.enqueue("boom")
    tasks.add.using(queue_name="emails").enqueue(1, 2)
    metrics.flush()
    assert run_worker("--burst", "--queue", "default").returncode == 0

    stats = json.loads(_run("--json"))
    queues = {queue["queue"]: queue for queue in stats["queues"]}
    assert queues["default"]["dead"] == 1 and queues["default"]["ready"] == 0
    assert queues["emails"]["ready"] == 1 and queues["emails"]["oldest_ready_age"] >= 0
    assert queues["default"]["per_minute"]["succeeded"] == pytest.approx(4 / 60)
    assert stats["counts"]["enqueued"] == 6 and stats["counts"]["dead_lettered"] == 1
    assert stats["dead"] == 1
    assert stats["latency"]["run"]["p50"] is not None
    assert stats["latency"]["wait"]["p95"] is not None
    assert stats["workers"] == {"alive": 0, "stale": 0, "list": []}
    assert stats["breakers"] == []

    text = _run()
    assert "Backend 'default' at " in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("QUEUE"))
    assert header.split()[:9] == [
        *("QUEUE", "READY", "BLOCKED", "HELD", "RETRYING", "SCHEDULED"),
        *("RUNNING", "DEAD", "OLDEST"),
    ]
    default_row = next(line for line in lines if line.startswith("default "))
    assert default_row.split()[1:8] == ["0", "0", "0", "0", "0", "0", "1"]
    assert "Dead  1 task(s) FAILED" in text
    assert "Workers: 0 alive, 0 stale" in text
    assert any(line.startswith("Run   p50 ") and "ms" in line for line in lines)

    # A running worker shows as alive.
    start_worker("--queue", "slow")
    wait_for(lambda: json.loads(_run("--json"))["workers"]["alive"] == 1, timeout=60)
    assert "Workers: 1 alive, 0 stale" in _run()


@pytest.mark.django_db(transaction=True)
def test_taskstats_says_what_ready_tasks_wait_for():
    """A task blocked by its ordering key is counted as blocked, and the oldest READY
    age is that of a task that could run now (due, not held, not blocked)."""
    from datetime import timedelta

    from django.utils import timezone

    from django_tasks_plus.compat import TaskResultStatus
    from django_tasks_plus.models import TaskRecord

    now = timezone.now()
    for minutes, key, columns in (
        (30, "acct", {"status": TaskResultStatus.RUNNING}),
        (20, "acct", {}),
        (2, None, {}),
        (-5, None, {"attempt": 1, "held_since": now, "breaker_key": "http/api"}),
        (-5, None, {"attempt": 2}),
        (-60, None, {}),
    ):
        using = {"queue_name": "emails", **({"ordering_key": key} if key else {})}
        result = tasks.add.using(**using).enqueue(1, 1)
        run_after = now - timedelta(minutes=minutes)
        TaskRecord.objects.filter(pk=result.id).update(run_after=run_after, **columns)
    emails = {q["queue"]: q for q in json.loads(_run("--json"))["queues"]}["emails"]
    counts = {name: emails[name] for name in ("ready", "blocked", "held", "retrying")}
    assert counts == dict.fromkeys(counts, 1) and emails["scheduled"] == 1
    assert (emails["running"], emails["at_least"]) == (1, [])
    assert 110 < emails["oldest_ready_age"] < 200  # 2 min: not the blocked task's 20
    row = next(line for line in _run().splitlines() if line.startswith("emails "))
    assert row.split()[1:8] == ["1", "1", "1", "1", "1", "1", "0"]


@pytest.mark.django_db(transaction=True)
def test_taskstats_watch_refreshes_and_stops_after_count():
    lines = _run("--json", "--watch", "0.05", "--count", "3").splitlines()
    assert len(lines) == 3
    assert all(json.loads(line)["backend"] == "default" for line in lines)
    text = _run("--watch", "0.05", "--count", "2")
    assert text.count("Backend 'default' at ") == 2


@pytest.mark.django_db
def test_taskstats_refuses_bad_arguments():
    with pytest.raises(CommandError, match="Unknown task backend 'nope'"):
        call_command("taskstats", "--backend", "nope")
    with pytest.raises(CommandError, match="--watch must be a positive number of seconds"):
        call_command("taskstats", "--watch", "0")
    with pytest.raises(CommandError, match="--count must be a whole number of at least 1"):
        call_command("taskstats", "--watch", "1", "--count", "0")
