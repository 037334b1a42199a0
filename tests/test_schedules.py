"""Schedules in one process (schedules/): declaring, checking, syncing, firing with an
injected clock, the runtime API. Real workers firing them: test_schedule_workers.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import override_settings
from django.utils import timezone

from django_tasks_plus import definition, events
from django_tasks_plus.compat import task_backends
from django_tasks_plus.models import ScheduleOccurrence, ScheduleRecord, TaskRecord
from django_tasks_plus.schedules import (
    Every,
    InvalidSchedule,
    ScheduleNotEditable,
    ScheduleNotFound,
    api,
)
from django_tasks_plus.schedules.declared import declared
from django_tasks_plus.schedules.feature import schedules_check
from django_tasks_plus.schedules.store import fire_due, sync
from testproject import settings as project_settings
from tests import scheduled_tasks

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def settings_of(alias: str = "default") -> Any:
    return task_backends[alias].settings


def _tasks(**options: Any) -> dict[str, Any]:
    default = dict(project_settings.TASKS["default"])
    default["OPTIONS"] = {**default.get("OPTIONS", {}), **options}
    return {**project_settings.TASKS, "default": default}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(autouse=True, scope="module")
def code_schedules_declared() -> Iterator[None]:
    """The code schedules of tests/scheduled_tasks.py, registered for this module's tests
    only (in-process workers elsewhere in the suite must not fire them)."""
    definition._scheduled.update(scheduled_tasks.TEST_SCHEDULES)
    yield
    for key in scheduled_tasks.TEST_SCHEDULES:
        definition._scheduled.pop(key, None)


@pytest.fixture
def restore_declared() -> Iterator[None]:
    saved = dict(definition._scheduled)
    yield
    definition._scheduled.clear()
    definition._scheduled.update(saved)


def occurrence_tasks(name: str) -> list[Any]:
    return list(
        ScheduleOccurrence.objects.filter(schedule__name=name, action="fired")
        .order_by("at")
        .values_list("task_id", flat=True)
    )


# -- declaring ------------------------------------------------------------------------------


def test_schedules_declared_in_code_are_named_after_their_task():
    found = {d.name: d for d in declared(settings_of())}
    five = found["tests.scheduled_tasks.every_five_minutes"]
    assert five.cron == "*/5 * * * *" and five.source == "code"
    assert found["tests.scheduled_tasks.refresh[0]"].every_seconds == 30
    nightly = found["nightly-full"]
    assert nightly.kwargs == {"full": True} and nightly.timezone == "Europe/Berlin"
    assert nightly.task_path == "tests.scheduled_tasks.refresh"


def test_schedules_in_settings_are_declared_with_their_options():
    entry = {"task": "tests.tasks.add", "every": 90, "args": [1, 2], "catch_up": "all"}
    with override_settings(TASKS=_tasks(SCHEDULES={"adder": entry})):
        found = {d.name: d for d in declared(settings_of())}
    assert found["adder"].every_seconds == 90 and found["adder"].source == "settings"
    assert found["adder"].args == (1, 2) and found["adder"].catch_up == "all"


def test_bad_schedules_are_system_check_errors_naming_each(restore_declared):
    from tests import broken_schedule_tasks

    definition._scheduled[("default", "tests.broken_schedule_tasks.broken")] = (
        broken_schedule_tasks.broken
    )

    bad = {
        "bad-zone": {"task": "tests.tasks.add", "cron": "0 1 * * *", "timezone": "Mars/Base"},
        "bad-task": {"task": "tests.tasks.nowhere", "every": 5},
        "bad-cron": {"task": "tests.tasks.add", "cron": "99 * * * *"},
    }
    with override_settings(TASKS=_tasks(SCHEDULES=bad)):
        messages = [str(error.msg) for error in schedules_check()]
        with pytest.raises(SystemCheckError) as raised:
            call_command("check")
    assert len(messages) == 4
    for name in ("bad-zone", "bad-task", "bad-cron", "broken"):
        assert any(name in message for message in messages), name
    assert "bad-zone" in str(raised.value)


# -- sync -----------------------------------------------------------------------------------


def test_sync_creates_updates_and_disables_never_deletes():
    settings = settings_of()
    entry = {"task": "tests.tasks.add", "every": 60, "args": [1, 2]}
    with override_settings(TASKS=_tasks(SCHEDULES={"adder": entry})):
        report = sync(settings_of(), declared(settings_of()), T0)
    assert "adder" in report.created
    row = ScheduleRecord.objects.get(name="adder")
    assert row.source == "settings" and row.next_at == T0 + timedelta(minutes=1)
    changed = {**entry, "every": 120}
    with override_settings(TASKS=_tasks(SCHEDULES={"adder": changed})):
        report = sync(settings_of(), declared(settings_of()), T0)
    assert report.updated == ("adder",)
    row.refresh_from_db()
    assert row.every_seconds == 120 and row.next_at == T0 + timedelta(minutes=2)
    report = sync(settings, declared(settings), T0)  # no longer in the settings
    assert "adder" in report.disabled
    row.refresh_from_db()
    assert row.enabled is False  # kept, with its history


# -- firing ---------------------------------------------------------------------------------


def make(name: str = "adder", when: Any = None, **options: Any) -> ScheduleRecord:
    row = api.create(name, "tests.tasks.add", when or Every(seconds=10), args=[2, 3], **options)
    row.next_at = T0
    row.save()
    return row


def test_each_occurrence_is_enqueued_once_with_its_task_id_on_the_occurrence():
    make()
    clock = Clock(T0 + timedelta(seconds=1))
    assert fire_due(settings_of(), clock) == 1
    assert fire_due(settings_of(), clock) == 0  # the same moment again: nothing new
    clock.now = T0 + timedelta(seconds=21)  # 10 s and 20 s are due
    assert fire_due(settings_of(), clock) == 2
    ids = occurrence_tasks("adder")
    assert len(ids) == 3 and None not in ids
    assert TaskRecord.objects.filter(pk__in=ids).count() == 3
    assert TaskRecord.objects.filter(task_path="tests.tasks.add").count() == 3
    row = ScheduleRecord.objects.get(name="adder")
    assert row.next_at == T0 + timedelta(seconds=30)
    assert row.last_fired_at == T0 + timedelta(seconds=20) and row.last_task_id == ids[-1]


def test_a_second_scheduler_with_a_stale_view_cannot_fire_an_occurrence_again():
    make()
    fire_due(settings_of(), Clock(T0 + timedelta(seconds=1)))
    # A leader that read the row before the first one committed still waits for T0.
    ScheduleRecord.objects.filter(name="adder").update(next_at=T0)
    assert fire_due(settings_of(), Clock(T0 + timedelta(seconds=1))) == 0
    assert TaskRecord.objects.filter(task_path="tests.tasks.add").count() == 1
    assert ScheduleRecord.objects.get(name="adder").next_at == T0 + timedelta(seconds=10)


def test_due_schedules_fire_in_batches_each_occurrence_once(monkeypatch):
    from django_tasks_plus.schedules import store

    monkeypatch.setattr(store, "BATCH_SIZE", 2)
    for index in range(5):
        make(f"batch-{index}", when=Every(seconds=10))
    assert fire_due(settings_of(), Clock(T0 + timedelta(seconds=1))) == 5
    assert fire_due(settings_of(), Clock(T0 + timedelta(seconds=1))) == 0
    for index in range(5):
        [task_id] = occurrence_tasks(f"batch-{index}")
        assert TaskRecord.objects.get(pk=task_id).args == [2, 3]
        row = ScheduleRecord.objects.get(name=f"batch-{index}")
        assert row.last_task_id == task_id and row.next_at == T0 + timedelta(seconds=10)


def test_a_schedule_that_cannot_enqueue_is_skipped_with_why_and_holds_up_no_other():
    for index in range(3):
        make(f"batch-{index}")
    # Its task was removed from the code since the schedule was stored.
    ScheduleRecord.objects.filter(name="batch-1").update(task_path="tests.tasks.removed")
    assert fire_due(settings_of(), Clock(T0 + timedelta(seconds=1))) == 2
    assert len(occurrence_tasks("batch-0")) == len(occurrence_tasks("batch-2")) == 1
    skipped = ScheduleOccurrence.objects.get(schedule__name="batch-1")
    assert skipped.action == "skipped" and "unknown task" in skipped.reason
    assert ScheduleRecord.objects.get(name="batch-1").next_at == T0 + timedelta(seconds=10)


@pytest.mark.parametrize(
    ("catch_up", "fired", "missed"), [("none", 0, 7), ("latest", 1, 6), ("all", 3, 4)]
)
def test_catch_up_after_no_scheduler_ran_follows_the_policy(catch_up, fired, missed):
    # Yearly on 1 January; the scheduler last waited for 2020: 2020 to 2026 were missed.
    row = make(when="0 0 1 1 *", catch_up=catch_up, catch_up_cap=3, timezone_name="UTC")
    row.next_at = datetime(2020, 1, 1, tzinfo=UTC)
    row.save()
    fire_due(settings_of(), Clock(T0))
    assert len(occurrence_tasks("adder")) == fired
    row.refresh_from_db()
    assert row.next_at == datetime(2027, 1, 1, tzinfo=UTC)
    years = [at.year for at in ScheduleOccurrence.objects.values_list("at", flat=True)]
    assert sorted(years) == list(range(2027 - fired, 2027))
    assert missed == 7 - fired


def test_paused_time_is_not_missed_resume_continues_with_the_next_occurrence():
    make()
    api.pause("adder")
    assert fire_due(settings_of(), Clock(T0 + timedelta(hours=1))) == 0
    api.resume("adder", now=T0 + timedelta(hours=1, seconds=3))
    row = ScheduleRecord.objects.get(name="adder")
    assert row.next_at == T0 + timedelta(hours=1, seconds=10)
    assert fire_due(settings_of(), Clock(T0 + timedelta(hours=1, seconds=10))) == 1
    assert len(occurrence_tasks("adder")) == 1


def test_overlap_skip_waits_while_the_previous_run_is_ready_or_running():
    make(overlap="skip")
    clock = Clock(T0)
    assert fire_due(settings_of(), clock) == 1
    clock.now = T0 + timedelta(seconds=10)
    assert fire_due(settings_of(), clock) == 0  # the first is still READY
    skipped = ScheduleOccurrence.objects.get(at=clock.now)
    assert skipped.action == "skipped" and "READY" in skipped.reason
    TaskRecord.objects.update(status="SUCCESSFUL")
    clock.now = T0 + timedelta(seconds=20)
    assert fire_due(settings_of(), clock) == 1


def test_events_report_fires_skips_and_misses(django_capture_on_commit_callbacks):
    row = make(when="0 0 1 1 *", catch_up="latest", timezone_name="UTC", overlap="skip")
    row.next_at = datetime(2024, 1, 1, tzinfo=UTC)
    row.save()
    seen: list[events.Event] = []
    with (
        events.subscribed(seen.append, "schedule.fired", "schedule.skipped", "schedule.missed"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        fire_due(settings_of(), Clock(T0))
        api.update("adder", when=Every(seconds=10))
        ScheduleRecord.objects.filter(name="adder").update(next_at=T0)
        fire_due(settings_of(), Clock(T0))
    names = [(event.name, event.labels["schedule"]) for event in seen]
    assert names == [
        ("schedule.missed", "adder"),
        ("schedule.fired", "adder"),
        ("schedule.skipped", "adder"),
    ]
    assert seen[0].measurements["count"] == 2  # 2024 and 2025; 2026 fired
    assert "RUNNING" in seen[2].labels["reason"] or "READY" in seen[2].labels["reason"]


# -- the runtime API ------------------------------------------------------------------------


def test_the_api_refuses_bad_input_with_typed_errors_and_writes_nothing():
    with pytest.raises(InvalidSchedule, match="not a valid cron"):
        api.create("x", "tests.tasks.add", "every day")
    with pytest.raises(InvalidSchedule, match="unknown task"):
        api.create("x", "tests.tasks.nowhere", Every(seconds=5))
    with pytest.raises(InvalidSchedule, match="unknown time zone"):
        api.create("x", "tests.tasks.add", "0 1 * * *", timezone_name="Nowhere/City")
    assert not ScheduleRecord.objects.exists()
    with pytest.raises(ScheduleNotFound):
        api.get("x")
    with pytest.raises(ScheduleNotFound):
        api.pause("x")
    make()
    with pytest.raises(InvalidSchedule, match="exists already"):
        make()


def test_code_schedules_are_paused_and_run_but_not_edited_through_the_api():
    sync(settings_of(), declared(settings_of()), T0)
    name = "tests.scheduled_tasks.every_five_minutes"
    with pytest.raises(ScheduleNotEditable):
        api.update(name, when="* * * * *")
    with pytest.raises(ScheduleNotEditable):
        api.delete(name)
    assert api.pause(name).paused
    task_id = api.run_now(name)
    assert (
        TaskRecord.objects.get(pk=task_id).task_path == "tests.scheduled_tasks.every_five_minutes"
    )
    assert ScheduleOccurrence.objects.get(task_id=task_id).action == "run_now"


def test_runtime_schedules_are_updated_and_deleted():
    make()
    row = api.update("adder", when="*/2 * * * *", kwargs={}, args=[4, 5])
    assert row.cron == "*/2 * * * *" and row.every_seconds is None and row.args == [4, 5]
    api.delete("adder")
    assert not ScheduleRecord.objects.filter(name="adder").exists()


# -- manage.py schedules --------------------------------------------------------------------


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("schedules", *args, stdout=out)
    return out.getvalue()


def test_the_schedules_command_lists_pauses_resumes_and_runs():
    make()
    [listed] = json.loads(run_command("list", "--json"))
    assert listed["name"] == "adder" and listed["every_seconds"] == 10
    assert "paused" in run_command("pause", "adder")
    assert "paused" in run_command()
    run_command("resume", "adder")
    assert not ScheduleRecord.objects.get(name="adder").paused
    task_id = json.loads(run_command("run-now", "adder", "--json"))["last_task_id"]
    assert TaskRecord.objects.filter(pk=task_id).exists()
    with pytest.raises(CommandError, match="No schedule is called 'nope'"):
        run_command("pause", "nope")


# -- the admin page -------------------------------------------------------------------------


def test_the_admin_lists_schedules_and_pauses_resumes_and_runs_them(django_user_model):
    from tests.conftest import admin_client_for

    make()
    client = admin_client_for(
        "operator",
        django_user_model,
        view=["view_schedulerecord", "view_taskrecord"],
        actions=["change_schedulerecord"],
    )
    url = "/admin/django_tasks_plus/schedulerecord/"
    page = client.get(url).content.decode()
    assert "adder" in page and "every 10 s" in page and "active" in page
    row = ScheduleRecord.objects.get(name="adder")
    for action in ("pause", "resume", "run_now"):
        response = client.post(url, {"action": action, "_selected_action": [row.pk], "index": "0"})
        assert response.status_code == 302, action
        if action == "pause":
            assert ScheduleRecord.objects.get(pk=row.pk).paused
    row.refresh_from_db()
    assert not row.paused and row.last_task_id is not None
    from django.contrib.admin.models import LogEntry

    assert LogEntry.objects.filter(object_id=str(row.pk)).count() == 3
    viewer = admin_client_for(
        "staff_view_only", django_user_model, view=["view_schedulerecord"], actions=[]
    )
    viewer.post(url, {"action": "pause", "_selected_action": [row.pk], "index": "0"})
    assert not ScheduleRecord.objects.get(pk=row.pk).paused


def test_the_admin_shows_timing_in_words_history_of_runs_and_the_overview_card(
    django_user_model,
):
    from tests.conftest import admin_client_for

    make(when="0 14 * * 1-5", timezone_name="Europe/Berlin", overlap="skip")  # 12:00 UTC
    make("ticker", when=Every(seconds=10))
    api.pause("ticker")
    client = admin_client_for(
        "staff_view_only",
        django_user_model,
        view=["view_schedulerecord", "view_taskrecord"],
        actions=[],
    )
    url = "/admin/django_tasks_plus/schedulerecord/"
    page = client.get(url).content.decode()
    assert "at 14:00 on weekdays" in page and "<code>0 14 * * 1-5</code>" in page
    assert "every 10 seconds" in page and "Every(seconds=10)" in page

    row = ScheduleRecord.objects.get(name="adder")
    row.next_at = T0
    row.save()
    fire_due(settings_of(), Clock(T0))  # fired: its task stays READY
    ScheduleRecord.objects.filter(pk=row.pk).update(next_at=T0 + timedelta(days=3))
    fire_due(settings_of(), Clock(T0 + timedelta(days=3)))  # skipped: the first is READY
    [fired] = occurrence_tasks("adder")
    TaskRecord.objects.filter(pk=fired).update(status="FAILED")
    listed = client.get(url).content.decode()
    assert f"/admin/django_tasks_plus/taskrecord/{fired}/change/" in listed
    assert "dtp-badge-failed" in listed  # the last run's status, beside its link

    history = client.get(f"{url}{row.pk}/change/").content.decode()
    assert "dtp-history" in history
    assert history.count("<tr><td>") == 2  # the fired and the skipped occurrence
    assert f"/admin/django_tasks_plus/taskrecord/{fired}/change/" in history
    assert f"the previous run {fired} is READY" in history
    # the occurrence's time, date and clock in their own spans (a narrow column stacks them)
    assert '<span class="dtp-date">2026-06-01</span> <span class="dtp-clock">12:00:00</span>' in (
        history
    )

    overview = client.get("/admin/django_tasks_plus/taskrecord/overview/").content.decode()
    card = overview[overview.index('id="dtp-schedules-card"') :][:400]
    assert f'href="{url}"' in card and ">1 <small>+ 1 paused</small>" in card


def test_the_admin_creates_and_edits_runtime_schedules_code_ones_stay_read_only(
    django_user_model,
):
    from django.contrib.admin.models import ADDITION, CHANGE, LogEntry

    from tests.conftest import admin_client_for

    client = admin_client_for(
        "operator",
        django_user_model,
        view=["view_schedulerecord"],
        actions=["add_schedulerecord", "change_schedulerecord"],
    )
    url = "/admin/django_tasks_plus/schedulerecord/"
    entry = {
        "name": "digest",
        "backend_name": "default",
        "task_path": "tests.tasks.add",
        "cron": "",
        "every_seconds": "",
        "timezone": "Europe/Berlin",
        "args": "[1, 2]",
        "kwargs": "{}",
        "queue_name": "",
        "priority": "0",
        "catch_up": "latest",
        "catch_up_cap": "10",
        "overlap": "allow",
    }
    assert client.get(f"{url}add/").status_code == 200
    refused = [
        ({"cron": "61 8 * * *"}, "is not a valid cron string"),
        ({"cron": "0 8 * * *", "every_seconds": "60"}, "not both"),
        ({"cron": "0 8 * * *", "task_path": "tests.tasks.nowhere"}, "unknown task"),
        ({"cron": "0 8 * * *", "timezone": "Mars/Base"}, "unknown time zone"),
    ]
    for change, message in refused:
        page = client.post(f"{url}add/", {**entry, **change}).content.decode()
        assert message in page, change
    assert not ScheduleRecord.objects.exists()  # nothing written

    response = client.post(f"{url}add/", {**entry, "cron": "0 8 * * 1-5"})
    assert response.status_code == 302
    row = ScheduleRecord.objects.get(name="digest")
    assert row.source == "runtime" and row.args == [1, 2] and row.next_at is not None
    assert row.next_at.astimezone(ZoneInfo("Europe/Berlin")).hour == 8

    # Edited on its page: a new timing restarts it from its next occurrence; pausing.
    change_url = f"{url}{row.pk}/change/"
    assert 'name="cron"' in client.get(change_url).content.decode()
    edited = {**entry, "every_seconds": "90", "paused": "on"}
    assert client.post(change_url, edited).status_code == 302
    row.refresh_from_db()
    assert (row.cron, row.every_seconds, row.paused, row.name) == ("", 90, True, "digest")
    actions = set(
        LogEntry.objects.filter(object_id=str(row.pk)).values_list("action_flag", flat=True)
    )
    assert actions == {ADDITION, CHANGE}

    # A schedule from code: its page shows it, read-only; a POST changes nothing.
    sync(settings_of(), declared(settings_of()), T0)
    code = ScheduleRecord.objects.get(name="tests.scheduled_tasks.every_five_minutes")
    page = client.get(f"{url}{code.pk}/change/").content.decode()
    assert 'name="cron"' not in page and "every 5 minutes" in page
    assert client.post(f"{url}{code.pk}/change/", {**entry, "cron": "* * * * *"}).status_code == 403
    assert ScheduleRecord.objects.get(pk=code.pk).cron == "*/5 * * * *"


# -- metrics --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # a flush writes only outside a transaction
def test_fires_skips_and_misses_are_counted_per_schedule():
    from django_tasks_plus import metrics, registries
    from django_tasks_plus.metrics.catalog import ALL_TIME, feature_counters
    from django_tasks_plus.models import MetricRecord

    # The app's own feature: a test's reset of the registries keeps its names and counters.
    registries.reset()
    assert "schedule.fired" in events.bus().names
    assert "schedule_fires" in feature_counters().counters
    row = make(when="0 0 1 1 *", catch_up="latest", timezone_name="UTC", overlap="skip")
    row.next_at = datetime(2024, 1, 1, tzinfo=UTC)
    row.save()
    fire_due(settings_of(), Clock(T0))  # 2024, 2025 missed; 2026 fired
    # 2027: the 2026 run is still READY, so it is skipped.
    fire_due(settings_of(), Clock(datetime(2027, 1, 1, 0, 0, 1, tzinfo=UTC)))
    assert metrics.flush() > 0
    stored = {
        r.name: r.value
        for r in MetricRecord.objects.filter(minute=ALL_TIME, backend_name="default")
    }
    assert stored["schedule_fires{schedule=adder}"] == 1
    assert stored["schedule_misses{schedule=adder}"] == 2
    assert stored["schedule_skips{schedule=adder}"] == 1

    # The same on the Prometheus endpoint.
    from django.contrib.auth import get_user_model
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("ops", "ops@example.com", "pw"))
    text = client.get("/tasks/metrics/").content.decode()
    samples = {
        (sample.name, sample.labels.get("schedule")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("backend") == "default"
    }
    assert samples[("django_tasks_plus_schedule_fires_total", "adder")] == 1
    assert samples[("django_tasks_plus_schedule_misses_total", "adder")] == 2
    assert samples[("django_tasks_plus_schedule_skips_total", "adder")] == 1


# -- the occurrence in the task's metadata --------------------------------------------------


@pytest.mark.django_db(transaction=True)  # a real worker runs the task
def test_the_task_knows_its_schedule_and_occurrence_even_after_a_redrive(run_worker):
    from django_tasks_plus import get_metadata, redrive
    from django_tasks_plus.compat import TaskResultStatus
    from django_tasks_plus.schedules import Occurrence, occurrence_of

    # A recent occurrence (the worker's pruner keeps the history of recent days only),
    # and the schedule paused before the worker (its scheduler) starts.
    now = timezone.now()
    at = now.replace(second=now.second - now.second % 10, microsecond=0)
    api.create("reporter", "tests.tasks.reports_occurrence", Every(seconds=10))
    ScheduleRecord.objects.filter(name="reporter").update(next_at=at)
    assert fire_due(settings_of(), Clock(at + timedelta(seconds=2))) == 1
    api.pause("reporter")
    [task_id] = occurrence_tasks("reporter")
    assert get_metadata(str(task_id)) == {"schedule.name": "reporter", "schedule.at": at}
    assert occurrence_of(str(task_id)) == Occurrence("reporter", at)
    task_id = api.run_now("reporter")
    assert occurrence_of(task_id).schedule == "reporter"  # type: ignore[union-attr]
    from tests import tasks

    assert occurrence_of(tasks.add.enqueue(1, 2)) is None  # not enqueued by a schedule
    with pytest.raises(TypeError, match="takes a TaskContext"):
        occurrence_of(42)

    # The worker hands it to the task (its context), by the same accessor.
    assert run_worker("--burst").returncode == 0
    first = TaskRecord.objects.get(pk=occurrence_tasks("reporter")[0])
    assert first.status == TaskResultStatus.SUCCESSFUL
    assert first.return_value == ["reporter", at.isoformat()]
    # A redrive keeps it: the keys live for the call.
    TaskRecord.objects.filter(pk=first.pk).update(status=TaskResultStatus.FAILED)
    redrive(str(first.pk))
    assert TaskRecord.objects.get(pk=first.pk).status == TaskResultStatus.READY
    assert occurrence_of(str(first.pk)) == Occurrence("reporter", at)
    assert occurrence_of({"schedule.name": "x"}) is None  # a map without an occurrence
