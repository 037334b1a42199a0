"""Bookkeeping sessions a worker's threads share, one turn at a time.

A worker process holds two bookkeeping sessions whatever services it runs (plus the
NOTIFY listener's): one for the latency-critical claim loop and outcome writer, one for
every periodic service (heartbeat and reaper, leadership, metrics flusher, pruners,
scheduler, and any service a project adds). Each is a ``SharedSession``: a Django
connection of its own, outside any connection pool (``db/unpooled.py``), that a thread
uses only inside ``turn()``. A turn holds the session's lock, so one thread's unit of
work (a statement, or a transaction that ends inside the turn) never interleaves with
another's; between turns the session belongs to nobody.

Each turn starts and ends with the checks task threads get (``hygiene.py``): a session
the server hung up on, or whose last query failed and that no longer answers, is
replaced before the turn; a transaction left open, or a driver out of step with Django's
record, is rolled back by discarding the session after it. So a killed session costs one
reconnect, never a service. Code inside a turn reports trouble by raising, not by
closing the connection: closing would also end whatever the session holds for the
others (the leader's advisory lock).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db.unpooled import unpooled_copy
from .hygiene import discard, driver_state, hung_up, leaked_transaction, out_of_step

logger = logging.getLogger("django_tasks_plus.worker")

CLOSE_WAIT = 5.0
"""How long closing a session at shutdown waits for a turn still under way."""


class SharedSession:
    """One database session taken in turns by several of a worker's threads."""

    def __init__(self, database: str, name: str) -> None:
        self.database = database
        self.name = name
        self._lock = threading.RLock()
        self._wrapper: BaseDatabaseWrapper | None = None

    def __repr__(self) -> str:
        return f"<SharedSession {self.name!r} on {self.database!r}>"

    @property
    def raw(self) -> object | None:
        """The driver's connection now behind this session (None while not connected):
        what identifies the server session, e.g. for a session-level lock."""
        wrapper = self._wrapper
        return None if wrapper is None else wrapper.connection

    @contextlib.contextmanager
    def turn(self) -> Iterator[BaseDatabaseWrapper]:
        """Hold the session: inside the block, this thread's ``connections[database]`` is
        the shared session (connected on first use). Re-entrant on one thread."""
        with self._lock:
            wrapper = self._wrapper_for_turn()
            previous = connections[self.database]
            if previous is wrapper:  # a turn inside a turn: the outer one does the checks
                yield wrapper
                return
            _replace_if_lost(wrapper)
            connections[self.database] = wrapper
            try:
                yield wrapper
            finally:
                connections[self.database] = previous
                try:
                    _tidy_after_turn(wrapper, self.name)
                except Exception:  # never hide the turn's own error behind this one
                    logger.exception("Checking the %s session after a turn failed", self.name)
                    discard(wrapper)

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Close the session (at worker shutdown). A later turn opens a new one.

        Waits up to ``timeout`` seconds for a turn still under way (a service that did
        not stop in time); then leaves the session to end with the process."""
        if not self._lock.acquire(timeout=timeout):
            logger.warning("The %s session is still in use; leaving it open.", self.name)
            return
        try:
            wrapper, self._wrapper = self._wrapper, None
            if wrapper is not None:
                with contextlib.suppress(Exception):
                    wrapper.close()
                wrapper.dec_thread_sharing()
        finally:
            self._lock.release()

    def _wrapper_for_turn(self) -> BaseDatabaseWrapper:
        if self._wrapper is None:
            # The alias's settings without a pool: the worker's statement bounds stay on
            # this session and never reach a task thread (db/unpooled.py).
            wrapper = unpooled_copy(connections[self.database])
            wrapper.inc_thread_sharing()  # used by several threads, one turn at a time
            self._wrapper = wrapper
        return self._wrapper


def _replace_if_lost(wrapper: BaseDatabaseWrapper) -> None:
    """Before a turn: drop a session the server hung up on, or whose last query failed,
    if one query confirms it is dead (free when there is no such sign)."""
    raw = wrapper.connection
    if raw is None:
        wrapper.errors_occurred = False
        return
    if wrapper.errors_occurred or hung_up(wrapper, raw):
        if not wrapper.is_usable():
            logger.info("A bookkeeping session went away; reconnecting.")
            discard(wrapper)
        wrapper.errors_occurred = False


def _tidy_after_turn(wrapper: BaseDatabaseWrapper, name: str) -> None:
    """After a turn: the next turn, another thread's, must start on a clean session."""
    if wrapper.connection is None:
        wrapper.errors_occurred = False
        return
    state = driver_state(wrapper)
    if leaked_transaction(wrapper, state):
        logger.warning(
            "The %s session was left inside a transaction after a turn; rolled it back "
            "and closed the session.",
            name,
        )
        discard(wrapper)
    elif out_of_step(state):
        discard(wrapper)
    elif wrapper.errors_occurred:
        if not wrapper.is_usable():
            discard(wrapper)
        wrapper.errors_occurred = False
