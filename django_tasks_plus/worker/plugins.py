"""The worker's pluggable services: what features, settings and task definitions add.

``Worker.build_services`` lists only the engine's own services (the outcome writer, the
heartbeat, the NOTIFY listener, the leader election). Every other duty comes from a
*service factory*, called once per worker with a ``ServiceContext``:

- the features' factories, registered in ``extensions.service_factories`` (the metrics
  flusher and pruner, the worker-row pruner; later the scheduler, the result pruner);
- the backend's ``OPTIONS["SERVICES"]`` (the project's own);
- the ``services=[...]`` of the backend's task definitions (found at start by
  ``discovery.discover_task_modules``).

A factory returns a service, a list of them, or None (nothing to run on this backend,
e.g. metrics turned off). Each factory is called once even if named in several places.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import extensions
from .services import Service, ServiceStartError

if TYPE_CHECKING:
    from ..backend import DatabaseBackend
    from ..conf import BackendSettings


@dataclass(frozen=True)
class ServiceContext:
    """What a service factory may use to build its services for one worker."""

    backend: DatabaseBackend
    worker_id: str
    queues: tuple[str, ...]
    clock: Callable[[], datetime]
    """The database's clock, as the worker reads it."""
    bound_seconds: float
    """How long one of the service's statements may wait (the visibility timeout)."""
    outcome_writer: Service
    """The worker's outcome writer: a service whose last act should follow its last
    batch (a final metrics flush) waits for it to stop."""

    @property
    def settings(self) -> BackendSettings:
        return self.backend.settings

    @property
    def database(self) -> str:
        return self.backend.settings.database


def factories_for(backend: DatabaseBackend) -> list[Any]:
    """Every service factory of ``backend``, each once, features' first."""
    found: dict[int, Any] = {}
    for factory in (
        *extensions.service_factories.entries,
        *backend.settings.services,
        *backend.task_services.values(),
    ):
        found.setdefault(id(factory), factory)
    return list(found.values())


def plugged_services(context: ServiceContext) -> list[Service]:
    """The services the factories build for this worker, in factory order."""
    services: list[Service] = []
    for factory in factories_for(context.backend):
        try:
            produced = factory(context)
        except Exception as exc:
            raise ServiceStartError(
                f"Service factory {_name(factory)} failed: {type(exc).__name__}: {exc}"
            ) from exc
        for service in _as_list(produced):
            if not isinstance(service, Service):
                raise ServiceStartError(
                    f"Service factory {_name(factory)} returned {service!r}, which is not a "
                    "worker service (name, singleton, start(), stop(), join(), is_alive())."
                )
            services.append(service)
    return services


def _as_list(produced: Any) -> list[Any]:
    if produced is None:
        return []
    if isinstance(produced, list | tuple):
        return list(produced)
    return [produced]


def _name(factory: Any) -> str:
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(factory)
