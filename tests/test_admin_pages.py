"""The operator's pages: the queue, a task's page, dead letters, workers, breakers.

Rows come from real ``runtasks`` processes where the page shows what a worker wrote
(attempts, tracebacks, heartbeats); rows made by hand are used only for states a test
cannot wait for (a heartbeat ten minutes old, a corrupt circuit). Every page is opened
with data and empty, every action is checked to change exactly its rows, and the
permission matrix covers every page and action (tests/test_admin.py covers the list's
own actions).
"""

from __future__ import annotations

import os
import re
import signal
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus import circuits
from django_tasks_plus.admin import display
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.durations import duration
from django_tasks_plus.models import BreakerRecord, TaskRecord, WorkerRecord
from tests import tasks
from tests.conftest import admin_client_for, wait_for, worker_row

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = ("anonymous", "non_staff", "staff_no_perms", "staff_view_only", "operator", "superuser")
VIEW_PERMS = ("view_taskrecord", "view_workerrecord", "view_breakerrecord")
ACTION_PERMS = (
    "redrive_taskrecord",
    "cancel_taskrecord",
    "discard_taskrecord",
    "run_now_taskrecord",
    "delete_taskrecord",
    "change_breakerrecord",
)
TASKS = "admin:django_tasks_plus_taskrecord_"


def url(name: str, *args: object) -> str:
    return reverse(f"admin:django_tasks_plus_{name}", args=args)


def make_client(role: str, django_user_model, *, enforce_csrf: bool = False) -> Client:
    return admin_client_for(
        role, django_user_model, view=VIEW_PERMS, actions=ACTION_PERMS, enforce_csrf=enforce_csrf
    )


def outcome_of(response) -> int | str:
    if response.status_code == 302 and "/login/" in response["Location"]:
        return "login"
    return response.status_code


def dead_row(**extra) -> TaskRecord:
    now = timezone.now()
    values = {
        "task_path": "tests.tasks.always_fails",
        "args": ["boom"],
        "status": TaskResultStatus.FAILED,
        "attempt": 3,
        "run_after": now,
        "enqueued_at": now,
        "finished_at": now,
        "dead_letter_reason": "gave up after 3 attempt(s); last error builtins.ValueError: boom",
        "errors": [
            {
                "exception_class_path": "builtins.ValueError",
                "traceback": "Traceback (most recent call last):\n  ...\nValueError: boom\n",
                "attempt": n,
                "worker_id": "w-1",
                "at": now.isoformat(),
            }
            for n in (1, 2, 3)
        ],
        "worker_ids": ["w-1", "w-1", "w-1"],
    }
    values.update(extra)
    return TaskRecord.objects.create(**values)


def admin_worker_row(worker_id: str = "w-1", *, silent_for: float = 0) -> WorkerRecord:
    return worker_row(
        worker_id,
        silent_for=timedelta(seconds=silent_for),
        hostname="host-a",
        pid=4242,
        queues=["default", "emails"],
        concurrency=4,
        started_at=timezone.now() - timedelta(seconds=silent_for + 60),
    )


def breaker_row(key: str = "api.example.com", **extra) -> BreakerRecord:
    values = {
        "backend_name": "default",
        "name": "http",
        "key": key,
        "state": "open",
        "failures": f'["{timezone.now().isoformat()}"]',
        "opened_at": timezone.now(),
        "updated_at": timezone.now(),
    }
    values.update(extra)
    return BreakerRecord.objects.create(**values)


# -- the pure rules ------------------------------------------------------------------------


def test_total_attempts_counts_attempts_across_redrives():
    errors = [{"worker_id": "w", "attempt": n} for n in (1, 2, 3)]
    assert display.total_attempts("FAILED", 3, errors) == 3
    assert display.total_attempts("READY", 0, errors) == 3  # just redriven
    assert display.total_attempts("RUNNING", 1, errors) == 4
    assert display.total_attempts("SUCCESSFUL", 1, errors) == 4
    # A cancellation before the task ran names no worker: not an attempt.
    cancelled = [*errors, {"worker_id": None, "attempt": 0}]
    assert display.total_attempts("FAILED", 0, cancelled) == 3
    assert display.total_attempts("READY", 2, []) == 2  # an edited errors column


def test_attempt_rows_split_runs_and_read_the_message():
    now = timezone.now()
    tb = "Traceback (most recent call last):\n  File x\nmodule.Boom: first line\nsecond line\n"
    errors = [
        {"exception_class_path": "module.Boom", "traceback": tb, "attempt": n, "worker_id": "w"}
        for n in (1, 2, 1)
    ]
    rows = display.attempt_rows(
        status="RUNNING",
        attempt=2,
        errors=errors,
        worker_ids=["w", "w", "w", "v"],
        last_attempted_at=now - timedelta(seconds=3),
        finished_at=None,
        now=now,
    )
    assert [(r.number, r.run, r.attempt) for r in rows] == [
        (1, 1, 1),
        (2, 1, 2),
        (3, 2, 1),
        (4, 2, 2),
    ]
    assert rows[0].message == "first line\nsecond line"
    assert rows[-1].outcome == "running" and rows[-1].worker == "v"
    assert rows[-1].duration == "3.0 s"


def test_durations_and_notes_read_like_a_person_wrote_them():
    now = timezone.now()
    assert duration(0.85) == "850 ms"
    assert duration(40) == "40 s"
    assert duration(185) == "3 min 5 s"
    note = display.waiting_note(
        "READY",
        attempt=1,
        run_after=now + timedelta(seconds=40),
        enqueued_at=now,
        last_attempted_at=now,
        finished_at=None,
        held_since=None,
        now=now,
    )
    assert note == "retry in 40 s"
    waiting = display.waiting_note(
        "READY",
        attempt=0,
        run_after=now - timedelta(minutes=3),
        enqueued_at=now - timedelta(minutes=3),
        last_attempted_at=None,
        finished_at=None,
        held_since=None,
        now=now,
    )
    assert waiting == "waiting 3 min"
    assert display.is_stale(now - timedelta(seconds=61), now, 60)
    assert not display.is_stale(now - timedelta(seconds=20), now, 60)


# -- pages with real worker data -------------------------------------------------------------


def test_a_dead_task_page_shows_each_attempt_and_redrive_keeps_the_history(
    admin_client, run_worker
):
    dead = tasks.always_fails.enqueue("the disk is full")
    done = tasks.add.enqueue(2, 3)
    assert run_worker("--burst").returncode == 0

    listing = admin_client.get(url("taskrecord_changelist")).content.decode()
    assert 'class="dtp-badge dtp-badge-failed"' in listing
    assert 'class="dtp-badge dtp-badge-successful"' in listing
    assert f'title="{dead.id}"' in listing  # the full id, shown short
    # the date, and the time to the second (stacked in the list's narrow column)
    assert re.search(
        r'"dtp-date">\d{4}-\d\d-\d\d</span> <span class="dtp-clock">\d\d:\d\d:\d\d<', listing
    )
    assert "ran " in listing  # run time of finished tasks

    page = admin_client.get(url("taskrecord_change", dead.id)).content.decode()
    assert page.count('<tr class="dtp-traceback-row">') == 3
    assert page.count("<details><summary>Traceback</summary>") == 3
    assert "the disk is full" in page and "builtins.ValueError" in page
    assert "\\n" not in page.split('dtp-attempts"')[1]  # real newlines, not escapes
    assert "&quot;the disk is full&quot;" in page  # args as pretty JSON
    success = admin_client.get(url("taskrecord_change", done.id)).content.decode()
    assert "<pre" in success and ">5</pre>" in success  # the return value
    assert "succeeded" in success

    admin_client.post(url("taskrecord_act", dead.id, "redrive"))
    row = TaskRecord.objects.get(pk=dead.id)
    assert row.status == TaskResultStatus.READY and row.attempt == 0
    assert len(row.errors) == 3  # history kept
    assert run_worker("--burst").returncode == 0
    listing = admin_client.get(url("taskrecord_changelist")).content.decode()
    # This run's attempts against the budget, and the total across both runs.
    assert ">3 / 3</span>" in listing and "(6 in total)" in listing
    page = admin_client.get(url("taskrecord_change", dead.id)).content.decode()
    assert page.count('<tr class="dtp-traceback-row">') == 6
    assert "<td>2 / 1</td>" in page  # the second run's first attempt


def test_a_task_behind_a_dead_ordering_key_says_what_blocks_it(admin_client, run_worker):
    dead = tasks.dies_and_blocks.using(ordering_key="acct-7").enqueue(1)
    waiting = tasks.add.using(ordering_key="acct-7").enqueue(2, 3)
    assert run_worker("--burst").returncode == 0
    assert TaskRecord.objects.get(pk=waiting.id).status == TaskResultStatus.READY

    page = admin_client.get(url("taskrecord_change", waiting.id)).content.decode()
    assert "Blocked by task" in page and "(dead)" in page
    assert url("taskrecord_change", dead.id) in page
    release = url("taskrecord_act", dead.id, "discard")
    assert f'action="{release}"' in page
    assert "?ordering_key=acct-7" in page  # the key's other tasks

    admin_client.post(release)
    assert not TaskRecord.objects.get(pk=dead.id).ordering_blocked
    assert TaskRecord.objects.get(pk=dead.id).status == TaskResultStatus.FAILED
    assert run_worker("--burst").returncode == 0
    assert TaskRecord.objects.get(pk=waiting.id).status == TaskResultStatus.SUCCESSFUL
    page = admin_client.get(url("taskrecord_change", waiting.id)).content.decode()
    assert "Blocked by task" not in page


def test_a_killed_worker_shows_stale_within_a_visibility_timeout(
    admin_client, start_worker, settings
):
    settings.TASKS = {
        "default": {
            "BACKEND": "django_tasks_plus.backend.DatabaseBackend",
            "QUEUES": ["default", "emails", "slow", "other"],
            "OPTIONS": {"VISIBILITY_TIMEOUT": 2},
        }
    }
    proc = start_worker("--visibility-timeout", "2")
    wait_for(WorkerRecord.objects.exists, timeout=60)
    page = lambda: admin_client.get(url("workerrecord_changelist")).content.decode()  # noqa: E731
    assert "ALIVE" in page()
    started = timezone.now()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: "STALE" in page(), timeout=60, interval=0.2)
    assert (timezone.now() - started).total_seconds() < 30


def test_workers_page_shows_in_flight_and_heartbeat_age(admin_client):
    admin_worker_row("w-live")
    admin_worker_row("w-dead", silent_for=600)
    now = timezone.now()
    for n in range(2):
        TaskRecord.objects.create(
            task_path="tests.tasks.add",
            status=TaskResultStatus.RUNNING,
            attempt=1,
            run_after=now,
            enqueued_at=now,
            worker_ids=["w-dead", "w-live"],  # the last id holds the lease
            lease_token=f"t{n}",
            lease_expires_at=now + timedelta(seconds=60),
        )
    page = admin_client.get(url("workerrecord_changelist")).content.decode()
    live, dead = page.split("w-dead</a>")[0], page.split("w-dead</a>")[1]
    assert "ALIVE" in page.split("w-live</a>")[1].split("</tr>")[0]
    assert "STALE" in dead.split("</tr>")[0]
    assert "?status__exact=RUNNING&amp;worker=w-live" in page
    assert "10 min ago" in page
    assert "default, emails" in page
    detail = admin_client.get(url("workerrecord_change", "w-live")).content.decode()
    assert "ALIVE" in detail and ">2</a>" in detail
    assert live


# -- filters, counts, ordering -----------------------------------------------------------------


def test_list_filters_narrow_the_list(admin_client):
    keep = dead_row(queue_name="emails", ordering_key="k1", dedup_key="d1")
    other = dead_row(task_path="tests.tasks.add", worker_ids=["w-9"])
    old = dead_row(enqueued_at=timezone.now() - timedelta(days=3))

    def ids(query: str) -> set[str]:
        text = admin_client.get(url("taskrecord_changelist") + query).content.decode()
        return {pk for pk in map(str, (keep.pk, other.pk, old.pk)) if f'title="{pk}"' in text}

    assert ids("") == {str(keep.pk), str(other.pk), str(old.pk)}
    assert ids("?queue_name=emails") == {str(keep.pk)}
    assert ids("?task_path=tests.tasks.add") == {str(other.pk)}
    assert ids("?ordering_key=k1") == {str(keep.pk)}
    assert ids("?dedup_key=d1") == {str(keep.pk)}
    assert ids("?worker=w-9") == {str(other.pk)}
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    assert ids(f"?enqueued_from={since}") == {str(keep.pk), str(other.pk)}
    assert ids(f"?q={keep.pk}") == {str(keep.pk)}
    assert ids("?status__exact=READY") == set()
    facets = admin_client.get(url("taskrecord_changelist") + "?_facets=1").content.decode()
    assert "Failed (3)" in facets
    assert "emails (1)" in facets and "default (2)" in facets
    bad = admin_client.get(url("taskrecord_changelist") + "?enqueued_from=yesterday")
    assert bad.status_code == 400 and "is not a time" in bad.content.decode()
    for column in range(1, 9):  # every column sorts
        assert admin_client.get(url("taskrecord_changelist") + f"?o={column}").status_code == 200


def test_dead_letters_show_reason_last_error_and_attempts(admin_client):
    dead = dead_row()
    TaskRecord.objects.create(
        task_path="tests.tasks.add",
        run_after=timezone.now(),
        enqueued_at=timezone.now(),
    )
    page = admin_client.get(url("taskrecord_deadletters")).content.decode()
    assert "Dead letters" in page
    assert f'title="{dead.pk}"' in page
    assert "gave up after 3 attempt(s)" in page
    assert "builtins.ValueError" in page and ">boom<" in page
    assert page.count('class="action-checkbox"') == 1  # the READY task is not listed
    assert "Redrive all matching" in page
    assert "waiting=" not in page  # dead tasks do not wait: no "waiting for" filter
    assert "waiting=held" in admin_client.get(url("taskrecord_changelist")).content.decode()


# -- "all matching the filter" -------------------------------------------------------------------


def test_redrive_all_matching_changes_exactly_the_filtered_rows(django_user_model):
    client = make_client("operator", django_user_model)
    emails = [dead_row(queue_name="emails") for _ in range(3)]
    others = [dead_row(queue_name="default") for _ in range(2)]
    ready = tasks.add.enqueue(1, 1)
    confirm = url("taskrecord_matching", "redrive") + "?queue_name=emails"

    page = client.get(confirm).content.decode()
    assert "<strong>3</strong> dead tasks" in page and "queue_name=emails" in page
    assert all(
        row.status == TaskResultStatus.FAILED
        for row in TaskRecord.objects.filter(pk__in=[r.pk for r in emails])
    )  # GET changed nothing

    response = client.post(confirm)
    assert response.status_code == 302
    assert "/dead-letters/?queue_name=emails" in response["Location"]
    for row in emails:
        row.refresh_from_db()
        assert (row.status, row.attempt, len(row.errors)) == (TaskResultStatus.READY, 0, 3)
    for row in others:
        row.refresh_from_db()
        assert row.status == TaskResultStatus.FAILED
    assert TaskRecord.objects.get(pk=ready.id).status == TaskResultStatus.READY
    entries = LogEntry.objects.all()
    assert {entry.object_id for entry in entries} == {str(row.pk) for row in emails}
    assert {entry.user.username for entry in entries} == {"operator"}
    assert {entry.get_change_message() for entry in entries} == {
        "Redriven from the admin: all 3 dead task(s) matching queue_name=emails."
    }


def test_release_all_matching_releases_only_blocking_rows(django_user_model):
    client = make_client("operator", django_user_model)
    blocking = dead_row(ordering_key="a", ordering_blocked=True)
    plain = dead_row()
    confirm = url("taskrecord_matching", "discard")
    assert "<strong>1</strong> dead task" in client.get(confirm).content.decode()
    client.post(confirm)
    blocking.refresh_from_db()
    plain.refresh_from_db()
    assert not blocking.ordering_blocked and blocking.status == TaskResultStatus.FAILED
    assert plain.status == TaskResultStatus.FAILED
    assert [e.object_id for e in LogEntry.objects.all()] == [str(blocking.pk)]


def test_cancel_from_the_task_page(django_user_model):
    client = make_client("operator", django_user_model)
    ready = tasks.add.enqueue(1, 1)
    other = tasks.add.enqueue(2, 2)
    page = client.get(url("taskrecord_change", ready.id)).content.decode()
    assert url("taskrecord_act", ready.id, "cancel") in page
    assert url("taskrecord_act", ready.id, "redrive") not in page  # not dead
    client.post(url("taskrecord_act", ready.id, "cancel"))
    assert TaskRecord.objects.get(pk=ready.id).status == TaskResultStatus.FAILED
    assert TaskRecord.objects.get(pk=other.id).status == TaskResultStatus.READY
    assert LogEntry.objects.get().get_change_message() == "Cancelled from the admin."


# -- breakers --------------------------------------------------------------------------------------


def test_breakers_page_shows_state_held_tasks_and_corrupt_rows(admin_client):
    row = breaker_row()
    breaker_row("bad.example.com", state="sideways")
    now = timezone.now()
    TaskRecord.objects.create(
        task_path="tests.tasks.deliver",
        run_after=now + timedelta(seconds=30),
        enqueued_at=now,
        breaker_key="http/api.example.com",
        held_since=now - timedelta(seconds=5),
    )
    page = admin_client.get(url("breakerrecord_changelist")).content.decode()
    assert "dtp-badge-open" in page and "dtp-badge-corrupt" in page
    assert "worked as closed" in page
    assert "breaker_key=http%2Fapi.example.com" in page  # the held tasks, linked
    detail = admin_client.get(url("breakerrecord_change", row.pk)).content.decode()
    assert "dtp-badge-open" in detail
    # When the open circuit lets a task probe: a recovery delay after it opened.
    status = next(s for s in circuits.breaker_states() if s.key == row.key)
    assert status.probe_at is not None and status.probe_at > row.opened_at
    assert "next probe" in detail and status.probe_at.isoformat() in detail
    held = TaskRecord.objects.get()
    task_page = admin_client.get(url("taskrecord_change", held.pk)).content.decode()
    assert "held by breaker" in task_page and url("breakerrecord_change", row.pk) in task_page


def test_force_close_and_open_change_only_the_selected_circuits(django_user_model):
    client = make_client("operator", django_user_model)
    chosen = breaker_row("a.example.com")
    other = breaker_row("b.example.com")
    response = client.post(
        url("breakerrecord_changelist"),
        {"action": "force_close", "_selected_action": [chosen.pk], "index": "0"},
    )
    assert response.status_code == 302
    states = {s.key: s.state for s in circuits.breaker_states("default")}
    assert states == {"a.example.com": "closed", "b.example.com": "open"}
    client.post(
        url("breakerrecord_changelist"),
        {"action": "force_open", "_selected_action": [chosen.pk], "index": "0"},
    )
    assert {s.key: s.state for s in circuits.breaker_states("default")}["a.example.com"] == "open"
    assert [e.get_change_message() for e in LogEntry.objects.order_by("pk")] == [
        "Forced closed from the admin.",
        "Forced open from the admin.",
    ]
    assert other.pk != chosen.pk


# -- every page, with data and empty ---------------------------------------------------------


PAGES = {
    "task list": lambda t, w, b: url("taskrecord_changelist"),
    "dead letters": lambda t, w, b: url("taskrecord_deadletters"),
    "task page": lambda t, w, b: url("taskrecord_change", t.pk),
    "worker list": lambda t, w, b: url("workerrecord_changelist"),
    "worker page": lambda t, w, b: url("workerrecord_change", w.pk),
    "breaker list": lambda t, w, b: url("breakerrecord_changelist"),
    "breaker page": lambda t, w, b: url("breakerrecord_change", b.pk),
}
LISTS = (
    "taskrecord_changelist",
    "taskrecord_deadletters",
    "workerrecord_changelist",
    "breakerrecord_changelist",
)


def test_every_list_opens_empty(admin_client):
    for name in LISTS:
        response = admin_client.get(url(name))
        assert response.status_code == 200, name
    confirm = admin_client.get(url("taskrecord_matching", "redrive"))
    assert confirm.status_code == 200
    assert "<strong>0</strong>" in confirm.content.decode()


# What each role gets: 200, 403 or "login".
PAGE_MATRIX = {
    "anonymous": "login",
    "non_staff": "login",
    "staff_no_perms": 403,
    "staff_view_only": 200,
    "operator": 200,
    "superuser": 200,
}


@pytest.mark.parametrize("role", ROLES)
def test_page_permission_matrix(role, django_user_model):
    client = make_client(role, django_user_model)
    task, worker, breaker = dead_row(), admin_worker_row(), breaker_row()
    seen = {
        page: outcome_of(client.get(link(task, worker, breaker))) for page, link in PAGES.items()
    }
    assert seen == dict.fromkeys(PAGES, PAGE_MATRIX[role])
    for operation in ("redrive", "discard"):  # the confirmation pages need the action's perm
        expected = PAGE_MATRIX[role] if role != "staff_view_only" else 403
        assert outcome_of(client.get(url("taskrecord_matching", operation))) == expected


def _task_for(operation: str) -> TaskRecord:
    if operation == "cancel":
        return TaskRecord.objects.get(pk=tasks.add.enqueue(1, 2).id)
    if operation == "discard":
        return dead_row(ordering_key="k", ordering_blocked=True)
    return dead_row()


def _task_changed(operation: str, row: TaskRecord) -> bool:
    row.refresh_from_db()
    if operation == "discard":
        return not row.ordering_blocked
    return row.status == (
        TaskResultStatus.READY if operation == "redrive" else TaskResultStatus.FAILED
    )


ALLOWED = {"operator", "superuser"}
DENIED = {"anonymous": "login", "non_staff": "login", "staff_no_perms": 403, "staff_view_only": 403}


@pytest.mark.parametrize("operation", ("redrive", "cancel", "discard"))
@pytest.mark.parametrize("role", ROLES)
def test_task_button_permission_matrix(role, operation, django_user_model):
    client = make_client(role, django_user_model)
    row = _task_for(operation)
    bystander = _task_for(operation)
    response = client.post(url("taskrecord_act", row.pk, operation))
    if role in ALLOWED:
        assert response.status_code == 302
        assert _task_changed(operation, row)
        assert not _task_changed(operation, bystander)
        assert LogEntry.objects.get().object_id == str(row.pk)
    else:
        assert outcome_of(response) == DENIED[role]
        assert not _task_changed(operation, row)
        assert not LogEntry.objects.exists()
    if role == "staff_view_only":
        page = client.get(url("taskrecord_change", row.pk)).content.decode()
        assert url("taskrecord_act", row.pk, operation) not in page  # no button shown


@pytest.mark.parametrize("operation", ("redrive", "discard"))
@pytest.mark.parametrize("role", ROLES)
def test_all_matching_permission_matrix(role, operation, django_user_model):
    client = make_client(role, django_user_model)
    row = _task_for(operation)
    response = client.post(url("taskrecord_matching", operation))
    if role in ALLOWED:
        assert response.status_code == 302
        assert _task_changed(operation, row)
    else:
        assert outcome_of(response) == DENIED[role]
        assert not _task_changed(operation, row)
        assert not LogEntry.objects.exists()


@pytest.mark.parametrize("action", ("force_close", "force_open"))
@pytest.mark.parametrize("role", ROLES)
def test_breaker_action_permission_matrix(role, action, django_user_model):
    client = make_client(role, django_user_model)
    row = (
        breaker_row(
            state="open" if action == "force_close" else "closed", opened_at=None, failures="[]"
        )
        if action == "force_open"
        else breaker_row()
    )
    response = client.post(
        url("breakerrecord_changelist"),
        {"action": action, "_selected_action": [row.pk], "index": "0"},
    )
    state = BreakerRecord.objects.get(pk=row.pk).state
    if role in ALLOWED:
        assert response.status_code == 302
        assert state == ("closed" if action == "force_close" else "open")
        return
    expected = {"anonymous": "login", "non_staff": "login", "staff_no_perms": 403}.get(role, 200)
    assert outcome_of(response) == expected
    assert state == ("open" if action == "force_close" else "closed")
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    "post",
    (
        lambda: url("taskrecord_act", dead_row().pk, "redrive"),
        lambda: url("taskrecord_matching", "redrive"),
    ),
    ids=("task button", "all matching"),
)
def test_task_actions_need_the_csrf_token(post, django_user_model):
    client = make_client("operator", django_user_model, enforce_csrf=True)
    response = client.post(post())
    assert response.status_code == 403
    assert not TaskRecord.objects.filter(status=TaskResultStatus.READY).exists()
    assert not LogEntry.objects.exists()


def test_breaker_actions_need_the_csrf_token(django_user_model):
    client = make_client("operator", django_user_model, enforce_csrf=True)
    row = breaker_row()
    response = client.post(
        url("breakerrecord_changelist"),
        {"action": "force_close", "_selected_action": [row.pk], "index": "0"},
    )
    assert response.status_code == 403
    assert BreakerRecord.objects.get(pk=row.pk).state == "open"


def test_task_buttons_refuse_get(admin_client):
    row = dead_row()
    assert admin_client.get(url("taskrecord_act", row.pk, "redrive")).status_code == 405
    row.refresh_from_db()
    assert row.status == TaskResultStatus.FAILED


# -- counting ----------------------------------------------------------------------------------


def test_a_long_list_is_estimated_not_counted(admin_client, monkeypatch):
    """Above ``ESTIMATE_ABOVE`` rows (by the planner) the list shows "about N" and runs no
    COUNT(*); where no planner estimate exists (SQLite) it counts exactly, as Django does.
    The threshold is lowered here so that a few rows are "long"."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_tasks_plus.admin import paginator

    monkeypatch.setattr(paginator, "ESTIMATE_ABOVE", 0)
    for _ in range(3):
        dead_row()
    with connection.cursor() as cursor:  # fresh statistics for the planner
        cursor.execute(
            "ANALYZE" if connection.vendor == "sqlite" else "ANALYZE django_tasks_plus_taskrecord"
        )
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url("taskrecord_changelist")).content.decode()
    counted = any("COUNT(" in query["sql"] for query in queries.captured_queries)
    if "JSON" in connection.features.supported_explain_formats:
        assert "about" in page and not counted
    else:
        assert "about" not in page and counted
        assert "3 tasks" in page


def test_a_hostile_errors_column_does_not_break_the_lists(admin_client):
    from django.db import connection

    row = dead_row()
    deep = "[" * 2000 + "]" * 2000
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    pk = TaskRecord._meta.pk.get_db_prep_value(row.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_tasks_plus_taskrecord SET errors = %s{cast} WHERE id = %s", [deep, pk]
        )
    for name in ("taskrecord_changelist", "taskrecord_deadletters"):
        response = admin_client.get(url(name))
        assert response.status_code == 200
        assert str(row.pk) in response.content.decode()


# -- readable lists (the layout itself: tests/test_browser.py) ----------------------------


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("tests.tasks.add", "tests.tasks.add"),
        ("example.tasks.deliver_webhook", "example.tasks.deliver_webhook"),  # 29: whole
        (
            "acme_billing.integrations.webhooks.tasks.deliver_invoice",
            "a.i.w.tasks.deliver_invoice",
        ),
        (
            "acme_billing.integrations.webhooks.notifications.deliver_invoice",
            "a.i.w.n.deliver_invoice",  # the module cut too, to fit
        ),
        (
            "a_long_module_name.a_function_name_longer_than_the_limit",
            "a.a_function_name_longer_than_the_limit",
        ),
    ],
)
def test_a_long_task_path_is_shortened_from_the_left(path, shown):
    from django_tasks_plus.admin import html

    assert html.short_path(path) == shown
    assert path.endswith(shown.rsplit(".", 1)[-1])  # the function's name is always whole


def test_the_list_shows_a_long_path_short_with_the_whole_path_on_hover(admin_client):
    long_path = "acme_billing.integrations.webhooks.tasks.deliver_invoice"
    dead_row(task_path=long_path)
    page = admin_client.get(url("taskrecord_changelist")).content.decode()
    assert f'<span class="dtp-path" title="{long_path}">a.i.w.tasks.deliver_invoice</span>' in page


def test_the_backend_column_shows_only_with_several_backends(admin_client):
    breaker_row()
    admin_worker_row()
    for name in ("breakerrecord_changelist", "workerrecord_changelist"):
        page = admin_client.get(url(name)).content.decode()
        assert "column-backend_name" not in page, name


def test_the_unfiltered_confirmation_says_it_acts_on_every_dead_task(django_user_model):
    client = make_client("operator", django_user_model)
    for _ in range(2):
        dead_row()
    page = client.get(url("taskrecord_matching", "redrive")).content.decode()
    assert "Redrive all <strong>2</strong> dead tasks (no filter is set)?" in page
    assert "matching <code>no filter</code>" not in page


def test_the_dead_letters_breadcrumb_ends_with_dead_letters(admin_client):
    page = admin_client.get(url("taskrecord_deadletters")).content.decode()
    crumbs = page[page.index('class="breadcrumbs dtp-breadcrumbs"') :]
    crumbs = crumbs[: crumbs.index("</div>")]
    assert crumbs.rstrip().endswith("Dead letters")
