"""The breaker middleware against the real database, in this process (``circuits.py``).

Worker processes are exercised in ``test_breakers.py``; here each test calls the
middleware as the worker does, with a ``call_next`` that stands for the task, and reads
the circuit and the task rows it changed. ``transaction=True``: the middleware writes in
transactions of its own and skips recording inside a transaction a task left open.
"""

from __future__ import annotations

import io
import logging
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus import (
    Abort,
    Breaker,
    BreakerHeldTooLong,
    Hold,
    cancel,
    events,
    redrive,
    task,
)
from django_tasks_plus.breaker import State, failures_text
from django_tasks_plus.circuits import (
    breaker_middleware,
    breaker_states,
    force_close,
    force_open,
)
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.exceptions import Cancelled
from django_tasks_plus.middleware import Attempt
from django_tasks_plus.models import BreakerRecord, TaskRecord
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HOST = "inbox.example.com"
state_changes: list[tuple[str, str, str]] = []
drops: list[Any] = []


def _on_change(key: str, old: State, new: State) -> None:
    state_changes.append((key, old.value, new.value))


def _on_drop(key: str, details: Any) -> None:
    drops.append((key, details))


GUARD = Breaker(
    key=lambda url: url,
    name="inboxes",
    failure_threshold=2,
    failure_window=60,
    recovery_delay=60,
    held_ttl=3600,
    failures=(ConnectionError,),
    on_state_change=_on_change,
    on_drop=_on_drop,
)


@task(breaker=GUARD)
def deliver(url: str) -> str:
    return url


# The same circuits, with a release interval long enough that a closing probe waits for
# a late hold however slow the machine is (it stops waiting once the hold is written).
@task(breaker=replace(GUARD, release_interval=300))
def deliver_patiently(url: str) -> str:
    return url


@pytest.fixture(autouse=True)
def _clean_hooks() -> None:
    state_changes.clear()
    drops.clear()


def attempt(task_id: str = "t-1", *, held_since: Any = None, key: str = HOST) -> Attempt:
    return Attempt(
        id=task_id,
        task=deliver,
        task_path="tests.test_circuits.deliver",
        queue_name="default",
        priority=0,
        number=1,
        args=(key,),
        kwargs={},
        result=None,  # type: ignore[arg-type]
        backend="default",
        held_since=held_since,
        breaker_key=f"inboxes/{key}",
    )


def run(call: Any, task_attempt: Attempt | None = None) -> Any:
    return breaker_middleware(call)(task_attempt or attempt())


def raising(exc: BaseException) -> Any:
    def call(_attempt: Attempt) -> Any:
        raise exc

    return call


def circuit(name: str = "inboxes", key: str = HOST) -> BreakerRecord:
    return BreakerRecord.objects.get(name=name, key=key)


def waiting_task(*, held: bool = True, due_in: float = 3600, key: str = HOST) -> TaskRecord:
    now = timezone.now()
    return TaskRecord.objects.create(
        task_path="tests.test_circuits.deliver",
        args=[key],
        status=TaskResultStatus.READY,
        run_after=now + timedelta(seconds=due_in),
        enqueued_at=now - timedelta(minutes=1),
        breaker_key=f"inboxes/{key}",
        held_since=now - timedelta(minutes=1) if held else None,
    )


def half_open(probe: str = "probe-1") -> None:
    now = timezone.now()
    BreakerRecord.objects.create(
        backend_name="default",
        name="inboxes",
        key=HOST,
        state="half-open",
        failures="[]",
        opened_at=now - timedelta(minutes=5),
        probe_task_id=probe,
        probe_started_at=now,
        parked_until=now + timedelta(seconds=60),
        updated_at=now,
    )


def test_failures_up_to_the_threshold_open_the_circuit_and_tell_the_hook():
    for number in range(2):
        with pytest.raises(ConnectionError):
            run(raising(ConnectionError("refused")), attempt(f"t-{number}"))
    row = circuit()
    assert row.state == "open"
    assert row.opened_at is not None
    assert state_changes == [(HOST, "closed", "open")]


def test_an_open_circuit_holds_the_task_and_parks_the_keys_other_waiting_tasks():
    force_open(HOST, name="inboxes")
    sibling = waiting_task(held=False, due_in=-5)
    other_host = waiting_task(held=False, due_in=-5, key="other.example.com")
    seen: list[events.Event] = []
    with events.subscribed(seen.append, events.BREAKER_PARKED):
        answer = run(lambda _attempt: pytest.fail("the task must not run"))
    assert isinstance(answer, Hold)
    probe_at = circuit().opened_at + timedelta(seconds=60)
    assert answer.until == probe_at
    sibling.refresh_from_db()
    assert sibling.run_after == probe_at
    assert sibling.held_since is not None
    other_host.refresh_from_db()
    assert other_host.run_after < timezone.now()  # another key's task is left alone
    assert [event.measurements["count"] for event in seen] == [1]
    assert circuit().parked_until == probe_at

    # A second hold of the same key does not park again (one statement per wait).
    with events.subscribed(seen.append, events.BREAKER_PARKED):
        run(lambda _attempt: pytest.fail("the task must not run"), attempt("t-2"))
    assert len(seen) == 1


def test_the_probes_success_closes_the_circuit_and_releases_the_held_tasks():
    half_open()
    held = waiting_task()
    assert run(lambda _attempt: "delivered", attempt("probe-1")) == "delivered"
    assert circuit().state == "closed"
    held.refresh_from_db()
    assert held.run_after <= timezone.now()
    assert state_changes == [(HOST, "half-open", "closed")]
    [status] = breaker_states()
    assert status.held == 0  # released: due now, no longer held back


def test_a_hold_written_after_the_probe_closed_the_circuit_is_released_too():
    """Another worker decided to hold a task (until the probe would be stale) just before
    the probe succeeded, and writes that hold only after the release: the closing probe
    waits for that attempt to be written and releases it as well."""
    half_open()
    late = waiting_task(held=False)
    TaskRecord.objects.filter(pk=late.pk).update(
        status=TaskResultStatus.RUNNING, lease_token="late-hold"
    )
    stale_at = timezone.now() + timedelta(seconds=60)

    def other_worker_writes_its_hold() -> None:
        try:
            wait_for(lambda: circuit().state == "closed", timeout=30)
            TaskRecord.objects.filter(pk=late.pk, lease_token="late-hold").update(
                status=TaskResultStatus.READY,
                lease_token=None,
                run_after=stale_at,
                held_since=timezone.now(),
            )
        finally:
            connection.close()

    writer = threading.Thread(target=other_worker_writes_its_hold)
    writer.start()
    try:
        patient = Attempt(**{**_fields(attempt("probe-1")), "task": deliver_patiently})
        assert run(lambda _attempt: "delivered", patient) == "delivered"
    finally:
        writer.join()
    late.refresh_from_db()
    assert late.status == TaskResultStatus.READY
    assert late.run_after <= timezone.now()  # released, not left parked until stale_at


def _one_probe(waiting: int) -> tuple[int, int]:
    """One probe of a circuit with ``waiting`` tasks, as a worker claiming 4 at once runs
    it: the first probes; while it runs, its 3 batch-mates are held (their holds written
    as the worker writes them); then it succeeds. Returns the statements it took, and how
    many tasks of the key were due before the probe would have gone stale."""
    TaskRecord.objects.all().delete()
    BreakerRecord.objects.all().delete()
    now = timezone.now()
    BreakerRecord.objects.create(
        backend_name="default",
        name="inboxes",
        key=HOST,
        state="open",
        failures="[]",
        opened_at=now - timedelta(hours=1),
        updated_at=now,
    )
    rows = [waiting_task(held=False, due_in=-1) for _ in range(waiting)]
    batch = rows[:4]
    TaskRecord.objects.filter(pk__in=[row.pk for row in batch]).update(
        status=TaskResultStatus.RUNNING, lease_token="claimed"
    )
    due_early: list[int] = []

    def probe(_attempt: Attempt) -> str:
        for mate in batch[1:]:
            hold = run(lambda _a: pytest.fail("held"), attempt(str(mate.pk)))
            assert isinstance(hold, Hold)
            TaskRecord.objects.filter(pk=mate.pk).update(
                status=TaskResultStatus.READY,
                lease_token=None,
                run_after=hold.until,
                held_since=timezone.now(),
            )
        stale_at = circuit().probe_started_at + timedelta(seconds=60)
        due_early.append(
            TaskRecord.objects.filter(status=TaskResultStatus.READY, run_after__lt=stale_at).count()
        )
        TaskRecord.objects.filter(pk=batch[0].pk).update(lease_token="probing")
        return "delivered"

    with CaptureQueriesContext(connection) as queries:
        assert run(probe, attempt(str(batch[0].pk))) == "delivered"
    assert circuit().state == "closed"
    breaker_statements = [
        query["sql"]
        for query in queries.captured_queries
        if "breakerrecord" in query["sql"] or "taskrecord" in query["sql"]
    ]
    return len(breaker_statements), due_early[0]


def test_a_probe_takes_the_same_statements_whatever_the_number_of_waiting_tasks():
    """Held tasks join the park: while the probe runs, none of the key's tasks is due (so
    none is claimed again, each claim taking the circuit's lock and writing), and the
    probe costs the same statements with 10 or 30 tasks waiting."""
    few, due_with_few = _one_probe(10)
    many, due_with_many = _one_probe(30)
    assert (due_with_few, due_with_many) == (0, 0)
    assert few == many


@pytest.mark.parametrize("exc", [Abort("bad payload"), Cancelled("stop"), KeyError("x")], ids=type)
def test_a_probe_ending_neutral_frees_the_slot_and_releases_the_parked_tasks(exc):
    half_open()
    parked = waiting_task()
    with pytest.raises(type(exc)):
        run(raising(exc), attempt("probe-1"))
    row = circuit()
    assert row.state == "half-open"
    assert row.probe_task_id is None
    parked.refresh_from_db()
    assert parked.run_after <= timezone.now()  # one of them probes next, at once


def test_a_probe_failure_opens_the_circuit_again():
    half_open()
    with pytest.raises(ConnectionError):
        run(raising(ConnectionError("refused")), attempt("probe-1"))
    row = circuit()
    assert row.state == "open"
    assert row.probe_task_id is None
    assert state_changes == [(HOST, "half-open", "open")]


def test_a_task_held_past_its_ttl_is_dropped_and_on_drop_is_told():
    force_open(HOST, name="inboxes")
    since = timezone.now() - timedelta(hours=2)
    with pytest.raises(BreakerHeldTooLong, match="breaker held too long"):
        run(lambda _attempt: pytest.fail("must not run"), attempt("t-9", held_since=since))
    [(key, details)] = drops
    assert key == HOST
    assert details.task_id == "t-9"
    assert details.held_since == since
    assert details.args == (HOST,)


def test_a_task_uses_the_circuit_it_was_enqueued_under_after_a_rename():
    renamed = attempt("t-1")
    renamed = Attempt(**{**_fields(renamed), "breaker_key": f"old-name/{HOST}"})
    with pytest.raises(ConnectionError):
        run(raising(ConnectionError("refused")), renamed)
    assert BreakerRecord.objects.filter(name="old-name", key=HOST).exists()
    assert not BreakerRecord.objects.filter(name="inboxes").exists()


def _fields(value: Attempt) -> dict[str, Any]:
    return {name: getattr(value, name) for name in Attempt.__dataclass_fields__}


def test_a_corrupt_circuit_is_treated_as_closed_and_logged(caplog):
    now = timezone.now()
    BreakerRecord.objects.create(
        backend_name="default",
        name="inboxes",
        key=HOST,
        state="bogus",
        failures="not json",
        updated_at=now,
    )
    caplog.set_level(logging.WARNING, logger="django_tasks_plus.breakers")
    assert run(lambda _attempt: "ran") == "ran"
    assert "stored state is corrupt" in caplog.text


def _broken_hook(key: str, old: State, new: State) -> None:
    raise RuntimeError("hook bug")


@task(
    breaker=Breaker(
        key=lambda url: url, name="inboxes", failure_threshold=1, on_state_change=_broken_hook
    )
)
def fragile(url: str) -> str:
    return url


def test_a_hook_that_raises_is_logged_and_changes_nothing(caplog):
    caplog.set_level(logging.ERROR, logger="django_tasks_plus.breakers")
    guarded = Attempt(**{**_fields(attempt()), "task": fragile})
    with pytest.raises(ConnectionError):
        run(raising(ConnectionError("refused")), guarded)
    assert circuit().state == "open"
    assert "hook bug" in caplog.text


def test_a_success_clears_the_remembered_failures_of_a_closed_circuit():
    with pytest.raises(ConnectionError):
        run(raising(ConnectionError("refused")))
    assert circuit().failures != "[]"
    run(lambda _attempt: "ok")
    assert circuit().failures == failures_text([])
    assert circuit().state == "closed"


def test_exceptions_outside_failures_are_neutral():
    with pytest.raises(ValueError):
        run(raising(ValueError("not a host problem")))
    assert not BreakerRecord.objects.exists()  # nothing recorded, no row written


@pytest.mark.parametrize(
    ("key", "name"),
    [("", "inboxes"), ("x\x00y", "inboxes"), (HOST, "a/b"), (HOST, ""), ("k" * 300, "inboxes")],
)
def test_forcing_a_circuit_refuses_a_name_or_key_no_breaker_could_have(key, name):
    with pytest.raises(ValueError):
        force_open(key, name=name)
    with pytest.raises(ValueError):
        force_close(key, name=name)
    assert not BreakerRecord.objects.exists()


def test_an_outcome_is_not_recorded_inside_a_transaction_the_task_left_open(caplog):
    # The worker rolls such a transaction back and fails the attempt (TransactionLeaked);
    # a circuit write inside it would be rolled back too, so none is attempted.
    from django.db import transaction

    leaked = transaction.atomic()

    def leaks_then_fails(_attempt: Attempt) -> Any:
        leaked.__enter__()
        raise ConnectionError("refused")

    caplog.set_level(logging.WARNING, logger="django_tasks_plus.breakers")
    try:
        with pytest.raises(ConnectionError):
            run(leaks_then_fails)
    finally:
        leaked.__exit__(None, None, None)
    assert "left a transaction open" in caplog.text
    assert not BreakerRecord.objects.exists()


# -- redrive starts a new run (a held task cancelled, or dropped, then redriven) -------------


def _redrive_by_api(task_id: str, _client: Any) -> None:
    assert redrive(task_id) is True


def _redrive_by_command(task_id: str, _client: Any) -> None:
    call_command("redrivetasks", task_id, stdout=io.StringIO())


def _redrive_in_the_admin(task_id: str, client: Any) -> None:
    response = client.post(
        reverse("admin:django_tasks_plus_taskrecord_changelist"),
        {"action": "redrive_tasks", "_selected_action": [task_id], "index": 0},
        follow=True,
    )
    assert "1 task redriven." in response.content.decode()


@pytest.mark.parametrize(
    "redrive_by", [_redrive_by_api, _redrive_by_command, _redrive_in_the_admin], ids=str
)
def test_a_held_task_cancelled_then_redriven_is_held_again_not_dropped(redrive_by, admin_client):
    """It was first held two hours ago, longer than the held TTL (an hour): the new run's
    wait starts with its first hold, so the task is held, not dropped at its first claim.
    The cancel error stays in its history; the state of the cancelled run does not."""
    force_open(HOST, name="inboxes")
    row = waiting_task()
    TaskRecord.objects.filter(pk=row.pk).update(
        held_since=timezone.now() - timedelta(hours=2), attempt=3, worker_ids=["w-1"]
    )
    assert cancel(str(row.pk)).outcome == "cancelled"
    # A row cancelled before the fix kept these; whatever the path, redrive resets them.
    TaskRecord.objects.filter(pk=row.pk).update(
        held_since=timezone.now() - timedelta(hours=2),
        lease_token="stale-token",
        lease_expires_at=timezone.now() - timedelta(hours=1),
    )

    redrive_by(str(row.pk), admin_client)

    row.refresh_from_db()
    assert row.status == TaskResultStatus.READY
    assert (row.held_since, row.attempt, row.lease_token, row.lease_expires_at) == (
        None,
        0,
        None,
        None,
    )
    assert (row.finished_at, row.dead_letter_reason, row.cancel_requested) == (None, "", False)
    assert [error["exception_class_path"] for error in row.errors] == [
        "django_tasks_plus.exceptions.Cancelled"
    ]
    assert row.worker_ids == ["w-1"]  # history kept
    answer = run(
        lambda _attempt: pytest.fail("the circuit is open"),
        attempt(str(row.pk), held_since=row.held_since),
    )
    assert isinstance(answer, Hold)
    assert drops == []


def test_cancelling_a_held_task_ends_its_hold():
    row = waiting_task()
    assert cancel(str(row.pk)).outcome == "cancelled"
    row.refresh_from_db()
    assert (row.status, row.held_since) == (TaskResultStatus.FAILED, None)
