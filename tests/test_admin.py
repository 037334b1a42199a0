"""The admin: read-only pages and audited actions, for every kind of user.

The permission matrix below is the contract: who may see which page and who may run
which action. Actions are POSTs through Django's admin action form, so they also need
the CSRF token; each change is logged under the acting user.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import TaskRecord, WorkerRecord
from tests import tasks
from tests.conftest import admin_client_for, worker_row

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "non_staff", "staff_no_perms", "staff_view_only", "operator", "superuser")
VIEW_PERMS = ("view_taskrecord", "view_workerrecord")
ACTION_PERMS = (
    "redrive_taskrecord",
    "cancel_taskrecord",
    "discard_taskrecord",
    "run_now_taskrecord",
    "delete_taskrecord",
)
CHANGELIST = "admin:django_tasks_plus_taskrecord_changelist"


def make_client(role: str, django_user_model, *, enforce_csrf: bool = False) -> Client:
    return admin_client_for(
        role, django_user_model, view=VIEW_PERMS, actions=ACTION_PERMS, enforce_csrf=enforce_csrf
    )


def failed_record(**extra) -> TaskRecord:
    now = timezone.now()
    return TaskRecord.objects.create(
        task_path="tests.tasks.add",
        args=[1, 2],
        status=TaskResultStatus.FAILED,
        attempt=3,
        run_after=now,
        enqueued_at=now,
        finished_at=now,
        dead_letter_reason="gave up after 3 attempt(s)",
        **extra,
    )


def sent_to_login(response) -> bool:
    return response.status_code == 302 and "/login/" in response["Location"]


# -- pages ---------------------------------------------------------------------------------


def _pages() -> dict[str, Callable[[TaskRecord, WorkerRecord], str]]:
    task_url = "admin:django_tasks_plus_taskrecord_"
    return {
        "task list": lambda t, w: reverse(CHANGELIST),
        "dead letters": lambda t, w: reverse(CHANGELIST) + "?status__exact=FAILED",
        "task detail": lambda t, w: reverse(task_url + "change", args=[t.pk]),
        "task history": lambda t, w: reverse(task_url + "history", args=[t.pk]),
        "worker list": lambda t, w: reverse("admin:django_tasks_plus_workerrecord_changelist"),
        "worker detail": lambda t, w: reverse(
            "admin:django_tasks_plus_workerrecord_change", args=[w.pk]
        ),
        "task add": lambda t, w: reverse(task_url + "add"),
        "task delete": lambda t, w: reverse(task_url + "delete", args=[t.pk]),
    }


# What each role gets for each page: 200, 403, or "login" (redirected to the login page).
PAGE_MATRIX = {
    "anonymous": dict.fromkeys(_pages(), "login"),
    "non_staff": dict.fromkeys(_pages(), "login"),
    "staff_no_perms": dict.fromkeys(_pages(), 403),
    "staff_view_only": {**dict.fromkeys(_pages(), 200), "task add": 403, "task delete": 403},
    "operator": {**dict.fromkeys(_pages(), 200), "task add": 403, "task delete": 403},
    "superuser": {**dict.fromkeys(_pages(), 200), "task add": 403, "task delete": 403},
}


@pytest.mark.parametrize("role", ROLES)
def test_page_permission_matrix(role, django_user_model):
    client = make_client(role, django_user_model)
    record = failed_record()
    worker = worker_row("w-1")
    seen = {}
    for page, url in _pages().items():
        response = client.get(url(record, worker))
        seen[page] = "login" if sent_to_login(response) else response.status_code
    assert seen == PAGE_MATRIX[role]
    if PAGE_MATRIX[role]["task detail"] == 200:
        detail = client.get(_pages()["task detail"](record, worker)).content.decode()
        assert 'name="_save"' not in detail  # read-only: no form to change the row


# -- actions -------------------------------------------------------------------------------


def _ready_row() -> TaskRecord:
    return TaskRecord.objects.get(pk=tasks.add.enqueue(1, 2).id)


def _retrying_row() -> TaskRecord:
    """A READY task waiting an hour for its second attempt."""
    row = _ready_row()
    TaskRecord.objects.filter(pk=row.pk).update(
        attempt=1, run_after=timezone.now() + timedelta(hours=1)
    )
    row.refresh_from_db()
    return row


ACTIONS = {
    # action: (make the row it applies to, the row's status after, a field that shows it)
    "redrive_tasks": (failed_record, TaskResultStatus.READY, "Redriven from the admin."),
    "cancel_tasks": (_ready_row, TaskResultStatus.FAILED, "Cancelled from the admin."),
    "discard_tasks": (
        lambda: failed_record(ordering_key="k", ordering_blocked=True),
        TaskResultStatus.FAILED,
        "Discarded from the admin.",
    ),
    "run_now_tasks": (_retrying_row, TaskResultStatus.READY, "Made due now from the admin."),
    "delete_tasks": (failed_record, None, "Deleted from the admin."),
}
ALLOWED_TO_ACT = {"operator", "superuser"}


def _post_action(client: Client, action: str, record: TaskRecord):
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(record.pk)], "index": "0"},
    )


def _changed(action: str, record: TaskRecord) -> bool:
    if action == "delete_tasks":
        return not TaskRecord.objects.filter(pk=record.pk).exists()
    record.refresh_from_db()
    if action == "discard_tasks":
        return not record.ordering_blocked
    if action == "run_now_tasks":
        return record.run_after <= timezone.now()
    return record.status == ACTIONS[action][1]


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("role", ROLES)
def test_action_permission_matrix(role, action, django_user_model):
    client = make_client(role, django_user_model)
    record = ACTIONS[action][0]()
    response = _post_action(client, action, record)

    if role in ALLOWED_TO_ACT:
        assert response.status_code == 302  # back to the list, with a message
        assert _changed(action, record)
        entry = LogEntry.objects.get()
        assert entry.user.username == role
        assert entry.action_flag == (DELETION if action == "delete_tasks" else CHANGE)
        assert entry.object_id == str(record.pk)
        assert entry.get_change_message() == ACTIONS[action][2]
        return

    expected = {"anonymous": "login", "non_staff": "login", "staff_no_perms": 403}.get(role, 200)
    assert ("login" if sent_to_login(response) else response.status_code) == expected
    assert not _changed(action, record)
    assert not LogEntry.objects.exists()
    if role == "staff_view_only":  # the list shows, but without the action
        assert f'value="{action}"' not in response.content.decode()


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_need_the_csrf_token(action, django_user_model):
    client = make_client("operator", django_user_model, enforce_csrf=True)
    record = ACTIONS[action][0]()
    response = _post_action(client, action, record)
    assert response.status_code == 403
    assert not _changed(action, record)
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_do_nothing_on_get(action, django_user_model):
    client = make_client("superuser", django_user_model)
    record = ACTIONS[action][0]()
    response = client.get(
        reverse(CHANGELIST), {"action": action, "_selected_action": str(record.pk), "index": "0"}
    )
    # 400: the list refuses query parameters that are not its filters (docs/admin.md).
    assert response.status_code in (200, 302, 400)
    assert not _changed(action, record)
    assert not LogEntry.objects.exists()


def test_operator_sees_the_actions_and_a_summary(django_user_model):
    client = make_client("operator", django_user_model)
    dead = failed_record()
    ready = _ready_row()
    listing = client.get(reverse(CHANGELIST)).content.decode()
    for action in ACTIONS:
        assert f'value="{action}"' in listing

    response = client.post(
        reverse(CHANGELIST),
        {"action": "redrive_tasks", "_selected_action": [str(dead.pk), str(ready.pk)], "index": 0},
        follow=True,
    )
    text = response.content.decode()
    assert "1 task redriven. 1 was not dead-lettered and was left alone." in text
    assert LogEntry.objects.count() == 1


def test_superuser_sees_tasks_read_only(admin_client):
    result = tasks.add.enqueue(1, 2)
    changelist = admin_client.get(reverse(CHANGELIST))
    assert changelist.status_code == 200
    assert "tests.tasks.add" in changelist.content.decode()
    assert "Add task" not in changelist.content.decode()

    filtered = admin_client.get(reverse(CHANGELIST) + "?status__exact=FAILED")
    assert "tests.tasks.add" not in filtered.content.decode()

    post = admin_client.post(
        reverse("admin:django_tasks_plus_taskrecord_delete", args=[result.id]), {"post": "yes"}
    )
    assert post.status_code == 403
    assert TaskRecord.objects.filter(pk=result.id).exists()


def test_task_list_survives_a_row_nested_too_deeply_to_parse(django_user_model):
    """The list loads no JSON column, so a hostile row cannot break it for everyone."""
    from django.db import connection

    hostile = tasks.add.enqueue(1, 2)
    deep = "[" * 2000 + "]" * 2000  # valid JSON, deeper than Python's parser goes
    table = TaskRecord._meta.db_table
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    pk = TaskRecord._meta.pk.get_db_prep_value(uuid.UUID(hostile.id), connection)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET args = %s{cast} WHERE id = %s", [deep, pk])
        assert cursor.rowcount == 1
    client = make_client("superuser", django_user_model)
    response = client.get(reverse("admin:django_tasks_plus_taskrecord_changelist"))
    assert response.status_code == 200
    assert hostile.id in response.content.decode()


# -- run now, delete, and "all matching" on the task list ------------------------------------

MATCHING = "admin:django_tasks_plus_taskrecord_list_matching"


def test_run_now_is_guarded_against_a_worker_that_claimed_the_task_meanwhile():
    """The update holds only while the task is READY, not yet due, and in the wait the
    operator saw (its attempt count): a claim, or a claim that ran and rescheduled it,
    wins."""
    from django_tasks_plus import run_now

    row = _retrying_row()
    TaskRecord.objects.filter(pk=row.pk).update(status=TaskResultStatus.RUNNING)
    assert not run_now(str(row.pk), attempt=1)  # claimed: left to the worker
    later = timezone.now() + timedelta(hours=1)
    TaskRecord.objects.filter(pk=row.pk).update(
        status=TaskResultStatus.READY, attempt=2, run_after=later
    )
    assert not run_now(str(row.pk), attempt=1)  # ran and failed again: another wait
    assert TaskRecord.objects.get(pk=row.pk).run_after == later
    assert run_now(str(row.pk), attempt=2)
    assert TaskRecord.objects.get(pk=row.pk).run_after <= timezone.now()
    assert not run_now(str(row.pk))  # already due


def test_running_a_held_task_now_warns_that_its_breaker_holds_it_again(django_user_model):
    client = make_client("operator", django_user_model)
    row = _retrying_row()
    TaskRecord.objects.filter(pk=row.pk).update(
        held_since=timezone.now(), breaker_key="http/api.example.com"
    )
    page = client.get(reverse("admin:django_tasks_plus_taskrecord_change", args=[row.pk]))
    assert "dtp-run-now-warning" in page.content.decode()
    response = _post_action(client, "run_now_tasks", row)
    messages = [str(m) for m in response.wsgi_request._messages]
    assert "1 waiting task made due now." in messages
    assert any("held by a circuit breaker" in m for m in messages)


def test_the_task_page_runs_now_and_deletes(django_user_model):
    client = make_client("operator", django_user_model)
    row = _retrying_row()
    act = "admin:django_tasks_plus_taskrecord_act"
    page = client.get(reverse("admin:django_tasks_plus_taskrecord_change", args=[row.pk]))
    text = page.content.decode()
    assert reverse(act, args=[row.pk, "run-now"]) in text
    assert reverse(act, args=[row.pk, "delete"]) in text
    assert "dtp-run-now-warning" not in text  # not held
    client.post(reverse(act, args=[row.pk, "run-now"]))
    assert TaskRecord.objects.get(pk=row.pk).run_after <= timezone.now()
    due = client.get(reverse("admin:django_tasks_plus_taskrecord_change", args=[row.pk]))
    assert reverse(act, args=[row.pk, "run-now"]) not in due.content.decode()  # due already
    response = client.post(reverse(act, args=[row.pk, "delete"]))
    assert response.status_code == 302 and response["Location"] == reverse(CHANGELIST)
    assert not TaskRecord.objects.filter(pk=row.pk).exists()
    flags = list(LogEntry.objects.order_by("pk").values_list("action_flag", "change_message"))
    assert flags == [
        (CHANGE, "Made due now from the admin."),
        (DELETION, "Deleted from the admin."),
    ]


def test_a_running_task_is_not_deleted(django_user_model):
    client = make_client("operator", django_user_model)
    row = _ready_row()
    TaskRecord.objects.filter(pk=row.pk).update(status=TaskResultStatus.RUNNING)
    response = _post_action(client, "delete_tasks", row)
    messages = [str(m) for m in response.wsgi_request._messages]
    assert "0 tasks deleted. 1 was running (cancel it first) and was left." in messages
    assert TaskRecord.objects.filter(pk=row.pk).exists()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("operation", "changed"),
    [
        ("run-now", lambda rows: all(r.run_after <= timezone.now() for r in rows)),
        ("cancel", lambda rows: all(r.status == TaskResultStatus.FAILED for r in rows)),
        ("delete", lambda rows: not rows),
    ],
)
def test_all_matching_on_the_task_list_asks_then_acts_and_logs(
    operation, changed, django_user_model
):
    client = make_client("operator", django_user_model)
    chosen = [_retrying_row(), _retrying_row()]
    other = TaskRecord.objects.get(pk=tasks.add.using(queue_name="emails").enqueue(1, 1).id)
    url = reverse(MATCHING, args=[operation]) + "?queue_name=default"
    listing = client.get(reverse(CHANGELIST) + "?queue_name=default").content.decode()
    assert url.replace("&", "&amp;") in listing  # offered, with the list's filter

    asked = client.get(url)
    assert asked.status_code == 200 and asked.context["count"] == 2
    assert "queue_name=default" in asked.content.decode()
    assert not LogEntry.objects.exists()  # GET changes nothing

    assert client.post(url).status_code == 302
    left = list(TaskRecord.objects.filter(pk__in=[r.pk for r in chosen]))
    assert changed(left)
    assert TaskRecord.objects.get(pk=other.pk).status == TaskResultStatus.READY
    entries = LogEntry.objects.all()
    assert len(entries) == 2
    assert all("matching queue_name=default" in e.get_change_message() for e in entries)


@pytest.mark.parametrize("operation", ["run-now", "cancel", "delete"])
@pytest.mark.parametrize("role", ROLES)
def test_all_matching_on_the_task_list_needs_the_permission(operation, role, django_user_model):
    client = make_client(role, django_user_model)
    row = _retrying_row()
    response = client.post(reverse(MATCHING, args=[operation]))
    if role in ALLOWED_TO_ACT:
        assert response.status_code == 302
        return
    expected = {"anonymous": "login", "non_staff": "login"}.get(role, 403)
    assert ("login" if sent_to_login(response) else response.status_code) == expected
    assert TaskRecord.objects.get(pk=row.pk).run_after > timezone.now()
    assert TaskRecord.objects.get(pk=row.pk).status == TaskResultStatus.READY


@pytest.mark.parametrize("operation", ["run-now", "cancel", "delete"])
def test_all_matching_on_the_task_list_needs_the_csrf_token(operation, django_user_model):
    client = make_client("operator", django_user_model, enforce_csrf=True)
    row = _retrying_row()
    assert client.post(reverse(MATCHING, args=[operation])).status_code == 403
    assert TaskRecord.objects.get(pk=row.pk).run_after > timezone.now()
    assert not LogEntry.objects.exists()


def test_the_task_list_offers_no_redrive_of_all_matching(admin_client):
    assert admin_client.get(reverse(MATCHING, args=["redrive"])).status_code == 404


def test_a_bulk_action_with_many_failing_rows_shows_ten_and_counts_the_rest(admin_client):
    """Rows the action cannot change for a reason of their own (here: a backend alias no
    longer configured) get one message each up to ten, then one count: an action over
    thousands of rows must not leave thousands of messages in the session."""
    rows = [failed_record(backend_name="retired") for _ in range(12)]
    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "redrive_tasks", "_selected_action": [str(r.pk) for r in rows], "index": 0},
        follow=True,
    )
    errors = [m for m in response.context["messages"] if m.level_tag == "error"]
    assert len(errors) == 11
    assert all("retired" in str(m) for m in errors[:10])
    assert str(errors[10]) == "… and 2 more tasks could not be changed for such reasons."
    assert TaskRecord.objects.filter(status=TaskResultStatus.FAILED).count() == 12
