"""A metrics flush lands exactly once: all its statements in one transaction with its
idempotency key, whatever fails (a lock held on some of its rows, a statement refused
half-way, a COMMIT whose answer is lost) and however often it is retried."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from django_tasks_plus import events, metrics
from django_tasks_plus.compat import task_backends
from django_tasks_plus.db.metrics import add_metrics
from django_tasks_plus.metrics.aggregate import aggregator
from django_tasks_plus.metrics.catalog import ALL_TIME
from django_tasks_plus.models import MetricFlush, MetricRecord
from django_tasks_plus.worker.metrics_flusher import MetricsFlusher
from django_tasks_plus.worker.pruner import Pruner
from tests.conftest import MANAGE, wait_for, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "tests.tasks.always_fails"
# More minutes than one upsert statement takes (160 rows), so that a flush needs two
# statements: the all-time rows sort first, the latest minutes last.
MINUTES = 200
FAILED_FLUSH = "Could not write the metrics of backend 'default'"


@pytest.fixture(autouse=True)
def nothing_counted() -> Iterator[None]:
    """Nothing left over (unsettled batches included) for the next module's tests."""
    yield
    aggregator().reset()


def _first_minute() -> int:
    """An epoch minute such that MINUTES minutes from it end before now."""
    return int(time.time() // 60) - MINUTES - 5


def _dead_letters(first_minute: int, count: int = MINUTES) -> None:
    """``count`` dead letters, one in each minute from ``first_minute`` on."""
    for i in range(count):
        metadata = {"backend": "default", "queue": "default", "task_path": PATH}
        aggregator().on_outcome(
            events.Event(events.TASK_DEAD_LETTERED, {}, metadata, (first_minute + i) * 60.0 + 1)
        )


def _minute(epoch_minute: int) -> datetime:
    return datetime.fromtimestamp(epoch_minute * 60, UTC)


def _dead_lettered(**filters: Any) -> int:
    rows = MetricRecord.objects.filter(backend_name="default", name="dead_lettered", **filters)
    return rows.aggregate(total=Sum("value"))["total"] or 0


def _warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(FAILED_FLUSH in record.getMessage() for record in caplog.records)


def test_a_flush_failing_half_way_counts_once_when_retried(caplog):
    """PostgreSQL: another session holds row locks on the latest minutes' rows while the
    worker's flusher runs (its lock_timeout makes each flush fail on the second statement),
    then lets go. SQLite (no row locks): a trigger refuses those rows, then is dropped. The
    first statement, with the all-time rows, must not land on its own either time."""
    caplog.set_level(logging.WARNING, "django_tasks_plus")
    first = _first_minute()
    held = [_minute(first + i) for i in range(MINUTES - 5, MINUTES)]
    # The rows to lock exist already (value 0), as after an earlier flush of those minutes.
    add_metrics(
        "default", [("default", minute, "default", PATH, "dead_lettered", 0) for minute in held]
    )
    _dead_letters(first)

    if connection.vendor == "postgresql":
        import psycopg

        params = connection.settings_dict
        locker = psycopg.connect(
            dbname=params["NAME"],
            user=params.get("USER") or None,
            host=params.get("HOST") or None,
            port=params.get("PORT") or None,
        )
        with locker.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM django_tasks_plus_metricrecord WHERE minute >= %s FOR UPDATE",
                [held[0]],
            )
        # The worker's flusher: statement_timeout 0.9 s, lock_timeout 0.3 s.
        flusher = MetricsFlusher("default", interval=0.1, bound_seconds=0.9)
        flusher.start()
        try:
            wait_for(lambda: _warnings(caplog) >= 2, timeout=60)
            locker.commit()  # the locks go
            wait_for(lambda: not aggregator().pending and not aggregator().unsettled, timeout=60)
        finally:
            locker.close()
            flusher.stop()
            flusher.join(30)
    else:
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TRIGGER dtp_test_refuse BEFORE INSERT ON django_tasks_plus_metricrecord "
                f"WHEN NEW.minute >= '{held[0]:%Y-%m-%d %H:%M:%S}' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        try:
            assert metrics.flush() == 0
            assert metrics.flush() == 0
        finally:
            with connection.cursor() as cursor:
                cursor.execute("DROP TRIGGER dtp_test_refuse")
        assert metrics.flush() == MINUTES + 1

    assert _warnings(caplog) >= 2
    assert _dead_lettered(minute=ALL_TIME) == MINUTES
    assert _dead_lettered(minute__gt=ALL_TIME) == MINUTES
    assert _dead_lettered(minute=held[-1]) == 1


def test_a_flush_outside_a_worker_waits_a_locked_row_only_so_long(caplog):
    """A flush from a session with no lock timeout (a web process's flush at enqueue)
    meets a count's row another session keeps locked (a process stalled inside its own
    flush): it gives up after ``FLUSH_LOCK_WAIT``, writes nothing, and keeps its counts
    for the next flush, which writes them once."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    from django_tasks_plus.db.metrics import FLUSH_LOCK_WAIT
    from tests.test_locked_rows import _other_session

    caplog.set_level(logging.WARNING, "django_tasks_plus")
    first = _first_minute()
    held = _minute(first + MINUTES - 1)
    add_metrics("default", [("default", held, "default", PATH, "dead_lettered", 0)])
    _dead_letters(first)
    locker = _other_session()  # autocommit: its transaction is opened below
    outcome: dict[str, float] = {}

    def flush() -> None:
        began = time.monotonic()
        try:
            outcome["written"] = metrics.flush()
        finally:
            outcome["took"] = time.monotonic() - began
            connection.close()

    try:
        locker.execute("BEGIN")
        locker.execute(
            "SELECT id FROM django_tasks_plus_metricrecord WHERE minute = %s FOR UPDATE", [held]
        )
        flusher = threading.Thread(target=flush)
        flusher.start()
        flusher.join(FLUSH_LOCK_WAIT + 10)
    finally:
        locker.close()
    flusher.join(30)
    assert FLUSH_LOCK_WAIT <= outcome["took"] < FLUSH_LOCK_WAIT + 5
    assert outcome["written"] == 0
    assert _warnings(caplog) == 1
    assert _dead_lettered(minute__gt=ALL_TIME) == 0  # nothing landed on its own
    assert metrics.flush() == MINUTES + 1
    assert _dead_lettered(minute=ALL_TIME) == MINUTES
    assert _dead_lettered(minute=held) == 1


def test_a_flush_whose_commit_answer_is_lost_counts_once(caplog):
    """The flush commits, but the caller sees an error (as when the connection drops
    before COMMIT's answer arrives): the retry under the same key adds nothing, and the
    counts made meanwhile are added once."""
    caplog.set_level(logging.WARNING, "django_tasks_plus")
    first = _first_minute()
    _dead_letters(first, 80)
    lost = []

    def lose_the_answer() -> None:
        lost.append(True)
        raise OperationalError("server closed the connection unexpectedly (the test)")

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "INSERT INTO django_tasks_plus_metricrecord" in sql and not lost:
            transaction.on_commit(lose_the_answer)  # runs once the commit has landed
        return result

    with connection.execute_wrapper(wrapper):
        assert metrics.flush() == 0
    assert lost
    assert "commit's outcome is unknown" in caplog.text
    assert _dead_lettered(minute=ALL_TIME) == 80  # it did land
    assert len(aggregator().unsettled["default"]) == 1

    _dead_letters(first + 100, 5)  # counted meanwhile
    metrics.flush()  # the same key again, with a new batch
    assert not aggregator().unsettled
    assert _dead_lettered(minute=ALL_TIME) == 85
    assert _dead_lettered(minute__gt=ALL_TIME) == 85
    assert MetricFlush.objects.filter(backend_name="default").count() == 2
    assert metrics.flush() == 0  # nothing left to send


def test_a_flush_inside_a_transaction_waits_for_the_next_one():
    """Joining the caller's transaction would tie the counts to its fate."""
    _dead_letters(_first_minute(), 3)
    with transaction.atomic():
        assert metrics.flush() == 0
    assert _dead_lettered(minute=ALL_TIME) == 0
    assert metrics.flush() == 4
    assert _dead_lettered(minute=ALL_TIME) == 3


def test_flush_keys_are_pruned_with_the_metrics_retention():
    now = timezone.now()
    old = MetricFlush.objects.create(
        id=uuid.UUID(int=0), backend_name="default", flushed_at=now - timedelta(days=8)
    )
    other = MetricFlush.objects.create(
        id=uuid.UUID(int=1), backend_name="other", flushed_at=now - timedelta(days=8)
    )
    _dead_letters(_first_minute(), 1)
    metrics.flush()
    pruner = Pruner(task_backends["default"].settings, clock=timezone.now, bound_seconds=30)
    pruner.tick()
    kept = set(MetricFlush.objects.values_list("id", flat=True))
    assert old.id not in kept
    assert other.id in kept  # another backend's retention is its own pruner's
    assert len(kept) == 2  # and the flush just made


class CommitAnswerLoser:
    """A TCP proxy to PostgreSQL that, once armed, forwards a COMMIT and then drops the
    connection instead of passing the server's answer back: the transaction is committed,
    and the client sees the connection fail."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            committing = threading.Event()
            threading.Thread(
                target=self._to_server, args=(client, server, committing), daemon=True
            ).start()
            threading.Thread(
                target=self._to_client, args=(server, client, committing), daemon=True
            ).start()

    def _to_server(self, client: socket.socket, server: socket.socket, committing: Any) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.armed.is_set() and b"COMMIT" in data:
                    committing.set()  # before the server can answer
                server.sendall(data)

    def _to_client(self, server: socket.socket, client: socket.socket, committing: Any) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if committing.is_set():  # the answer to COMMIT: lose it
                    self.armed.clear()
                    self.dropped.set()
                    break
                client.sendall(data)
        for end in (client, server):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


def test_a_commit_answer_lost_on_the_wire_counts_once(caplog):
    """PostgreSQL, for real: the server commits the flush, the connection drops before
    its answer arrives; the next flush resends the batch under its key and adds nothing."""
    if connection.vendor != "postgresql":
        pytest.skip("a TCP proxy in front of the PostgreSQL server")
    caplog.set_level(logging.WARNING, "django_tasks_plus")
    original = connection.settings_dict
    proxy = CommitAnswerLoser(
        original.get("HOST") or "127.0.0.1", int(original.get("PORT") or 5432)
    )
    connection.close()
    options = {**original.get("OPTIONS", {}), "sslmode": "disable"}  # COMMIT in plain text
    connection.settings_dict = {
        **original,
        "HOST": "127.0.0.1",
        "PORT": proxy.port,
        "OPTIONS": options,
    }
    try:
        _dead_letters(_first_minute(), 80)
        proxy.armed.set()
        assert metrics.flush() == 0
        assert proxy.dropped.is_set()
        assert "commit's outcome is unknown" in caplog.text
        assert len(aggregator().unsettled["default"]) == 1
        assert metrics.flush() == 0  # a new connection; the key is stored: nothing added
        assert not aggregator().unsettled
    finally:
        connection.close()
        connection.settings_dict = original
        proxy.close()
    assert _dead_lettered(minute=ALL_TIME) == 80
    assert _dead_lettered(minute__gt=ALL_TIME) == 80


def test_a_process_that_exits_writes_what_it_counted(tmp_path):
    """The app's at-exit flush: a process without a worker (a shell, a web process)
    that enqueues and exits before its first emit-time flush leaves its counts written."""
    code = "from tests import tasks; tasks.add.enqueue(1, 2); tasks.add.enqueue(2, 3)"
    proc = subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", code],
        env=worker_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    stored = MetricRecord.objects.filter(
        minute=ALL_TIME, name="enqueued", task_path="tests.tasks.add"
    )
    assert stored.aggregate(total=Sum("value"))["total"] == 2
    assert MetricFlush.objects.count() == 1  # one flush, at exit
