"""Connection hygiene around task attempts: each attempt leaves a clean connection behind.

Django's request cycle closes broken connections between requests
(``close_old_connections``); a worker thread runs task after task on the same
connections, so it needs the same care, and more: task code can leave a transaction open
(``transaction.atomic().__enter__()`` without the exit, a timeout landing inside
``atomic()``, ``set_autocommit(False)``). Left alone, the next task on that thread would
run inside the leaked transaction, report success, and have its writes vanish; on SQLite
the open transaction would hold the database's write lock and stall every other writer.

So after every attempt, each connection the thread opened is checked: a leaked
transaction is rolled back and the connection discarded (the next use reconnects), and
the attempt that leaked it is told, so it can fail with a clear error instead of
reporting a success whose writes were lost. A broken connection is closed likewise.
The connection lifetime setting (``CONN_MAX_AGE``) is not applied here: reconnecting
after every task would cost more than the tasks themselves.
"""

from __future__ import annotations

import contextlib
import logging

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_tasks_plus.worker")


def leaked_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether task code left a transaction (or an ``atomic`` block) open on this thread."""
    if connection.in_atomic_block:
        return True
    return connection.connection is not None and not connection.get_autocommit()


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


def clean_up_after_attempt() -> list[str]:
    """Check every connection this thread opened; return the aliases where a transaction
    was left open (and has now been rolled back and discarded)."""
    leaked: list[str] = []
    for connection in connections.all(initialized_only=True):
        if leaked_transaction(connection):
            leaked.append(connection.alias)
            discard(connection)
        elif connection.connection is not None and connection.errors_occurred:
            if not connection.is_usable():
                discard(connection)
            connection.errors_occurred = False
    return leaked


def refresh_connections() -> None:
    """Close this thread's connections that no longer answer (a database restart), so
    the next query reconnects instead of failing; one cheap check per connection."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.is_usable():
            logger.info("Database %r connection went away; reconnecting.", connection.alias)
            discard(connection)
