"""What one worker process runs with: settings and flags resolved into a ``WorkerConfig``.

``WorkerConfig.from_settings()`` is the one place that turns a ``TASKS`` alias plus the
flags of ``runtasks`` into a config, so a worker can be built and run in-process::

    Worker(WorkerConfig.from_settings("default", burst=True, concurrency=2)).run()

Bad flags raise ``WorkerConfigError`` naming the flag (``runtasks`` shows it as
``--flag-name …``); flags are checked with the same validators as the settings.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..compat import DEFAULT_TASK_BACKEND_ALIAS
from ..conf import positive_int_problem, positive_seconds_problem, queue_name_problem
from ..limits import WORKER_ID_MAX_LENGTH

if TYPE_CHECKING:
    from ..backend import DatabaseBackend


class WorkerConfigError(ValueError):
    """A worker flag (or the backend it names) is unusable. ``option`` is the flag's
    keyword (``"concurrency"``), or None when the message stands alone."""

    def __init__(self, problem: str, option: str | None = None) -> None:
        self.option = option
        self.problem = problem
        super().__init__(problem if option is None else f"{option} {problem}")


def default_worker_id() -> str:
    host = socket.gethostname().split(".")[0][:40]
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def worker_id_problem(value: object, room: int = WORKER_ID_MAX_LENGTH) -> str | None:
    """Why ``value`` cannot name a worker (in ``room`` characters), or None."""
    if not isinstance(value, str) or not value.strip():
        # A worker id names the worker in results and logs: a blank one would name nobody.
        return f"must not be empty or blank, got {value!r}"
    if len(value) > room:
        return f"is {len(value)} characters; at most {room} fit."
    return None


def worker_backend(alias: str) -> DatabaseBackend:
    """The ``DatabaseBackend`` configured as ``TASKS[alias]``; ``WorkerConfigError`` else."""
    from ..operations import BackendNotUsable, database_backend

    try:
        return database_backend(alias, needed_by="runtasks")
    except BackendNotUsable as exc:
        raise WorkerConfigError(str(exc)) from exc.__cause__


def served_queues(backend: DatabaseBackend, requested: Iterable[str] | None) -> tuple[str, ...]:
    """The queues a worker serves: ``requested`` (``None`` or ``'*'``: all the backend's)."""
    requested = None if requested is None else list(requested)
    served = sorted(backend.settings.queues)
    if not served:  # QUEUES: [] lets tasks name any queue; the worker must be told which
        if not requested or "*" in requested:
            raise WorkerConfigError(
                f"TASKS[{backend.alias!r}]['QUEUES'] is empty, so tasks may name any "
                "queue and there is no list of queues to serve: name them with "
                "--queue NAME (repeatable)."
            )
        for name in requested:
            problem = queue_name_problem(name)
            if problem:
                raise WorkerConfigError(f"{name!r}: {problem}", option="queue")
        return tuple(dict.fromkeys(requested))
    if not requested or "*" in requested:
        return tuple(served)
    unknown = sorted(set(requested) - set(served))
    if unknown:
        raise WorkerConfigError(
            f"Unknown queue(s) {', '.join(map(repr, unknown))} for backend "
            f"{backend.alias!r}; it serves: {', '.join(served)}."
        )
    return tuple(dict.fromkeys(requested))


def _checked(option: str, problem: str | None) -> None:
    if problem:
        raise WorkerConfigError(problem, option=option)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one worker process needs to know, resolved from settings and flags."""

    backend_alias: str
    queues: tuple[str, ...]
    concurrency: int
    worker_id: str
    visibility_timeout: float
    shutdown_timeout: float
    poll_interval: float
    prefetch: int = 0
    # Grow the prefetch above ``prefetch`` (its floor) while tasks are short.
    adaptive_prefetch: bool = False
    burst: bool = False
    max_tasks: int | None = None
    log_each_task: bool = False
    listen: bool = True
    # The process that started this worker and stops it (``runtasks --processes``'
    # supervisor, ``--reload``'s reloader); None for a worker started on its own. Once
    # this worker's parent is another process, that one was killed outright (nothing
    # forwarded a stop signal), and the worker stops as SIGTERM would stop it.
    supervisor_pid: int | None = None

    @classmethod
    def from_settings(
        cls,
        backend_alias: str = DEFAULT_TASK_BACKEND_ALIAS,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int | None = None,
        prefetch: int | None = None,
        worker_id: str | None = None,
        visibility_timeout: float | None = None,
        shutdown_timeout: float | None = None,
        poll_interval: float | None = None,
        burst: bool = False,
        max_tasks: int | None = None,
        log_each_task: bool = False,
        listen: bool = True,
    ) -> WorkerConfig:
        """The config for a worker of ``TASKS[backend_alias]``: each flag left at None
        takes the backend's setting (the ``runtasks`` defaults). Raises
        ``WorkerConfigError`` for a bad flag or a backend a worker cannot serve."""
        backend = worker_backend(backend_alias)
        settings = backend.settings
        if worker_id is None:
            worker_id = default_worker_id()
        _checked("worker_id", worker_id_problem(worker_id))
        for option, value in (("concurrency", concurrency), ("max_tasks", max_tasks)):
            if value is not None:
                _checked(option, positive_int_problem(value))
        for option, seconds in (
            ("visibility_timeout", visibility_timeout),
            ("shutdown_timeout", shutdown_timeout),
            ("poll_interval", poll_interval),
        ):
            if seconds is not None:
                _checked(option, positive_seconds_problem(seconds))
        if prefetch is None:
            prefetch = settings.prefetch
        elif isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise WorkerConfigError("must be 0 or more.", option="prefetch")
        concurrency = concurrency or settings.concurrency
        return cls(
            backend_alias=backend.alias,
            queues=served_queues(backend, queues),
            concurrency=concurrency,
            # Unset everywhere: adaptive, from the concurrency up while tasks are short.
            prefetch=concurrency if prefetch is None else prefetch,
            adaptive_prefetch=prefetch is None,
            worker_id=worker_id,
            visibility_timeout=float(visibility_timeout or settings.visibility_timeout),
            shutdown_timeout=float(shutdown_timeout or settings.shutdown_timeout),
            poll_interval=float(poll_interval or settings.poll_interval),
            burst=burst,
            max_tasks=max_tasks,
            log_each_task=log_each_task,
            listen=listen,
        )
