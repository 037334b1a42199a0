"""The worker's database sessions, on PostgreSQL: its own statement bounds never reach
task code, even behind Django's connection pool (``db/unpooled.py``), and it holds as
many as docs/installation.md says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from django.utils import timezone

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db import dialect_for, worker_connection
from django_tasks_plus.db.leadership import current_leader
from django_tasks_plus.db.unpooled import guard_pooled_sessions, is_pooled, outside_the_pool
from django_tasks_plus.metrics.catalog import ALL_TIME
from django_tasks_plus.models import MetricRecord, WorkerRecord
from tests import tasks
from tests.conftest import REPO, wait_for, worker_log, worker_row

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
    """The heartbeat's touch fails on a locked worker row (its lock wait); meanwhile a
    task keeps taking sessions from the pool. With the worker's
    bounds on pooled sessions, the task got the heartbeat's session, timeouts and all
    (and a 4 s query of a task failed on the worker's 3 s statement timeout)."""
    monkeypatch.setenv("DTP_DB_POOL", "true")
    defaults = _default_timeouts()
    cycling = tasks.session_timeouts.enqueue(until_marker="stop")
    start_worker("--visibility-timeout", "3", "--concurrency", "2", "--worker-id", "pooled")
    wait_for(lambda: cycling.refresh() or cycling.status == TaskResultStatus.RUNNING)

    with transaction.atomic():
        list(WorkerRecord.objects.select_for_update().filter(worker_id="pooled"))
        wait_for(lambda: "touch of the worker row failed" in worker_log(markers))
    beaten_before = _heartbeat_at("pooled")
    wait_for(lambda: _heartbeat_at("pooled") > beaten_before)  # a session taken again
    # The failed statements cost no session: the leader's lock, on the session the
    # heartbeat shares, was kept throughout.
    assert "is now the leader" in worker_log(markers)
    assert "is no longer the leader" not in worker_log(markers)
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


# -- how many sessions a worker holds (docs/installation.md) -------------------------------

INSTALLATION = REPO / "docs" / "installation.md"
SESSION_COUNTS = re.compile(
    r"a follower holds \*\*(?P<follower>\d+)\*\* sessions and the leader \*\*(?P<leader>\d+)\*\*"
)


def _documented_counts() -> tuple[int, int, list[list[str]]]:
    """The follower's and the leader's session counts the docs give, and the rows of
    their table of sessions (name, held by, opened)."""
    text = INSTALLATION.read_text()
    section = text[text.index("### Connections per worker") :]
    section = section[: section.index("\n#", 1)]  # up to the next heading
    match = SESSION_COUNTS.search(" ".join(section.split()))
    assert match, "docs/installation.md no longer says how many sessions a worker holds"
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| Session")
    ]
    return int(match["follower"]), int(match["leader"]), rows


def _sessions(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [application_name],
        )
        return cursor.fetchone()[0]


def _ran(application_name: str, statement: str) -> bool:
    """Whether a session of that worker has run ``statement`` (its last one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s AND query LIKE %s",
            [application_name, f"%{statement}%"],
        )
        return cursor.fetchone() is not None


def _succeeded(result) -> bool:  # type: ignore[no-untyped-def]
    result.refresh()
    return result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.skipif(
    "connection.settings_dict['OPTIONS'].get('pool')", reason="a pool holds sessions of its own"
)
def test_the_installation_docs_give_each_worker_s_session_count(start_worker):
    """Once every service of a follower and a leader has run, each holds exactly the
    sessions docs/installation.md lists, plus one per task thread that used the database.

    Each worker's sessions are told apart by ``application_name`` (``PGAPPNAME``, and
    its worker id for the leadership session)."""
    follower_count, leader_count, rows = _documented_counts()
    every_worker = [row for row in rows if row[1].startswith("every worker")]
    assert (len(every_worker), len(rows)) == (follower_count, leader_count)

    now = timezone.now()
    # Evidence that each pruner ran: a dead worker's row and a metric past retention.
    worker_row("count-dead", silent_for=timedelta(days=1), hostname="gone")
    MetricRecord.objects.create(
        backend_name="default",
        minute=now - timedelta(days=30),
        queue_name="default",
        task_path="old",
        name="succeeded",
        value=1,
    )
    common = ("--visibility-timeout", "3", "--concurrency", "2")
    fast = {"DJANGO_SETTINGS_MODULE": "tests.settings_variants"}
    start_worker(
        *common, "--worker-id", "count-leader", "--queue", "emails",
        env={**fast, "DTP_SETTINGS_VARIANT": "fast-metrics", "PGAPPNAME": "count-leader"},
    )  # fmt: skip
    wait_for(lambda: current_leader("default", "default") == "count-leader")
    start_worker(
        *common, "--worker-id", "count-follower", "--queue", "other",
        env={**fast, "DTP_SETTINGS_VARIANT": "fast-metrics", "PGAPPNAME": "count-follower"},
    )  # fmt: skip

    # One task each, that does not touch the database: the claim loop and the outcome
    # writer have worked, and no task thread holds a session.
    on_leader = tasks.add.using(queue_name="emails").enqueue(1, 2)
    on_follower = tasks.add.using(queue_name="other").enqueue(3, 4)
    wait_for(lambda: _succeeded(on_leader) and _succeeded(on_follower))
    registered = dict(WorkerRecord.objects.values_list("worker_id", "started_at"))
    for worker in ("count-leader", "count-follower"):
        wait_for(lambda worker=worker: _heartbeat_at(worker) > registered[worker])
        wait_for(lambda worker=worker: _ran(worker, "LISTEN"))
    wait_for(lambda: not WorkerRecord.objects.filter(worker_id="count-dead").exists())
    wait_for(lambda: not MetricRecord.objects.filter(task_path="old").exists())
    # Both processes' flushers wrote their task's outcome.
    flushed = MetricRecord.objects.filter(minute=ALL_TIME, name="succeeded")
    wait_for(lambda: sum(flushed.values_list("value", flat=True)) >= 2)

    assert _sessions("count-follower") == follower_count
    assert _sessions("count-leader") == leader_count

    # The leader's lock sits on one of its sessions (named after its worker id).
    assert current_leader("default", "default") == "count-leader"

    # A task whose code queries: its thread keeps one session more.
    querying = tasks.session_timeouts.using(queue_name="other").enqueue()
    wait_for(lambda: _succeeded(querying))
    assert _sessions("count-follower") == follower_count + 1


def test_behind_a_pool_task_threads_share_its_sessions(start_worker):
    """With Django's pool (``max_size`` 2), eight task threads that all query hold at most
    the pool's two sessions between them, handing each back after its attempt: the
    worker's sessions stay the bookkeeping ones plus the pool's, however many threads."""
    start_worker(
        "--visibility-timeout", "3", "--concurrency", "8", "--worker-id", "pool-of-two",
        env={
            "DJANGO_SETTINGS_MODULE": "tests.settings_variants",
            "DTP_SETTINGS_VARIANT": "pool-of-two",
            "PGAPPNAME": "pool-of-two",
        },
    )  # fmt: skip
    follower_count, _, _ = _documented_counts()
    wait_for(lambda: _ran("pool-of-two", "LISTEN"))
    busy = [tasks.sleeps_in_database.enqueue(0.3) for _ in range(16)]
    seen = 0
    while not all(_succeeded(result) for result in busy):
        seen = max(seen, _sessions("pool-of-two"))
    assert all(_succeeded(result) for result in busy)
    assert follower_count < seen <= follower_count + 2
    assert _sessions("pool-of-two") <= follower_count + 2
