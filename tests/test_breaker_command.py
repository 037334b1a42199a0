"""``manage.py breakers`` and the operator API it is built on (``circuits.py``).

Runs on the test database (SQLite or PostgreSQL); the circuits are written by the API
and, for corrupt ones, by hand, as a damaged or hand-edited row would be.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_tasks_plus import (
    Breaker,
    CircuitNotFound,
    InvalidBackendOptions,
    UnknownBreaker,
    compat,
    task,
)
from django_tasks_plus.breaker import declared_recovery
from django_tasks_plus.circuits import BreakerStatus, breaker_states, force_close, force_open
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import BreakerRecord, TaskRecord

pytestmark = pytest.mark.django_db

HOST = "inbox.example.com"


# The breakers the operator names below, declared as a project's task modules would: a
# name no stored circuit, waiting task or loaded Breaker uses is refused by force_open.
@task(breaker=Breaker(key=lambda host: host))
def ping(host: str) -> None: ...


@task(breaker=Breaker(key=lambda host: host, name="webhooks"))
def call_webhook(host: str) -> None: ...


@task(breaker=Breaker(key=lambda host: host, name="payments"))
def pay(host: str) -> None: ...


JSON_FIELDS = {
    "name",
    "key",
    "state",
    "failures",
    "last_failure_at",
    "opened_at",
    "probe_task_id",
    "probe_started_at",
    "probe_at",
    "held",
    "updated_at",
    "problem",
}


def breakers(*args: str, **options) -> str:
    out = StringIO()
    call_command("breakers", *args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def held_task(breaker_key: str, *, hours: float = 1.0, **extra) -> TaskRecord:
    """A READY task a breaker held: held_since set, due ``hours`` from now."""
    now = timezone.now()
    fields = {
        "task_path": "tests.tasks.add",
        "args": [1, 2],
        "status": TaskResultStatus.READY,
        "run_after": now + timedelta(hours=hours),
        "enqueued_at": now - timedelta(minutes=10),
        "breaker_key": breaker_key,
        "held_since": now - timedelta(minutes=5),
        **extra,
    }
    return TaskRecord.objects.create(**fields)


def corrupt_row(key: str, **columns) -> BreakerRecord:
    return BreakerRecord.objects.create(
        backend_name="default", name="default", key=key, updated_at=timezone.now(), **columns
    )


# -- list ------------------------------------------------------------------------------------


def test_no_breakers_lists_nothing():
    assert "No circuit breaker has stored a circuit in backend 'default'." in breakers()
    assert breakers("list") == breakers()
    assert json.loads(breakers(json=True)) == []


def test_list_shows_an_opened_circuit():
    force_open(HOST)
    (status,) = breaker_states()
    output = breakers("list")
    heading, row = output.splitlines()
    assert heading.split() == [
        "BREAKER",
        "KEY",
        "STATE",
        "FAILURES",
        "LAST",
        "FAILURE",
        "OPENED",
        "AT",
        "PROBE",
        "TASK",
        "NEXT",
        "PROBE",
        "HELD",
        "UPDATED",
    ]
    cells = row.split()
    opened = status.opened_at.isoformat(sep=" ", timespec="seconds")
    probe = "-" if status.probe_at is None else status.probe_at.isoformat(" ", "seconds")
    updated = status.updated_at.isoformat(sep=" ", timespec="seconds")
    # no failure yet; opened at (date and time); no probe; when one may; nothing held; updated
    assert cells == [
        *("default", HOST, "open", "0", "-", *opened.split(), "-"),
        *(*probe.split(), "0", *updated.split()),
    ]


def test_json_has_every_field_with_iso_times():
    force_open(HOST, name="webhooks")
    force_open("pay.example.com")
    held_task(f"webhooks/{HOST}")
    listed = json.loads(breakers(json=True))
    assert [(item["name"], item["key"]) for item in listed] == [
        ("default", "pay.example.com"),
        ("webhooks", HOST),
    ]
    for item in listed:
        assert set(item) == JSON_FIELDS
        assert item["state"] == "open"
        assert item["failures"] == 0
        assert item["last_failure_at"] is None
        assert item["probe_task_id"] is None
        assert item["problem"] == ""
        opened = timezone.datetime.fromisoformat(item["opened_at"])
        updated = timezone.datetime.fromisoformat(item["updated_at"])
        assert opened.tzinfo is not None and updated.tzinfo is not None
        assert abs(timezone.now() - opened) < timedelta(minutes=1)
    assert [item["held"] for item in listed] == [0, 1]
    # A "webhooks" breaker is loaded here: its probe is due a recovery delay after opening
    # (the last loaded breaker's of that name: other test modules declare one too).
    webhooks = listed[1]
    probe_at = timezone.datetime.fromisoformat(webhooks["probe_at"])
    recovery = declared_recovery("webhooks")
    assert recovery is not None
    assert probe_at == timezone.datetime.fromisoformat(webhooks["opened_at"]) + recovery


def test_list_refuses_a_key():
    with pytest.raises(CommandError, match="breakers list takes no KEY"):
        breakers("list", HOST)


# -- close and open --------------------------------------------------------------------------


def test_close_releases_the_held_tasks_of_that_key_only():
    force_open(HOST)
    held = [held_task(f"default/{HOST}") for _ in range(3)]
    other_breaker = held_task(f"webhooks/{HOST}")
    other_host = held_task("default/pay.example.com")
    not_held = held_task(f"default/{HOST}", held_since=None)  # deferred by itself
    done = held_task(f"default/{HOST}", status=TaskResultStatus.SUCCESSFUL)

    output = breakers("close", HOST)

    assert output.strip() == f"Circuit default/{HOST} closed; 3 held task(s) released."
    now = timezone.now()
    for record in held:
        record.refresh_from_db()
        assert record.run_after <= now
        assert record.status == TaskResultStatus.READY
        assert record.held_since is not None  # cleared when it runs
    for record in (other_breaker, other_host, not_held, done):
        before = record.run_after
        record.refresh_from_db()
        assert record.run_after == before > now
    row = BreakerRecord.objects.get(name="default", key=HOST)
    assert (row.state, row.failures, row.opened_at) == ("closed", "[]", None)


def test_close_with_a_name_and_json():
    force_open(HOST, name="webhooks")
    held_task(f"webhooks/{HOST}")
    report = json.loads(breakers("close", HOST, name="webhooks", json=True))
    assert report == {"name": "webhooks", "key": HOST, "state": "closed", "released": 1}
    assert BreakerRecord.objects.get(name="webhooks", key=HOST).state == "closed"


@pytest.mark.parametrize("name", [{}, {"name": "webhook"}], ids=["no --name", "a typo"])
def test_close_of_a_circuit_not_stored_is_refused_naming_the_keys_circuits(name):
    """The circuit is stored under 'webhooks': closing default/KEY (or webhook/KEY) would
    create a phantom closed circuit, report success and leave the real one open."""
    force_open(HOST, name="webhooks")
    held = held_task(f"webhooks/{HOST}")
    with pytest.raises(CommandError) as caught:
        breakers("close", HOST, **name)
    message = str(caught.value)
    assert "has stored circuits under: webhooks (open); give that name" in message
    assert [(s.name, s.key, s.state) for s in breaker_states()] == [("webhooks", HOST, "open")]
    before = held.run_after
    held.refresh_from_db()
    assert held.run_after == before  # nothing released


def test_close_of_a_key_with_no_circuit_at_all_is_refused():
    with pytest.raises(CommandError, match="no breaker has a stored circuit for"):
        breakers("close", HOST)
    assert not BreakerRecord.objects.exists()


def test_api_force_close_of_a_circuit_not_stored_raises_a_typed_error():
    force_open(HOST, name="webhooks")
    force_open(HOST, name="payments")
    with pytest.raises(CircuitNotFound) as caught:
        force_close(HOST)
    assert isinstance(caught.value, LookupError)
    assert (caught.value.name, caught.value.key) == ("default", HOST)
    assert caught.value.others == ("payments", "webhooks")
    assert not BreakerRecord.objects.filter(name="default").exists()


def test_open_under_a_name_nothing_uses_is_refused_unless_asked_for():
    with pytest.raises(CommandError) as caught:
        breakers("open", HOST, name="webhoks")
    message = str(caught.value)
    assert "No breaker named 'webhoks' is in use" in message
    assert "webhooks" in message and "--create" in message
    assert not BreakerRecord.objects.exists()

    output = breakers("open", HOST, name="webhoks", create=True)
    assert "Circuit webhoks/inbox.example.com opened" in output
    assert [(s.name, s.state) for s in breaker_states()] == [("webhoks", "open")]
    # Now a stored circuit uses the name: another key of it opens without --create.
    breakers("open", "other.example", name="webhoks")


def test_api_force_open_of_an_unknown_name_raises_a_typed_error_unless_create():
    with pytest.raises(UnknownBreaker) as caught:
        force_open(HOST, name="nobody")
    assert isinstance(caught.value, LookupError)
    assert caught.value.name == "nobody"
    assert {"default", "webhooks", "payments"} <= set(caught.value.known)
    assert not BreakerRecord.objects.exists()
    force_open(HOST, name="nobody", create=True)
    assert BreakerRecord.objects.get(name="nobody").state == "open"


def test_open_under_a_name_only_waiting_tasks_use_is_allowed():
    """Tasks enqueued under a breaker since renamed wait under the old name: an operator
    may open that name's circuits, though no loaded Breaker has it any more."""
    held_task("renamed/pay.example.com", held_since=None)
    force_open("pay.example.com", name="renamed")
    assert BreakerRecord.objects.get(name="renamed").state == "open"


def test_create_is_only_for_open():
    force_open(HOST)
    with pytest.raises(CommandError, match="--create applies to breakers open only"):
        breakers("close", HOST, create=True)
    assert BreakerRecord.objects.get(key=HOST).state == "open"


def test_open_creates_and_opens_the_row():
    output = breakers("open", HOST, name="webhooks")
    assert output.strip() == (
        f"Circuit webhooks/{HOST} opened; its tasks are held from their next claim on."
    )
    row = BreakerRecord.objects.get(backend_name="default", name="webhooks", key=HOST)
    assert row.state == "open"
    assert row.opened_at is not None
    assert abs(timezone.now() - row.opened_at) < timedelta(minutes=1)
    assert row.probe_task_id is None
    assert json.loads(breakers("open", HOST, name="webhooks", json=True))["state"] == "open"
    assert BreakerRecord.objects.filter(key=HOST).count() == 1


def test_open_overrides_a_half_open_circuit():
    corrupt_row(
        HOST,
        state="half-open",
        opened_at=timezone.now() - timedelta(hours=1),
        probe_task_id="0190aaaa-0000-7000-8000-000000000000",
        probe_started_at=timezone.now() - timedelta(seconds=5),
    )
    listed = breaker_states()
    assert listed[0].state == "half-open"
    assert listed[0].probe_task_id == "0190aaaa-0000-7000-8000-000000000000"
    assert "0190aaaa-0000-7000-8000-000000000000" in breakers()
    breakers("open", HOST)
    row = BreakerRecord.objects.get(key=HOST)
    assert (row.state, row.probe_task_id, row.probe_started_at) == ("open", None, None)


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        (("close",), {}, "breakers close needs the circuit's KEY"),
        (("open",), {}, "breakers open needs the circuit's KEY"),
        (("open", ""), {}, "KEY must be non-empty text without NUL"),
        (("open", "x" * 205), {}, "KEY is 205 characters; at most 204 are stored"),
        (("open", HOST), {"name": "a/b"}, "--name must not contain '/'"),
        (("open", HOST), {"name": ""}, "--name must be a non-empty name"),
        (("open", HOST), {"name": "n" * 51}, "--name must be a non-empty name of at most 50"),
        (("shut", HOST), {}, "invalid choice: 'shut'"),
        ((), {"action": "shut"}, "Unknown action 'shut'"),
    ],
)
def test_bad_arguments_are_command_errors(args, options, message):
    with pytest.raises(CommandError, match=message):
        breakers(*args, **options)
    assert not BreakerRecord.objects.exists()


# -- corrupt rows ----------------------------------------------------------------------------


def test_corrupt_rows_are_listed_as_corrupt_with_the_problem():
    corrupt_row("bad-state.example", state="sideways")
    corrupt_row("bad-times.example", state="closed", failures="not json")
    corrupt_row("no-time.example", state="open", opened_at=None)
    force_open(HOST)

    statuses = {status.key: status for status in breaker_states()}
    assert statuses["bad-state.example"].state == "corrupt"
    assert statuses["bad-state.example"].problem == "unknown state 'sideways'"
    assert statuses["bad-times.example"].state == "corrupt"
    assert statuses["bad-times.example"].problem.startswith("unreadable failure times")
    assert statuses["no-time.example"].problem == "open, but with no time it opened"
    assert statuses[HOST].state == "open"

    output = breakers()
    lines = {line.split()[1]: line for line in output.splitlines()[1:5]}
    assert lines["bad-state.example"].split()[2] == "corrupt"
    assert (
        "default/bad-state.example: the stored state is corrupt (unknown state 'sideways'); "
        "workers treat it as closed." in output
    )
    listed = {item["key"]: item for item in json.loads(breakers(json=True))}
    assert listed["no-time.example"]["state"] == "corrupt"
    assert listed["no-time.example"]["problem"] == "open, but with no time it opened"


def test_closing_a_corrupt_row_repairs_it():
    corrupt_row(HOST, state="sideways", failures="{")
    held_task(f"default/{HOST}")
    assert "1 held task(s) released" in breakers("close", HOST)
    row = BreakerRecord.objects.get(key=HOST)
    assert (row.state, row.failures) == ("closed", "[]")
    assert breaker_states()[0].problem == ""


# -- backends --------------------------------------------------------------------------------


def test_unknown_backend_is_a_command_error():
    with pytest.raises(CommandError, match=r"Unknown task backend 'nope'; TASKS configures: "):
        breakers(backend="nope")
    with pytest.raises(CommandError, match="Unknown task backend 'nope'"):
        breakers("close", HOST, backend="nope")


def test_a_backend_that_is_not_ours_is_a_command_error():
    package = compat.Task.__module__.rpartition(".")[0]  # django.tasks or django_tasks
    tasks_setting = {
        **settings.TASKS,
        "dummy": {"BACKEND": f"{package}.backends.dummy.DummyBackend"},
    }
    with override_settings(TASKS=tasks_setting):
        with pytest.raises(CommandError, match=r"DummyBackend; manage.py breakers needs"):
            breakers(backend="dummy")
        with pytest.raises(CommandError, match=r"DummyBackend; manage.py breakers needs"):
            breakers("open", HOST, backend="dummy")
        # The Python API refuses it too.
        for call in (breaker_states, lambda alias: force_open(HOST, backend=alias)):
            with pytest.raises(InvalidBackendOptions, match="not django_tasks_plus' Database"):
                call("dummy")
    assert not BreakerRecord.objects.exists()


# -- the Python API --------------------------------------------------------------------------


def test_api_breaker_states_counts_held_tasks_per_key():
    force_open(HOST)
    force_open("pay.example.com", name="payments")
    for _ in range(2):
        held_task(f"default/{HOST}")
    held_task(f"default/{HOST}", held_since=None)  # not held: deferred by itself
    held_task(f"default/{HOST}", status=TaskResultStatus.RUNNING)  # claimed: not waiting
    held_task("payments/pay.example.com")
    held_task("default/never-failed.example")  # no stored circuit: not listed

    statuses = breaker_states("default")
    assert all(isinstance(status, BreakerStatus) for status in statuses)
    assert [(s.name, s.key, s.state, s.held) for s in statuses] == [
        ("default", HOST, "open", 2),
        ("payments", "pay.example.com", "open", 1),
    ]
    assert statuses[0].opened_at is not None
    assert statuses[0].updated_at >= statuses[0].opened_at


def test_api_force_close_returns_the_released_count_and_force_open_returns_none():
    assert force_open(HOST) is None
    held = held_task(f"default/{HOST}")
    assert force_close(HOST) == 1
    held.refresh_from_db()
    assert held.run_after <= timezone.now()
    assert force_close(HOST) == 0  # already due: nothing more to release
    assert breaker_states()[0].state == "closed"


def test_api_lists_failures_remembered():
    last = timezone.now() - timedelta(seconds=30)
    first = last - timedelta(seconds=60)
    corrupt_row(HOST, failures=json.dumps([last.isoformat(), first.isoformat()]))
    (status,) = breaker_states()
    assert (status.state, status.failures, status.last_failure_at) == ("closed", 2, last)
    cells = breakers().splitlines()[1].split()
    assert cells[1:6] == [HOST, "closed", "2", *last.isoformat(sep=" ", timespec="seconds").split()]
