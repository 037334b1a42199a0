"""The leader gives a never-analyzed task table its first statistics (PostgreSQL).

Against the real server: the table's statistics are removed from ``pg_statistic`` (the
test user is a superuser, as CI's is) so that each test starts from a table as a new
deployment has it, whatever autovacuum did earlier in the session.
"""

from __future__ import annotations

import logging
import time

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from django_tasks_plus.compat import task_backends
from django_tasks_plus.db import dialect_for
from django_tasks_plus.db.base import table
from django_tasks_plus.worker.pruner import FIRST_STATISTICS_ROWS, Pruner
from tests import tasks
from tests.conftest import postgres_only, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _forget_statistics() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if not cursor.fetchone()[0]:
            pytest.skip("removing a table's statistics needs a superuser")
        cursor.execute("DELETE FROM pg_statistic WHERE starelid = %s::regclass", [table()])


def _has_statistics() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stats WHERE tablename = %s", [table()])
        return bool(cursor.fetchone()[0])


def _live_rows_counted(at_least: int) -> bool:
    """Whether the activity counters (flushed by each session about once a second) show
    ``at_least`` live rows in the task table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = %s::regclass", [table()]
        )
        return cursor.fetchone()[0] >= at_least


def _gather(seconds: float = 5.0) -> str:
    return dialect_for(connection).gather_first_statistics(
        connection, FIRST_STATISTICS_ROWS, seconds
    )


def _done_with(pruner: Pruner) -> None:
    """Close the session the pruner's turns opened (a worker's services close theirs as
    they stop), so the test database can be dropped."""
    if pruner.session is not None:
        pruner.session.close()
    connection.close()


def _fill(count: int) -> None:
    tasks.add.enqueue_many([((n, n), {}) for n in range(count)])


@postgres_only
def test_a_table_without_statistics_is_analyzed_once_it_has_grown():
    _forget_statistics()
    _fill(FIRST_STATISTICS_ROWS // 2)
    wait_for(lambda: _live_rows_counted(FIRST_STATISTICS_ROWS // 2), timeout=15)
    assert _gather() == "too few rows"
    assert not _has_statistics()

    _fill(FIRST_STATISTICS_ROWS)
    wait_for(lambda: _live_rows_counted(FIRST_STATISTICS_ROWS), timeout=15)
    assert _gather() == "gathered"
    assert _has_statistics()
    assert _gather() == "present"  # never again: later statistics are autovacuum's


@postgres_only
def test_a_user_who_may_not_analyze_the_table_is_answered_refused():
    """A role that may read the table but does not own it: PostgreSQL skips the table
    with a warning, not an error, and the answer says the statistics are still missing."""
    _forget_statistics()
    _fill(FIRST_STATISTICS_ROWS)
    wait_for(lambda: _live_rows_counted(FIRST_STATISTICS_ROWS), timeout=15)
    with connection.cursor() as cursor:
        cursor.execute("DROP ROLE IF EXISTS dtp_not_owner")
        cursor.execute("CREATE ROLE dtp_not_owner")
        cursor.execute(f"GRANT SELECT ON {connection.ops.quote_name(table())} TO dtp_not_owner")
        cursor.execute("SET ROLE dtp_not_owner")
    try:
        assert _gather() == "refused"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
            cursor.execute(f"REVOKE ALL ON {connection.ops.quote_name(table())} FROM dtp_not_owner")
            cursor.execute("DROP ROLE dtp_not_owner")
    assert not _has_statistics()


@postgres_only
def test_the_pruner_analyzes_once_and_then_stops_asking(caplog):
    _forget_statistics()
    pruner = Pruner(task_backends["default"].settings, clock=timezone.now, bound_seconds=30)
    pruner._first_statistics()
    assert pruner._statistics_due == 0.0  # too few rows: asked again next round

    _fill(FIRST_STATISTICS_ROWS)
    wait_for(lambda: _live_rows_counted(FIRST_STATISTICS_ROWS), timeout=15)
    with caplog.at_level(logging.INFO, logger="django_tasks_plus.worker"):
        pruner._first_statistics()
    _done_with(pruner)
    assert pruner._statistics_due is None
    assert "Analyzed the task table: it had no statistics yet" in caplog.text
    assert _has_statistics()


@postgres_only
def test_an_analyze_that_waits_on_a_lock_gives_up_and_is_tried_again_later(caplog):
    """Another session holds a lock ANALYZE conflicts with (a concurrent index build, a
    VACUUM): the pruner's turn gives up within its bound, logs, and asks again an
    interval later instead of every round."""
    _forget_statistics()
    _fill(FIRST_STATISTICS_ROWS)
    wait_for(lambda: _live_rows_counted(FIRST_STATISTICS_ROWS), timeout=15)
    settings = connection.settings_dict
    holder = psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        dbname=settings["NAME"],
    )
    try:
        holder.execute(f"LOCK TABLE {table()} IN SHARE UPDATE EXCLUSIVE MODE")
        pruner = Pruner(task_backends["default"].settings, clock=timezone.now, bound_seconds=0.6)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="django_tasks_plus.worker"):
            pruner._first_statistics()
        _done_with(pruner)
        assert time.monotonic() - started < 5
        assert pruner._statistics_due is not None
        assert pruner._statistics_due >= started + pruner.sweep_interval
        assert "Gathering the task table's first statistics failed" in caplog.text
    finally:
        holder.close()
    assert not _has_statistics()


@postgres_only
def test_a_leader_worker_analyzes_the_table_a_flood_filled(start_worker, tmp_path):
    """A real worker leads and its pruner analyzes the never-analyzed table (filled in a
    queue it does not serve, so the rows stay) in its first round."""
    _forget_statistics()
    tasks.add.using(queue_name="emails").enqueue_many(
        [((n, n), {}) for n in range(FIRST_STATISTICS_ROWS)]
    )
    wait_for(lambda: _live_rows_counted(FIRST_STATISTICS_ROWS), timeout=15)
    assert not _has_statistics()
    start_worker("--worker-id", "analyzing-leader", "--visibility-timeout", "3", "--queue", "other")
    wait_for(_has_statistics, timeout=60)
    wait_for(
        lambda: "Analyzed the task table" in (tmp_path / "worker-0.log").read_text(), timeout=10
    )


def test_an_unexpected_failure_is_logged_and_asked_again_an_interval_later(caplog, monkeypatch):
    """Whatever the dialect raises, the round goes on and the log is not filled every
    round: the question waits a sweep interval."""

    def broken(*args: object) -> str:
        raise RuntimeError("a catalog the dialect did not expect")

    monkeypatch.setattr(type(dialect_for(connection)), "gather_first_statistics", broken)
    pruner = Pruner(task_backends["default"].settings, clock=timezone.now, bound_seconds=30)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="django_tasks_plus.worker"):
        pruner._first_statistics()
    _done_with(pruner)
    assert pruner._statistics_due is not None
    assert pruner._statistics_due >= started + pruner.sweep_interval
    assert "first statistics failed unexpectedly" in caplog.text


def test_a_refused_analyze_is_logged_and_not_asked_again_this_term(caplog, monkeypatch):
    """The pruner's side of ``refused`` (a database user that does not own the table:
    the answer itself is tested above): one warning, and no question every round."""
    monkeypatch.setattr(
        type(dialect_for(connection)), "gather_first_statistics", lambda *args: "refused"
    )
    pruner = Pruner(task_backends["default"].settings, clock=timezone.now, bound_seconds=30)
    with caplog.at_level(logging.WARNING, logger="django_tasks_plus.worker"):
        pruner._first_statistics()
    _done_with(pruner)
    assert pruner._statistics_due is None
    assert "this database user may not ANALYZE it" in caplog.text


def test_a_database_without_the_step_is_asked_once():
    """SQLite keeps no statistics of this kind: the pruner stops asking after the first
    round (on PostgreSQL a table with statistics ends the asking the same way)."""
    pruner = Pruner(task_backends["default"].settings, clock=timezone.now, bound_seconds=30)
    if connection.vendor == "postgresql":
        _fill(10)  # an empty table gets no statistics from ANALYZE
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table())}")
        assert _gather() == "present"
    else:
        assert _gather() == "unsupported"
    pruner._first_statistics()
    _done_with(pruner)
    assert pruner._statistics_due is None
