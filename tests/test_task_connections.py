"""Task threads' database connections under faults, against real databases and real
worker processes: a timeout that lands inside Django's transaction bookkeeping, a
transaction only the driver knows about, and sessions the database terminates while
``task_finished`` receivers run (docs/worker.md, "Task code and the database connection").
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connection, transaction

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.exceptions import TaskTimeout
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.execution import _run_all
from django_tasks_plus.worker.hygiene import clean_up_after_attempt
from django_tasks_plus.worker.timeouts import AttemptTimer, interrupted
from tests import tasks
from tests.conftest import postgres_only, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receipts():  # type: ignore[no-untyped-def]
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {tasks.RECEIPTS_TABLE} (task_id text NOT NULL, backend_pid integer)"
        )
    yield tasks.RECEIPTS_TABLE
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {tasks.RECEIPTS_TABLE}")


def _ledger() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n FROM {tasks.LEDGER_TABLE} ORDER BY n")
        return [row[0] for row in cursor.fetchall()]


def _receipts() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT task_id FROM {tasks.RECEIPTS_TABLE}")
        return {row[0] for row in cursor.fetchall()}


def _terminate(pid: int) -> None:
    """End another session, and return once it is gone (PostgreSQL 14+)."""
    import psycopg

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding", "pool"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])


def _driver_agrees() -> bool:
    """Whether the driver's state is what Django's flags say: autocommit, no transaction."""
    raw = connection.connection
    if raw is None:
        return not connection.in_atomic_block
    if connection.vendor == "postgresql":
        driver = (raw.autocommit, int(raw.info.transaction_status) == 0)
    else:
        driver = (raw.isolation_level is None, not raw.in_transaction)
    return driver == (True, True) and (connection.autocommit, connection.in_atomic_block) == (
        True,
        False,
    )


# -- item: a timeout inside atomic() must not lose later writes -------------------------


def test_timeouts_inside_atomic_blocks_lose_no_later_write(ledger, run_worker):
    """Tasks whose timeout lands inside Django's atomic() bookkeeping (entering, leaving,
    switching autocommit), then ordinary writers on the same thread: every write is
    committed, and every timed-out attempt failed with TaskTimeout, not with an error
    from a connection a previous timeout had left half-way."""
    timing_out = [tasks.times_out_in_atomic.enqueue() for _ in range(40)]  # priority 10
    writers = [tasks.record.enqueue(n) for n in range(30)]
    proc = run_worker("--burst", "--concurrency", "1", "--prefetch", "0", timeout=180)
    assert proc.returncode == 0, proc.stderr

    assert _ledger() == list(range(30))  # counted on the test's own connection
    for result in writers:
        assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.SUCCESSFUL
    for result in timing_out:
        row = TaskRecord.objects.get(pk=result.id)
        assert row.status == TaskResultStatus.FAILED
        assert row.errors[-1]["exception_class_path"] == "django_tasks_plus.exceptions.TaskTimeout"


def test_a_transaction_only_the_driver_knows_of_is_rolled_back_and_fails_its_attempt(
    ledger, run_worker
):
    """A raw BEGIN leaves Django's flags at "autocommit, no transaction": the hygiene
    reads the driver's own state, so the attempt fails with TransactionLeaked and the
    writers after it on the same thread keep their writes."""
    leaking = tasks.leaks_driver_transaction.enqueue(1)
    followers = [tasks.record.enqueue(n) for n in (2, 3, 4)]
    proc = run_worker("--burst", "--concurrency", "1", "--prefetch", "0", timeout=60)
    assert proc.returncode == 0, proc.stderr

    row = TaskRecord.objects.get(pk=leaking.id)
    assert row.status == TaskResultStatus.FAILED
    assert row.errors[-1]["exception_class_path"] == (
        "django_tasks_plus.exceptions.TransactionLeaked"
    )
    for result in followers:
        assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.SUCCESSFUL
    assert _ledger() == [2, 3, 4]


def test_the_hygiene_reads_the_drivers_state_after_a_timeout_inside_atomic(ledger):
    """In process, many times: a timeout raised anywhere in an atomic() loop, then the
    hygiene's check of the connection, even without being told of the timeout: the
    driver agrees with Django's flags afterwards, and a plain write is committed."""
    for n in range(60):
        # Bounded: a timeout delivered inside a finalizer (a weakref callback) is lost.
        give_up = time.monotonic() + 5
        timer = AttemptTimer(0.002)
        try:
            with timer:
                while time.monotonic() < give_up:
                    with transaction.atomic():
                        pass
        except TaskTimeout:
            pass
        finally:
            timer.stop()
        assert interrupted()
        clean_up_after_attempt()  # by its state alone
        assert _driver_agrees()
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {tasks.LEDGER_TABLE} (n) VALUES (%s)", [n])
    connection.close()  # any transaction the writes were in would end here, uncommitted
    assert _ledger() == list(range(60))


def test_a_timeout_python_dropped_is_raised_again_until_the_attempt_ends():
    """Python drops an asynchronous exception that lands in a __del__ or a weakref
    callback; swallowing the first TaskTimeout here stands in for that. The timer raises
    it again, so the attempt still ends (it ran for ever on a worker before)."""
    swallowed = 0
    give_up = time.monotonic() + 30
    timer = AttemptTimer(0.01)
    try:
        with pytest.raises(TaskTimeout), timer:
            while time.monotonic() < give_up:
                try:
                    while time.monotonic() < give_up:
                        pass
                except TaskTimeout:
                    swallowed += 1
                    if swallowed > 1:
                        raise
    finally:
        timer.stop()
    assert swallowed == 2
    assert time.monotonic() < give_up
    assert interrupted()


def test_no_timeout_is_raised_after_the_attempt_ended():
    with AttemptTimer(0.05):
        pass
    time.sleep(0.3)  # the timer's first raise would have come, and its repeats
    assert not interrupted()


def test_a_stopped_timer_raises_no_more_even_if_its_exit_was_skipped():
    """A raise that lands as __exit__ is entered skips its body; stop() afterwards ends
    the repeats, so no TaskTimeout reaches the code that runs after the attempt."""
    timer = AttemptTimer(0.01)
    with pytest.raises(TaskTimeout):
        timer.__enter__()
        time.sleep(5)  # the first raise lands here; __exit__ is never called
    timer.stop()
    time.sleep(0.5)  # several repeat intervals
    interrupted()  # the first raise marked the thread; nothing after it must
    time.sleep(0.3)
    assert not interrupted()


# -- item: task_finished receivers after the database drops sessions ---------------------


@postgres_only
def test_each_send_of_a_batch_gets_a_live_connection_when_one_dies_mid_batch():
    """The session dies between two sends of one batch (terminated by the server): the
    sends after it run on a new connection, without a ping per send."""
    seen: list[int] = []

    def first() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        _terminate(pid)

    def later() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 41 + 1")
            seen.append(cursor.fetchone()[0])

    _run_all([first, later, later, later])
    assert seen == [42, 42, 42]


def _wait_for_markers(folder: Path, names: list[str]) -> None:
    wait_for(lambda: all((folder / name).exists() for name in names), timeout=60)


def _receipt_log(folder: Path) -> list[list[str]]:
    path = folder / "receipts.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@postgres_only
def test_task_finished_receivers_write_after_the_task_threads_sessions_are_terminated(
    receipts, start_worker, markers
):
    """A real worker; a batch of task_finished sends whose thread's session is terminated
    (pg_terminate_backend, by pid) after the batch began: every receiver that runs after
    the termination writes its receipt, on a new connection.

    To get one batch of many sends: the test holds a row lock on the first task to
    finish, so the reporter's write of it waits while the others finish and queue up;
    they are then written, and announced, together. The first receiver of that batch
    pauses until the test has terminated its session."""
    opener = tasks.gated.enqueue("open")
    pausing = tasks.gated_pausing_receiver.enqueue("pause-go")
    noted = [tasks.gated.enqueue("noted-go") for _ in range(8)]
    start_worker("--concurrency", "12", "--prefetch", "0")
    _wait_for_markers(markers, [f"waiting-{r.id}" for r in (opener, pausing, *noted)])

    import psycopg

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding", "pool"):
        params.pop(key, None)
    with psycopg.connect(**params) as locker:  # a transaction: the lock stays held
        locker.execute(
            "SELECT 1 FROM django_tasks_plus_taskrecord WHERE id = %s FOR UPDATE", [opener.id]
        )
        (markers / "open").touch()
        _wait_for_markers(markers, [f"done-{opener.id}"])
        (markers / "pause-go").touch()
        _wait_for_markers(markers, [f"done-{pausing.id}"])
        (markers / "noted-go").touch()
        _wait_for_markers(markers, [f"done-{r.id}" for r in noted])
        time.sleep(0.3)  # the outcomes are queued right after; a late one only splits the batch
        locker.commit()

    wait_for(lambda: any(markers.glob("paused-*")), timeout=60)
    [paused] = list(markers.glob("paused-*"))
    _terminate(int(paused.name.removeprefix("paused-")))
    (markers / "resume").touch()

    expected = {str(r.id) for r in (opener, pausing, *noted)}
    wait_for(lambda: {entry[1] for entry in _receipt_log(markers)} >= expected, timeout=60)
    failed = [entry for entry in _receipt_log(markers) if entry[0] == "failed"]
    assert failed == []
    assert _receipts() == expected


def test_the_hygiene_passes_see_exactly_the_connections_the_thread_opened():
    """``thread_connections`` (one thread-local read per alias) lists what Django's
    ``connections.all(initialized_only=True)`` lists, in a thread that opened none, one,
    and a second alias, and inside an event loop running on that thread (asgiref's
    ``Local`` then keeps a context's connections apart); ``any_pooled`` reads the
    settings."""
    import asyncio
    import threading

    from django.db import connections

    from django_tasks_plus.db.unpooled import any_pooled
    from django_tasks_plus.worker.hygiene import thread_connections

    seen: list[tuple[list[str], list[str]]] = []

    def both() -> None:
        ours = [wrapper.alias for wrapper in thread_connections()]
        django = [wrapper.alias for wrapper in connections.all(initialized_only=True)]
        seen.append((ours, django))

    def run() -> None:
        both()
        connections["default"].ensure_connection()
        both()
        for alias in connections:
            if alias != "default":
                connections[alias].ensure_connection()
        both()

        async def inside_a_loop() -> None:  # asgiref then reads a context's storage
            both()

        asyncio.run(inside_a_loop())
        for wrapper in connections.all(initialized_only=True):
            wrapper.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert [ours for ours, _ in seen] == [django for _, django in seen]
    assert seen[0][0] == [] and seen[1][0] == ["default"]
    assert seen[2][0] == list(connections)
    assert seen[3][0] == []  # the loop's context has opened none
    options = connections.settings["default"].setdefault("OPTIONS", {})
    had, before = "pool" in options, options.get("pool")
    try:
        others = [
            settings for alias, settings in connections.settings.items() if alias != "default"
        ]
        options["pool"] = False
        assert any_pooled() == any((other.get("OPTIONS") or {}).get("pool") for other in others)
        options["pool"] = {"min_size": 1}
        assert any_pooled()
    finally:
        if had:
            options["pool"] = before
        else:
            del options["pool"]
