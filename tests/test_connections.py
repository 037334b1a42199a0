"""The worker's database sessions, on PostgreSQL: its own statement bounds never reach
task code, even behind Django's connection pool (``db/unpooled.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db import dialect_for, worker_connection
from django_tasks_plus.db.unpooled import guard_pooled_sessions, is_pooled, outside_the_pool
from django_tasks_plus.models import WorkerRecord
from tests import tasks
from tests.conftest import wait_for, worker_log

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL only"),
]

FINAL = {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}


TIMEOUTS = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"


def _timeouts(wrapper: BaseDatabaseWrapper) -> list[str]:
    with wrapper.cursor() as cursor:
        cursor.execute(TIMEOUTS)
        return list(cursor.fetchone())


def _default_timeouts() -> list[str]:
    """What a session of this database starts with (the server's and role's defaults)."""
    return _timeouts(connection)


@pytest.fixture
def pooled() -> Iterator[type[BaseDatabaseWrapper]]:
    """A factory of wrappers for the test database behind a pool of one session (an
    alias of their own, so the test process's own pool, if any, is left alone)."""
    settings = connection.settings_dict
    options = {**settings["OPTIONS"], "pool": {"min_size": 1, "max_size": 1, "timeout": 10}}
    backend = load_backend(settings["ENGINE"])

    def make() -> BaseDatabaseWrapper:
        return backend.DatabaseWrapper({**settings, "OPTIONS": options}, "dtp-pool-probe")

    probe = make()
    yield make  # type: ignore[misc]
    probe.close_pool()


def _finished(result) -> bool:  # type: ignore[no-untyped-def]
    result.refresh()
    return result.status in FINAL


def _heartbeat_at(worker_id: str):  # type: ignore[no-untyped-def]
    return WorkerRecord.objects.values_list("last_heartbeat_at", flat=True).get(worker_id=worker_id)


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


def test_bookkeeping_bounds_only_sessions_outside_the_pool(pooled):
    """``worker_connection()`` refuses a pooled connection; inside ``outside_the_pool``
    the thread has a connection of its own, closed when the block ends."""
    in_pool = pooled()
    previous = connections["default"]
    connections["default"] = in_pool
    try:
        with pytest.raises(RuntimeError, match="outside_the_pool"):
            worker_connection("default", 3)
        assert in_pool.connection is None  # refused before connecting
        with outside_the_pool("default"):
            own = worker_connection("default", 3)
            assert own is not in_pool and not is_pooled(own)
            assert _timeouts(own) == ["3s", "1s"]
        assert connections["default"] is in_pool
        assert own.connection is None  # closed, not handed to a pool
        assert _timeouts(in_pool) == _default_timeouts()
    finally:
        connections["default"] = previous
        in_pool.close()


def test_a_pooled_session_carrying_the_worker_s_bounds_is_reset_before_use(pooled):
    """Whatever the pool returns: a session that went back bounded (which only a thread
    outside ``outside_the_pool`` could cause) gets its own settings back when the next
    thread takes it, before the task's first query."""
    defaults = _default_timeouts()
    guard_pooled_sessions()  # as the worker does at start
    first = pooled()
    first.ensure_connection()
    session = first.connection
    dialect_for(first).bound_worker_statements(first, 3)  # what worker_connection refuses
    assert _timeouts(first) == ["3s", "1s"]
    first.close()  # back into the pool, bounds and all

    second = pooled()
    try:
        second.ensure_connection()
        assert second.connection is session  # the pool's only session
        assert _timeouts(second) == defaults
    finally:
        second.close()
