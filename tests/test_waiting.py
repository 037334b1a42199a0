"""What each READY task waits for (``waiting.py``) and the reads behind it
(``db/waiting.py``): the reason of one row, the rows of one reason, and the capped
per-queue counts the overview and ``taskstats`` show."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_tasks_plus import metrics
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db import waiting as store
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.retry import exponential_backoff, no_retry
from django_tasks_plus.waiting import Capped, Reason, max_attempts_of, waiting_reason
from tests import tasks

NOW = timezone.now()
READY = TaskResultStatus.READY


def reason_of(**changes):
    row = {
        "status": "READY",
        "run_after": NOW - timedelta(seconds=30),
        "attempt": 0,
        "held_since": None,
        "breaker_key": None,
        "blocker_id": None,
        "now": NOW,
    }
    return waiting_reason(**{**row, **changes})


# -- the reason of one row (pure) ----------------------------------------------------------


def test_a_due_task_could_run_now_and_says_how_long_it_waited():
    found = reason_of()
    assert found.reason is Reason.DUE and found.can_run_now
    assert found.describe(NOW) == "due, waiting 30 s"


def test_a_future_task_is_scheduled_retrying_or_held():
    later = NOW + timedelta(seconds=40)
    assert reason_of(run_after=later).describe(NOW) == "scheduled, due in 40 s"
    retrying = reason_of(run_after=later, attempt=2, max_attempts=5)
    assert retrying.reason is Reason.RETRYING and not retrying.can_run_now
    assert retrying.describe(NOW) == "retrying: attempt 3 of 5 in 40 s"
    assert reason_of(run_after=later, attempt=2).describe(NOW) == "retrying: attempt 3 in 40 s"
    held = reason_of(run_after=later, attempt=2, held_since=NOW, breaker_key="api/host")
    assert held.reason is Reason.HELD and held.breaker_key == "api/host"
    assert held.describe(NOW) == "held by breaker api/host for 40 s more"


def test_a_due_task_behind_its_ordering_key_is_blocked_and_a_future_one_is_not():
    blocker = "0123456789abcdef0123456789abcdef"
    found = reason_of(blocker_id=blocker)
    assert found.reason is Reason.BLOCKED and not found.can_run_now
    assert found.describe(NOW) == "blocked by its ordering key behind 01234567, due 30 s ago"
    later = reason_of(blocker_id=blocker, run_after=NOW + timedelta(minutes=1))
    assert later.reason is Reason.SCHEDULED and later.blocker_id is None


def test_only_ready_tasks_wait():
    for status in ("RUNNING", "SUCCESSFUL", "FAILED"):
        assert reason_of(status=status) is None


def test_the_retry_budget_is_read_from_policies_that_state_it():
    assert max_attempts_of(exponential_backoff(max_attempts=5)) == 5
    assert max_attempts_of(no_retry) == 1
    assert max_attempts_of(lambda attempt, elapsed, exc: None) is None


def test_a_capped_count_reads_as_a_lower_bound():
    assert str(Capped(10_000, True)) == "10,000+"
    assert str(Capped(12)) == "12"


# -- the reads -----------------------------------------------------------------------------


def _row(*, run_after, key=None, **columns):
    result = tasks.add.using(queue_name="emails", **({"ordering_key": key} if key else {})).enqueue(
        1, 1
    )
    TaskRecord.objects.filter(pk=result.id).update(run_after=run_after, **columns)
    return TaskRecord.objects.get(pk=result.id)


def _each_reason(now):
    """One task per reason in queue "emails", plus the blocked task's blocker."""
    past, later = now - timedelta(minutes=5), now + timedelta(minutes=5)
    rows = {
        Reason.DUE: _row(run_after=past),
        Reason.HELD: _row(run_after=later, attempt=1, held_since=past, breaker_key="default/host"),
        Reason.RETRYING: _row(run_after=later, attempt=2),
        Reason.SCHEDULED: _row(run_after=later),
    }
    head = _row(run_after=past - timedelta(minutes=1), key="k", status=TaskResultStatus.RUNNING)
    rows[Reason.BLOCKED] = _row(run_after=past - timedelta(minutes=2), key="k")
    return rows, head


@pytest.mark.django_db(transaction=True)
def test_each_reason_selects_its_rows_and_the_blocker_is_found():
    now = timezone.now()
    rows, head = _each_reason(now)
    for reason, row in rows.items():
        chosen = TaskRecord.objects.filter(store.reason_condition(reason, now))
        assert list(chosen.values_list("pk", flat=True)) == [row.pk], reason
    shown = TaskRecord.objects.annotate(blocker=store.blocker_id())
    blockers = dict(shown.values_list("pk", "blocker"))
    assert blockers[rows[Reason.BLOCKED].pk] == head.pk
    assert blockers[rows[Reason.DUE].pk] is None


@pytest.mark.django_db(transaction=True)
def test_an_earlier_waiting_task_of_the_key_blocks_and_a_finished_one_does_not():
    now = timezone.now()
    past = now - timedelta(minutes=1)
    first = _row(run_after=past, key="k", status=TaskResultStatus.SUCCESSFUL)
    second = _row(run_after=past, key="k")
    third = _row(run_after=past, key="k")
    blockers = dict(
        TaskRecord.objects.annotate(blocker=store.blocker_id()).values_list("pk", "blocker")
    )
    assert blockers[second.pk] is None and blockers[third.pk] == second.pk
    TaskRecord.objects.filter(pk=first.pk).update(
        status=TaskResultStatus.FAILED, ordering_blocked=True
    )
    blocked = TaskRecord.objects.filter(store.reason_condition(Reason.BLOCKED, now))
    assert set(blocked.values_list("pk", flat=True)) == {second.pk, third.pk}


@pytest.mark.django_db(transaction=True)
def test_queue_counts_split_by_reason_and_the_oldest_age_skips_blocked_tasks():
    now = timezone.now()
    _each_reason(now)
    queues = {q.queue: q for q in metrics.queue_waiting("default", now=now)}
    emails = queues["emails"]
    assert {r: c.count for r, c in emails.waiting.items()} == dict.fromkeys(Reason, 1)
    assert not any(c.at_least for c in emails.waiting.values())
    assert (emails.running, emails.dead, emails.ready.count) == (1, 0, 5)
    # The blocked task is older, but only the due one could run: 5 minutes.
    assert emails.oldest_runnable_age == pytest.approx(300, abs=2) and emails.oldest_exact
    assert queues["default"].oldest_runnable_age is None


@pytest.mark.django_db(transaction=True)
def test_counts_past_the_cap_are_lower_bounds_and_queues_outside_settings_are_found():
    now = timezone.now()
    for _ in range(3):
        _row(run_after=now - timedelta(seconds=1), queue_name="unlisted")
        _row(run_after=now + timedelta(hours=1), queue_name="unlisted")
    queues = {q.queue: q for q in metrics.queue_waiting("default", now=now, cap=2)}
    unlisted = queues["unlisted"]
    assert unlisted.waiting[Reason.DUE] == Capped(2, at_least=True)
    assert unlisted.waiting[Reason.SCHEDULED] == Capped(2, at_least=True)
    assert str(unlisted.ready) == "4+"
    # The oldest due task is the first of its index range, whatever the queue's size.
    assert unlisted.oldest_exact and unlisted.oldest_runnable_age == pytest.approx(1, abs=1)


@pytest.mark.django_db(transaction=True)
def test_past_the_scan_blocked_and_due_are_lower_bounds_from_the_oldest_due_tasks():
    now = timezone.now()
    _row(run_after=now - timedelta(minutes=3), key="a")
    _row(run_after=now - timedelta(minutes=2), key="a")  # blocked by the first
    _row(run_after=now - timedelta(minutes=1), key="b")
    emails = {q.queue: q for q in metrics.queue_waiting("default", now=now, scan=2)}["emails"]
    assert (str(emails.waiting[Reason.BLOCKED]), str(emails.waiting[Reason.DUE])) == ("1+", "1+")
    assert emails.oldest_exact and emails.oldest_runnable_age == pytest.approx(180, abs=2)
    whole = {q.queue: q for q in metrics.queue_waiting("default", now=now)}["emails"]
    assert (whole.waiting[Reason.BLOCKED], whole.waiting[Reason.DUE]) == (Capped(1), Capped(2))
