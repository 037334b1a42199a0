"""Connection hygiene on task threads: task code and signal receivers always start on a
sound connection, and each attempt leaves a clean one behind.

Django's request cycle closes broken connections between requests
(``close_old_connections``); a worker thread runs task after task on the same
connections, so it needs the same care, and more: task code can leave a transaction open
(``transaction.atomic().__enter__()`` without the exit, ``set_autocommit(False)``, a raw
``BEGIN``), and an exception raised half-way through Django's own transaction
bookkeeping (a timeout) can leave Django's record of the connection ("autocommit, no
transaction") out of step with the driver, which has autocommit off or a transaction
open. Left alone, the next task on that thread would run inside the leaked transaction,
report success, and have its writes vanish; on SQLite the open transaction would also
hold the database's write lock and stall every other writer.

So after every attempt each connection the thread opened is checked against Django's
record *and* the driver's own state (``Dialect.driver_state``: attribute reads, no
query):

- a transaction left open is rolled back and the connection discarded (the next use
  reconnects), and the attempt is told, so that it fails with a clear error instead of
  reporting a success whose writes were lost;
- a connection whose driver disagrees with Django's record, is mid-query, or was in use
  when a timeout was raised asynchronously, is discarded: nothing it says can be trusted;
- a connection on which a query failed is checked (one query) and discarded if dead.

Before task code or a signal receiver runs, a connection the server has hung up on
(``pg_terminate_backend``, a restart: seen without a round trip, ``Dialect.hung_up``) or
on which the last query failed is checked and replaced, so no receiver runs on a
connection already known to be dead. The connection lifetime setting (``CONN_MAX_AGE``)
is not applied here: reconnecting after every task would cost more than the tasks.

Behind Django's connection pool (``OPTIONS["pool"]``) a task thread hands its session
back to the pool once its attempt (or its batch of ``task_finished`` sends) is over
(``return_pooled_sessions``): the pool's ``max_size`` then bounds the sessions all task
threads hold, and a thread whose next task does not query holds none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db import dialect_for
from ..db.base import DriverState
from ..db.unpooled import any_pooled, is_pooled
from ..exceptions import UnsupportedDatabase

logger = logging.getLogger("django_tasks_plus.worker")


def thread_connections() -> Sequence[BaseDatabaseWrapper]:
    """The connections this thread has opened a wrapper for, as
    ``connections.all(initialized_only=True)`` lists them, read from the thread's own
    storage once rather than through asgiref's ``Local`` per alias (each read there asks
    asyncio for a running loop and catches the error: the passes below run four or five
    times per attempt, about a twentieth of a drain's CPU). A thread that made none (its
    tasks never query) is answered without a read per alias: a missed attribute on a
    ``threading.local`` costs a raised and caught error each."""
    local = getattr(connections, "_connections", None)
    if local is None:  # a Django whose handler keeps them elsewhere
        return connections.all(initialized_only=True)
    storage = _thread_storage(local)
    if storage is not local and not vars(storage):  # none opened here: tasks that never query
        return ()
    found: list[BaseDatabaseWrapper] = []
    for alias in connections:
        wrapper = getattr(storage, alias, None)
        if wrapper is not None:
            found.append(wrapper)
    return found


def _thread_storage(local: object) -> object:
    """The ``threading.local`` behind asgiref's thread-critical ``Local`` when that is what
    the ``Local`` would read on this thread (no event loop running here); otherwise the
    ``Local`` itself (another asgiref, or inside a loop: it chooses)."""
    storage = getattr(local, "_storage", None)
    if type(storage) is not threading.local or asyncio._get_running_loop() is not None:
        return local
    return storage


def driver_state(connection: BaseDatabaseWrapper) -> DriverState | None:
    """What the driver says of the connection (no query); None when not connected or
    the database is not one the worker runs on."""
    if connection.connection is None:
        return None
    try:
        return dialect_for(connection).driver_state(connection.connection)
    except UnsupportedDatabase:  # a task's own alias on another database: flags only
        return None


def leaked_transaction(connection: BaseDatabaseWrapper, state: DriverState | None) -> bool:
    """Whether a transaction (or an ``atomic`` block) is open on this connection, by
    Django's record or by the driver's (``state``), whichever says so."""
    if connection.in_atomic_block:
        return True
    if connection.connection is None:
        return False
    if not connection.autocommit:  # not get_autocommit(): that would connect
        return True
    return state is not None and state.in_transaction


def out_of_step(state: DriverState | None) -> bool:
    """Whether the driver contradicts Django's "autocommit, no transaction" (autocommit
    off underneath), or cannot take the next query (mid-query, closed, lost track)."""
    return state is not None and (not state.autocommit or not state.usable)


def discard(connection: BaseDatabaseWrapper) -> None:
    """Drop the connection and whatever transaction state task code left on it.

    Closing the database connection rolls back any open transaction on the server (and
    releases SQLite's write lock). Django's own bookkeeping of atomic blocks is reset as
    if they had never been entered, and callbacks registered with ``on_commit`` inside
    them are dropped with the transaction, as a rollback would.
    """
    connection.in_atomic_block = False
    connection.savepoint_ids = []
    connection.atomic_blocks = []
    connection.needs_rollback = False
    connection.closed_in_transaction = False
    connection.commit_on_exit = True
    connection.run_on_commit = []
    with contextlib.suppress(Exception):  # a dead connection may fail to close: it is gone
        connection.close()
    connection.connection = None
    connection.errors_occurred = False


def clean_up_after_attempt(*, interrupted: bool = False) -> list[str]:
    """Check every connection this thread opened; return the aliases where a transaction
    was left open (and has now been rolled back and discarded).

    ``interrupted``: an exception was raised asynchronously in this thread (a timeout), so
    it may have landed anywhere, even inside the driver or Django's bookkeeping, leaving
    state no flag shows: every connection is discarded (rare, and a reconnect is cheap).
    """
    leaked: list[str] = []
    for connection in thread_connections():
        state = driver_state(connection)
        if leaked_transaction(connection, state):
            leaked.append(connection.alias)
            discard(connection)
        elif connection.connection is None:
            connection.errors_occurred = False
        elif out_of_step(state):
            logger.warning(
                "Database %r connection: the driver's transaction state was out of step "
                "with Django's (autocommit off, or a query still in flight); closed it.",
                connection.alias,
            )
            discard(connection)
        elif interrupted:
            discard(connection)
        elif connection.errors_occurred:
            if not connection.is_usable():
                discard(connection)
            connection.errors_occurred = False
    return leaked


def return_pooled_sessions() -> None:
    """Hand this thread's pooled sessions back to their pools (a clean one is reused by
    the next thread that connects; a pool checks what it gets back). Connections outside
    a pool are kept: reconnecting per task would cost more than the tasks."""
    if not any_pooled():
        return
    for connection in thread_connections():
        if connection.connection is None or connection.in_atomic_block:
            continue
        if is_pooled(connection):
            with contextlib.suppress(Exception):  # a broken one is the pool's to drop
                connection.close()


def replace_lost_connections() -> None:
    """Before task code or a signal receiver runs on this thread: replace a connection
    that the server hung up on, or on which the last query failed, if one query confirms
    that it is dead. Free when there is no such sign (no query per task)."""
    for connection in thread_connections():
        raw = connection.connection
        if raw is None or connection.in_atomic_block:
            continue
        if connection.errors_occurred or hung_up(connection, raw):
            if not connection.is_usable():
                logger.info("Database %r connection went away; reconnecting.", connection.alias)
                discard(connection)
            connection.errors_occurred = False


def hung_up(connection: BaseDatabaseWrapper, raw: object) -> bool:
    """Whether the server seems to have hung up on ``raw`` (no round trip; a hint that
    ``is_usable()`` then confirms)."""
    try:
        return dialect_for(connection).hung_up(raw)
    except UnsupportedDatabase:
        return False
