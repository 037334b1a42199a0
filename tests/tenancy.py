"""A test-only feature built on the open envelope: tasks that run for a tenant.

Nothing in the package knows about tenants, and no migration carries them. The feature
is three small pieces, all here:

* a metadata key, declared to live for the call (a redrive keeps the tenant);
* an enqueue middleware that stamps the caller's current tenant into the metadata;
* an execution middleware that reads it back in the worker and makes it current again
  while the task runs.

``tests.tasks.tenant_report`` uses both middlewares; tests/test_metadata.py runs it
through a real worker. This module must not import tests.tasks (which imports it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django_tasks_plus import EnqueueRefused
from django_tasks_plus.envelope import EnqueueHandler, Envelope
from django_tasks_plus.metadata import register_key
from django_tasks_plus.middleware import Attempt, Handler

TENANT = register_key("tenant", lifetime="call", description="the tenant a task runs for")

current_tenant: ContextVar[str | None] = ContextVar("current_tenant", default=None)


@contextmanager
def acting_for(tenant: str) -> Iterator[None]:
    """Make ``tenant`` current (what a request middleware would do in a real project)."""
    token = current_tenant.set(tenant)
    try:
        yield
    finally:
        current_tenant.reset(token)


def stamp_tenant(call_next: EnqueueHandler) -> EnqueueHandler:
    """Enqueue middleware: the current tenant goes into the task's metadata; a call made
    for no tenant is refused, with nothing written."""

    def middleware(envelope: Envelope) -> Any:
        tenant = current_tenant.get()
        if tenant is None:
            raise EnqueueRefused(f"{envelope.task.module_path} needs a current tenant")
        return call_next(envelope.with_metadata(**{TENANT.name: tenant}))

    return middleware


def run_as_tenant(call_next: Handler) -> Handler:
    """Execution middleware: the task runs with the tenant of its metadata current."""

    def middleware(attempt: Attempt) -> Any:
        token = current_tenant.set(attempt.metadata.get(TENANT.name))
        try:
            return call_next(attempt)
        finally:
            current_tenant.reset(token)

    return middleware
