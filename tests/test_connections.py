"""The worker's database sessions, on PostgreSQL with real worker processes: its own
statement bounds never reach task code, even behind Django's connection pool."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import WorkerRecord
from tests import tasks
from tests.conftest import wait_for, worker_log

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL only"),
]

FINAL = {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}


def _default_timeouts() -> list[str]:
    """What a session of this database starts with (the server's and role's defaults)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')")
        return list(cursor.fetchone())


def _finished(result) -> bool:  # type: ignore[no-untyped-def]
    result.refresh()
    return result.status in FINAL


def _heartbeat_at(worker_id: str):  # type: ignore[no-untyped-def]
    return WorkerRecord.objects.values_list("last_heartbeat_at", flat=True).get(
        worker_id=worker_id
    )


def test_task_sessions_never_carry_the_worker_s_timeouts_behind_a_pool(
    start_worker, markers, monkeypatch
):
    """The heartbeat's statements fail on a locked row (its lock timeout), so it closes
    its session; meanwhile a task keeps taking sessions from the pool. With the worker's
    bounds on pooled sessions, the task got the heartbeat's session, timeouts and all
    (and a 4 s query of a task failed on the worker's 3 s statement timeout)."""
    monkeypatch.setenv("DTP_DB_POOL", "true")
    defaults = _default_timeouts()
    cycling = tasks.session_timeouts.enqueue(until_marker="stop")
    start_worker("--visibility-timeout", "3", "--concurrency", "2", "--worker-id", "pooled")
    wait_for(lambda: cycling.refresh() or cycling.status == TaskResultStatus.RUNNING)

    with transaction.atomic():
        list(WorkerRecord.objects.select_for_update().filter(worker_id="pooled"))
        wait_for(lambda: "Heartbeat failed" in worker_log(markers))
    beaten_before = _heartbeat_at("pooled")
    wait_for(lambda: _heartbeat_at("pooled") > beaten_before)  # a session taken again
    (markers / "stop").touch()

    wait_for(lambda: _finished(cycling))
    assert cycling.status == TaskResultStatus.SUCCESSFUL, cycling.errors
    assert cycling.return_value == [defaults]

    sleeper = tasks.sleeps_in_database.enqueue(4)
    probes = [tasks.session_timeouts.enqueue() for _ in range(6)]
    for result in (sleeper, *probes):
        wait_for(lambda result=result: _finished(result))
    assert sleeper.status == TaskResultStatus.SUCCESSFUL, sleeper.errors
    assert [probe.return_value for probe in probes] == [[defaults]] * len(probes)
