"""Operators' input the commands and the admin must understand or refuse clearly: status
names in any case, filters that can never match, short task ids (issue 15, items 11-12).
"""

from __future__ import annotations

import re
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_tasks_plus.management.commands.canceltasks import Command as CancelCommand
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.selection import (
    AmbiguousTaskId,
    BadFilter,
    UnknownTaskId,
    resolve_task_ids,
)
from tests import tasks

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
