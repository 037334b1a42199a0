"""Operators' input the commands and the admin must understand or refuse clearly: status
names in any case, filters that can never match, short task ids (issue 15, items 11-12).
"""

from __future__ import annotations

import re
import uuid
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse
from django.utils.html import escape

from django_tasks_plus.management.commands.canceltasks import Command as CancelCommand
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.selection import (
    AmbiguousTaskId,
    BadFilter,
    UnknownTaskId,
    resolve_task_ids,
)
from tests import tasks
from tests.test_admin_pages import dead_row

pytestmark = pytest.mark.django_db(transaction=True)


def command(name: str, *args: str, **options: object) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


def ready_with_id(task_id: str, queue: str = "default") -> str:
    """A READY task whose id is ``task_id`` (to make ids that share a prefix)."""
    made = tasks.echo.using(queue_name=queue).enqueue(task_id).id
    TaskRecord.objects.filter(pk=made).update(id=uuid.UUID(task_id))
    return task_id


def status_of(task_id: str) -> str:
    return TaskRecord.objects.get(pk=task_id).status


# -- statuses --------------------------------------------------------------------------------


def test_status_is_read_in_any_case_and_named_plainly():
    waiting = tasks.echo.using(queue_name="emails").enqueue("x").id
    out = command("canceltasks", "--status", "ready", "--queue", "emails")
    assert out.strip() == "Cancelled 1 waiting task."
    assert status_of(waiting) == "FAILED"
    with pytest.raises(CommandError) as raised:
        command("canceltasks", "--status", "done", "--queue", "emails")
    assert str(raised.value) == "--status done: use one of READY, RUNNING (any case)."
    help_text = CancelCommand().create_parser("manage.py", "canceltasks").format_help()
    assert "READY, RUNNING" in help_text
    assert "TaskResultStatus" not in help_text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--status", "READY", "--finished-before", "1h"),
            "--finished-before can never match a READY task: only SUCCESSFUL and FAILED "
            "tasks have a finish time.",
        ),
        (
            ("--finished-after", "2026-01-01"),
            "--finished-after can never match a READY or RUNNING task",
        ),
        (
            ("--reason-contains", "boom"),
            "--reason-contains can never match a READY or RUNNING task: only FAILED tasks "
            "have a dead-letter reason.",
        ),
    ],
)
def test_filters_that_can_never_match_the_statuses_are_refused(args, message):
    waiting = tasks.echo.enqueue("x").id
    with pytest.raises(CommandError, match=re.escape(message)):
        command("canceltasks", *args, yes=True)
    assert status_of(waiting) == "READY"


# -- short ids -------------------------------------------------------------------------------

TWINS = ("a1b2c3d4-0000-4000-8000-000000000001", "a1b2c3d4-1111-4000-8000-000000000002")
NEIGHBOUR = "a1b2c3d5-0000-4000-8000-000000000000"  # one past the twins' 8-digit prefix
LONE = "0f0e0d0c-1111-4111-8111-111111111111"


def test_a_unique_short_id_names_its_task():
    twins = [ready_with_id(task_id) for task_id in TWINS]
    lone = ready_with_id(LONE)
    neighbour = ready_with_id(NEIGHBOUR)
    out = command("canceltasks", "0F0E0D0C")  # the admin's 8 characters, any case
    assert out.strip() == "Cancelled 1 waiting task."
    assert status_of(lone) == "FAILED"
    # A longer prefix (with the hyphens of the full id) tells the twins apart.
    out = command("canceltasks", "a1b2c3d4-1", TWINS[1])
    assert out.strip() == "Cancelled 1 waiting task."
    assert [status_of(t) for t in twins] == ["READY", "FAILED"]
    assert status_of(neighbour) == "READY"


def test_an_ambiguous_short_id_lists_the_candidates_and_changes_nothing():
    for task_id in (*TWINS, NEIGHBOUR):
        ready_with_id(task_id)
    with pytest.raises(CommandError) as raised:
        command("canceltasks", "a1b2c3d4")
    assert str(raised.value) == (
        f"Task id 'a1b2c3d4' is ambiguous in backend 'default': it starts {TWINS[0]}, "
        f"{TWINS[1]}. Give more of the id."
    )
    assert {status_of(t) for t in (*TWINS, NEIGHBOUR)} == {"READY"}
    with pytest.raises(AmbiguousTaskId) as typed:
        resolve_task_ids(["A1B2C3D4"], "default", connection.alias)
    assert typed.value.candidates == TWINS


def test_unknown_and_malformed_short_ids_are_clear_errors():
    ready_with_id(LONE)
    with pytest.raises(UnknownTaskId, match=r"No task with id cafebabe, 0f0e0d0d in backend"):
        resolve_task_ids(["cafebabe", "0f0e0d0d", LONE[:8]], "default", connection.alias)
    with pytest.raises(CommandError, match="'0f0e0d' is too short for a task id: give at least 8"):
        command("redrivetasks", "0f0e0d")
    with pytest.raises(CommandError, match="'0f0e0d0g' is not a task id"):
        command("redrivetasks", "0f0e0d0g")
    with pytest.raises(BadFilter, match="is not a task id"):
        resolve_task_ids([LONE + "0"], "default", connection.alias)
    assert resolve_task_ids([LONE[:8], LONE, LONE[:13]], "default", connection.alias) == (LONE,)
    # Another backend's tasks are not this backend's.
    with pytest.raises(UnknownTaskId):
        resolve_task_ids([LONE[:8]], "other", connection.alias)


# -- the admin's lists and "all matching" pages ------------------------------------------------

BAD_QUERIES = {
    "finished_from=not-a-date": "finished_from: 'not-a-date' is not a time",
    "id__in=x": "id__in: not a filter of this page",
    "queue_name=emails&bogus=1": "bogus: not a filter of this page",
    "queue_name=emails&queue_name=default": "queue_name: given 2 times; give it once.",
    "finished_to=2026-13-45": "finished_to: '2026-13-45' is not a time",
    "q=meta:tenant=acme": "q: meta:tenant=acme: 'acme' is not a JSON value",
    "q=id:0f0e0d": "q: id:0f0e0d: '0f0e0d' is too short for a task id",
}


def admin_url(name: str, *args: object) -> str:
    return reverse(f"admin:django_tasks_plus_{name}", args=args)


@pytest.mark.parametrize("query", BAD_QUERIES)
def test_all_matching_refuses_a_filter_it_cannot_apply(admin_client, query):
    dead = [dead_row(queue_name="emails").pk, dead_row().pk]
    page = admin_url("taskrecord_matching", "redrive") + "?" + query
    asked = admin_client.get(page)
    assert asked.status_code == 400
    text = asked.content.decode()
    assert escape(BAD_QUERIES[query]) in text
    assert "<form" not in text.split('id="content-main"')[1]  # nothing to confirm
    done = admin_client.post(page)
    assert done.status_code == 400
    assert set(TaskRecord.objects.filter(pk__in=dead).values_list("status", flat=True)) == {
        "FAILED"
    }
    assert not LogEntry.objects.exists()


def test_all_matching_applies_the_backend_filter(admin_client):
    """With one backend configured its filter is not shown, but a ``backend_name`` in the
    URL is still applied (it used to be dropped, so ``nope`` matched every dead task)."""
    dead = [dead_row().pk, dead_row().pk]
    nope = admin_url("taskrecord_matching", "redrive") + "?backend_name=nope"
    assert "Redrive <strong>0</strong>" in admin_client.get(nope).content.decode()
    admin_client.post(nope)
    assert set(TaskRecord.objects.filter(pk__in=dead).values_list("status", flat=True)) == {
        "FAILED"
    }
    default = admin_url("taskrecord_matching", "redrive") + "?backend_name=default"
    assert "Redrive <strong>2</strong>" in admin_client.get(default).content.decode()
    listed = admin_client.get(admin_url("taskrecord_changelist") + "?backend_name=nope")
    assert listed.status_code == 200
    assert not any(f'title="{pk}"' in listed.content.decode() for pk in dead)


@pytest.mark.parametrize("page", ["taskrecord_changelist", "taskrecord_deadletters"])
def test_a_list_with_a_bad_filter_shows_the_error_not_every_row(admin_client, page):
    dead = dead_row()
    listed = admin_client.get(admin_url(page) + "?enqueued_from=notadate")
    assert listed.status_code == 400
    text = listed.content.decode()
    assert escape("enqueued_from: 'notadate' is not a time") in text
    assert f'title="{dead.pk}"' not in text
    unknown = admin_client.get(admin_url(page) + "?id__in=x")
    assert unknown.status_code == 400
    assert "id__in: not a filter of this page" in unknown.content.decode()
    # The dead letters offer no status filter: one there would be dropped, so it is refused.
    if page == "taskrecord_deadletters":
        assert admin_client.get(admin_url(page) + "?status__exact=READY").status_code == 400
    else:
        bad_status = admin_client.get(admin_url(page) + "?status__exact=ready")
        assert bad_status.status_code == 400
        assert escape("'ready' is not a status: use one of") in bad_status.content.decode()


def test_the_search_takes_the_short_id_the_list_shows(admin_client):
    wanted, other = dead_row(), dead_row()
    short = str(wanted.pk)[:8]
    text = admin_client.get(admin_url("taskrecord_changelist") + f"?q={short}").content.decode()
    assert f'title="{wanted.pk}"' in text
    assert f'title="{other.pk}"' not in text or str(other.pk).startswith(short)
    whole = admin_client.get(admin_url("taskrecord_changelist") + f"?q={wanted.pk}")
    assert f'title="{wanted.pk}"' in whole.content.decode()
