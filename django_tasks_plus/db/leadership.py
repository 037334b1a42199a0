"""Leader election: one worker per backend, across all hosts, runs the singleton duties.

Two ways to hold leadership, chosen by the database:

- PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on the calling
  thread's connection, which the worker keeps for its bookkeeping (its periodic session,
  ``worker/sessions.py``). The lock lives exactly as long as that session, so when the
  leader's process dies the server frees it and the next worker to try becomes leader;
  when the session is replaced (it broke), the leader steps down and bids again.
- Elsewhere (SQLite, and any database without such locks): a row of ``Leadership`` that the
  leader renews by the database's clock; any worker may take it over once it expired.

Either way a leader can lose its leadership without noticing at once (a cut connection,
a stall longer than the lease), so two leaders may overlap for up to one check interval:
singleton duties must be safe to run twice, they are only kept from running everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Protocol

from django.db import connections

from ..models import Leadership
from . import dialect_for, worker_connection


class LeaderLock(Protocol):
    """One worker's hold on (or bid for) the leadership of one backend."""

    def try_lead(self) -> bool:
        """Take the leadership if it is free, keep it if held; True while this worker
        leads. Raises on a database error (the caller then counts itself a follower)."""

    def release(self) -> None:
        """Give the leadership up (if held) and close what it used; never raises."""


def leader_lock(database: str, backend_name: str, holder: str, lease_seconds: float) -> LeaderLock:
    """The leader lock that suits ``database``: advisory on PostgreSQL, else a table lease."""
    if dialect_for(connections[database]).supports_advisory_locks:
        return AdvisoryLock(database, backend_name, holder)
    return TableLease(database, backend_name, holder, lease_seconds)


def current_leader(database: str, backend_name: str) -> str | None:
    """The worker id of the backend's leader as the database sees it, or None.

    On PostgreSQL, the ``application_name`` of the session holding the advisory lock (the
    leader's worker id, cut to 63 characters); elsewhere the holder of an unexpired lease.
    """
    connection = connections[database]
    with connection.cursor() as cursor:
        if dialect_for(connection).supports_advisory_locks:
            classid, objid = _lock_halves(advisory_key(backend_name))
            cursor.execute(CURRENT_ADVISORY_HOLDER, [classid, objid])
        else:
            t = connection.ops.quote_name(Leadership._meta.db_table)
            cursor.execute(
                CURRENT_LEASE_HOLDER.format(table=t, now=dialect_for(connection).now_sql),
                [backend_name],
            )
        row = cursor.fetchone()
    return None if row is None else row[0]


# -- PostgreSQL: an advisory lock on a session of our own ------------------------------------

TRY_ADVISORY_LOCK = "SELECT set_config('application_name', %s, false), pg_try_advisory_lock(%s)"
"""Non-blocking: true if this session now holds the lock (or already did). The session
takes the worker's id as its name first, so ``current_leader`` can tell who holds it."""

ADVISORY_UNLOCK = "SELECT pg_advisory_unlock(%s)"
"""Step down at shutdown without closing the session (other duties still use it)."""

SESSION_ALIVE = "SELECT 1"
"""A leader's check that its session, and so its lock, still exists."""

CURRENT_ADVISORY_HOLDER = """
    SELECT activity.application_name
      FROM pg_locks AS lock
      JOIN pg_stat_activity AS activity ON activity.pid = lock.pid
     WHERE lock.locktype = 'advisory' AND lock.granted
       AND lock.classid = %s AND lock.objid = %s AND lock.objsubid = 1
       AND lock.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
"""Who holds a bigint advisory lock: pg_locks splits the key into two 32-bit halves."""


def advisory_key(backend_name: str) -> int:
    """The advisory lock key of a backend's leadership: a stable signed 64-bit hash."""
    digest = hashlib.blake2b(
        f"django_tasks_plus:leader:{backend_name}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def _lock_halves(key: int) -> tuple[int, int]:
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


class AdvisoryLock:
    """Leadership held as a PostgreSQL advisory lock on the calling thread's connection
    to ``database``, which must stay the same session between calls (the worker calls
    it in turns on its periodic session)."""

    def __init__(self, database: str, backend_name: str, holder: str) -> None:
        self.database = database
        self.key = advisory_key(backend_name)
        self.holder = holder
        self._session: object | None = None  # the driver connection the lock was taken on
        self._held = False

    def try_lead(self) -> bool:
        connection = connections[self.database]
        try:
            connection.ensure_connection()
            if self._held and connection.connection is not self._session:
                # The session was replaced (it broke): the lock went with it. Step down
                # for this round; the next one bids on the new session.
                self._held = False
                self._session = None
                return False
            with connection.cursor() as cursor:
                if self._held:
                    cursor.execute(SESSION_ALIVE)
                    cursor.fetchone()
                else:
                    cursor.execute(TRY_ADVISORY_LOCK, [self.holder[:63], self.key])
                    self._held = bool(cursor.fetchone()[1])
                    self._session = connection.connection if self._held else None
        except Exception:
            self._held = False  # a broken session holds no lock: start afresh next time
            self._session = None
            raise
        return self._held

    def release(self) -> None:
        held, session = self._held, self._session
        self._held, self._session = False, None
        connection = connections[self.database]
        if not held or connection.connection is not session:
            return  # not held, or gone with its session
        with contextlib.suppress(Exception), connection.cursor() as cursor:
            cursor.execute(ADVISORY_UNLOCK, [self.key])


# -- Elsewhere: a lease row, renewed by the leader ---------------------------------------------

RENEW_OR_TAKE_LEASE = """
    UPDATE {table} SET holder = %s, expires_at = {expiry}
     WHERE backend_name = %s AND (holder = %s OR expires_at < {now})
"""
"""Renew our own lease, or take over one that expired; one row updated means we lead."""

CLAIM_FREE_LEASE = """
    INSERT INTO {table} (backend_name, holder, expires_at) VALUES (%s, %s, {expiry})
    ON CONFLICT (backend_name) DO NOTHING
"""
"""The first leader of a backend creates its row; a row inserted means we lead."""

RELEASE_LEASE = "DELETE FROM {table} WHERE backend_name = %s AND holder = %s"
"""Step down at shutdown, so the next worker need not wait for the lease to expire."""

CURRENT_LEASE_HOLDER = "SELECT holder FROM {table} WHERE backend_name = %s AND expires_at >= {now}"


class TableLease:
    """Leadership held as a ``Leadership`` row whose lease the leader keeps renewing.

    Uses the calling thread's Django connection; times are the database's clock."""

    def __init__(self, database: str, backend_name: str, holder: str, seconds: float) -> None:
        self.database = database
        self.backend_name = backend_name
        self.holder = holder
        self.seconds = seconds

    def try_lead(self) -> bool:
        connection = worker_connection(self.database, self.seconds)
        dialect = dialect_for(connection)
        expiry, expiry_params = dialect.lease_expiry(self.seconds)
        table = connection.ops.quote_name(Leadership._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                RENEW_OR_TAKE_LEASE.format(table=table, expiry=expiry, now=dialect.now_sql),
                [self.holder, *expiry_params, self.backend_name, self.holder],
            )
            if cursor.rowcount == 1:
                return True
            cursor.execute(
                CLAIM_FREE_LEASE.format(table=table, expiry=expiry),
                [self.backend_name, self.holder, *expiry_params],
            )
            return cursor.rowcount == 1

    def release(self) -> None:
        connection = connections[self.database]
        table = connection.ops.quote_name(Leadership._meta.db_table)
        with contextlib.suppress(Exception), connection.cursor() as cursor:
            # If this fails the lease expires by itself.
            cursor.execute(RELEASE_LEASE.format(table=table), [self.backend_name, self.holder])
