"""Bookkeeping sessions several threads take turns on (``worker/sessions.py``), against
the real database: one server session for all of them, each turn starting clean, a
broken session replaced without the caller seeing it, and services sharing the
session they are handed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction

from django_tasks_plus.db import dialect_for
from django_tasks_plus.models import WorkerRecord
from django_tasks_plus.worker.services import LoopService, Services
from django_tasks_plus.worker.sessions import SharedSession
from tests.conftest import postgres_only, wait_for, worker_row

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session() -> Iterator[SharedSession]:
    shared = SharedSession("default", "test")
    yield shared
    shared.close()


def _server_session() -> Any:
    """What identifies this thread's ``connections['default']`` session on the server."""
    current = connections["default"]
    if current.vendor == "postgresql":
        with current.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]
    current.ensure_connection()
    return id(current.connection)


def _on_thread(work: Callable[[], Any]) -> Any:
    """``work()``'s value, run on a thread of its own (its connections closed after)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(work())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert box, "the thread failed"
    return box[0]


def _in_turn(session: SharedSession) -> Any:
    with session.turn():
        return _server_session()


def test_threads_taking_turns_use_one_server_session(session):
    """Three threads, one session on the server; outside its turn a thread's own
    connection is back in place."""
    seen = {_on_thread(lambda: _in_turn(session)) for _ in range(3)}
    own = connections["default"]
    with session.turn() as shared:
        assert connections["default"] is shared and shared is not own
        seen.add(_server_session())
    assert connections["default"] is own
    assert len(seen) == 1
    assert _server_session() not in seen  # the test's own connection is another session


def test_a_transaction_left_open_in_a_turn_is_rolled_back_before_the_next(session):
    """A turn that leaves a transaction open (an ``atomic`` entered and never left) does
    not hand it to the next turn: its write is rolled back and the session replaced."""
    with session.turn():
        transaction.atomic().__enter__()
        worker_row("leaked")
    with session.turn() as shared:
        assert not shared.in_atomic_block
        assert dialect_for(shared).driver_state(_connected(shared)).in_transaction is False
        assert not WorkerRecord.objects.filter(worker_id="leaked").exists()
    assert not WorkerRecord.objects.filter(worker_id="leaked").exists()


def _connected(wrapper: Any) -> Any:
    wrapper.ensure_connection()
    return wrapper.connection


def test_an_error_in_a_turn_keeps_a_live_session(session):
    """A failed statement (the kind a lock timeout is) does not cost the session: the
    next turn is on the same server session, which may hold a session-level lock."""
    with session.turn():
        first = _server_session()
        with pytest.raises(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
    with session.turn():
        assert _server_session() == first


@postgres_only
def test_a_terminated_session_is_replaced_at_the_next_turn(session):
    """The server ends the session between turns: the next turn runs on a new one, with
    no error reaching the code inside it."""
    with session.turn():
        pid = _server_session()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
    with session.turn():
        assert _server_session() != pid


@postgres_only
def test_a_session_killed_inside_a_turn_is_replaced_after_it(session):
    """A turn whose statement fails because the session died leaves the next turn a new
    session: the failure reaches that turn's caller once, never a later one."""
    with pytest.raises(OperationalError), session.turn():
        pid = _server_session()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            cursor.fetchone()
    with session.turn():
        assert _server_session() != pid


class _Probe(LoopService):
    """A service recording the server session each round ran on."""

    name = "tasks-probe"
    interval = 0.01
    first_round_at_start = True

    def __init__(self) -> None:
        super().__init__("default")
        self.seen: set[Any] = set()

    def tick(self) -> None:
        self.seen.add(_server_session())


def test_services_share_the_session_they_are_handed(session):
    """Every thread service of a ``Services`` takes its turns on the one session given;
    a service run alone opens one of its own and closes it when it stops."""
    probes = [_Probe(), _Probe()]
    services = Services(probes, session=session)
    services.start()
    try:
        wait_for(lambda: all(probe.seen for probe in probes))
    finally:
        assert services.stop(timeout=10) == []
    assert probes[0].seen == probes[1].seen == {_in_turn(session)}

    alone = _Probe()
    alone.start()
    wait_for(lambda: bool(alone.seen))
    alone.stop()
    alone.join(10)
    assert alone.session is None  # its own session was closed with its thread
    assert alone.seen.isdisjoint(probes[0].seen)


def test_closing_a_session_ends_it_and_a_later_turn_opens_another(session):
    before = _in_turn(session)
    session.close()
    assert session.raw is None
    after = _in_turn(session)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [before])
            assert cursor.fetchone()[0] == 0
        assert after != before


def test_a_turn_that_raises_frees_the_session_for_the_next_thread(session):
    with pytest.raises(OperationalError), session.turn():
        raise OperationalError("the database went away")
    assert _on_thread(lambda: _in_turn(session)) == _in_turn(session)
