"""The worker's bookkeeping sessions, kept out of Django's connection pool.

The worker bounds its own statements with session settings
(``Dialect.bound_worker_statements``: on PostgreSQL ``statement_timeout`` and
``lock_timeout``). With Django's connection pool (``DATABASES[...]["OPTIONS"]["pool"]``,
Django 5.1+ with psycopg 3), closing a connection hands its session back to the pool,
settings and all, and the pool gives it to the next thread that connects: a task thread
would then run under the worker's timeouts. ``SET LOCAL`` would avoid that only at the
price of a transaction around the claim and the heartbeat.

So each bookkeeping thread runs inside ``outside_the_pool(alias)``: for that thread,
``connections[alias]`` is a connection built from the alias's settings without the
``pool`` option, closed (really closed) when the thread ends. The ORM and every
``connections[alias]`` on that thread use it; other threads are unaffected. For an
alias without a pool nothing changes: a thread's connection is its own already.

``worker_connection()`` refuses to bound a pooled connection, so a thread that forgot
this fails loudly instead of leaking. And ``forget_worker_bounds`` (a
``connection_created`` receiver the worker connects) lifts the bounds from any pooled
session that carries them anyway, so a task thread never starts with them, whatever the
pool returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.utils import load_backend

from ..exceptions import UnsupportedDatabase


def is_pooled(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` takes its sessions from Django's connection pool."""
    return _pooled(connection.settings_dict)


def any_pooled() -> bool:
    """Whether any configured database takes its sessions from Django's pool (a read of
    the settings: no thread-local, no wrapper)."""
    return any(_pooled(settings) for settings in connections.settings.values())


def _pooled(settings: Mapping[str, Any]) -> bool:
    return bool((settings.get("OPTIONS") or {}).get("pool"))


def unpooled_copy(connection: BaseDatabaseWrapper) -> BaseDatabaseWrapper:
    """A new, unconnected wrapper for the same database as ``connection``, whose sessions
    are opened and closed directly (its settings without the ``pool`` option)."""
    settings = connection.settings_dict
    options = {key: value for key, value in settings["OPTIONS"].items() if key != "pool"}
    backend = load_backend(settings["ENGINE"])
    return backend.DatabaseWrapper({**settings, "OPTIONS": options}, connection.alias)


@contextlib.contextmanager
def outside_the_pool(database: str) -> Iterator[None]:
    """On this thread, let ``connections[database]`` be a connection outside the pool
    (if the alias has one) until the block ends; then close it and put back the one
    the thread had (a test running the worker in-process keeps its own)."""
    previous = connections[database]
    if not is_pooled(previous):
        yield
        return
    own = unpooled_copy(previous)
    connections[database] = own
    try:
        yield
    finally:
        try:
            own.close()
        finally:
            connections[database] = previous


def forget_worker_bounds(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """``connection_created`` receiver: a pooled session that carries the worker's
    bounds (which only a bookkeeping thread outside ``outside_the_pool`` could have left
    there) gets its settings back before anyone uses it."""
    from . import dialect_for

    if not is_pooled(connection):
        return
    try:
        dialect = dialect_for(connection)
    except UnsupportedDatabase:  # a pool of a database the worker never runs on
        return
    dialect.unbound_worker_statements(connection)


def guard_pooled_sessions() -> None:
    """Connect ``forget_worker_bounds``, once per process (the worker calls this)."""
    connection_created.connect(forget_worker_bounds, dispatch_uid="django_tasks_plus.pool")
