"""``manage.py runtasks``: run the worker."""

from __future__ import annotations

import logging
import os
import sys
from argparse import ArgumentTypeError
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ...backend import DatabaseBackend
from ...compat import DEFAULT_TASK_BACKEND_ALIAS, InvalidTaskBackend, task_backends
from ...conf import queue_name_problem
from ...exceptions import TasksPlusError
from ...worker.engine import (
    MAX_ADAPTIVE_PREFETCH,
    WORKER_ID_MAX_LENGTH,
    Worker,
    WorkerConfig,
    default_worker_id,
)
from ...worker.supervisor import supervise

LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.INFO, 3: logging.DEBUG}


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise ArgumentTypeError(f"must be more than 0, got {value}")
    return number


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _worker_id(value: str) -> str:
    """A worker id names the worker in results and logs: a blank one would name nobody."""
    if not value.strip():
        raise ArgumentTypeError(f"must not be empty or blank, got {value!r}")
    return value


def _configure_logging(verbosity: int) -> None:
    """Honour -v even when the project's LOGGING says nothing about this package."""
    package_logger = logging.getLogger("django_tasks_plus")
    package_logger.setLevel(LOG_LEVELS.get(verbosity, logging.DEBUG))
    # Django's own task-signal receivers log every start and finish at INFO (failures at
    # ERROR). Below -v 2 that is per-task logging nobody asked for, and it costs a log
    # record per task; a level the project set on that logger is left alone.
    # ("django_tasks" is the backport's name for the same logger.)
    for name in ("django.tasks", "django_tasks"):
        framework_logger = logging.getLogger(name)
        if verbosity < 2 and framework_logger.level == logging.NOTSET:
            framework_logger.setLevel(logging.WARNING)
    if not package_logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [pid %(process)d] %(message)s")
        )
        package_logger.addHandler(handler)


def _describe_prefetch(config: WorkerConfig) -> str:
    if config.adaptive_prefetch:
        return f"adaptive, {config.prefetch} to {MAX_ADAPTIVE_PREFETCH}"
    return str(config.prefetch)


class Command(BaseCommand):
    help = "Run tasks from the django-tasks-plus database queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="Queue to serve (repeatable); '*' serves every queue of the backend (default).",
        )
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="TASKS alias.")
        parser.add_argument(
            "--concurrency",
            type=_positive_int,
            help="Threads running tasks in each process (default: OPTIONS['CONCURRENCY'], 8).",
        )
        parser.add_argument(
            "--prefetch",
            type=int,
            help="Tasks claimed beyond free threads, so claims come in batches "
            "(default: OPTIONS['PREFETCH'], else adaptive: from the concurrency up to "
            "256 while tasks are short).",
        )
        parser.add_argument(
            "--processes", type=_positive_int, default=1, help="Worker processes to fork."
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit 0 once no task is ready to run."
        )
        parser.add_argument(
            "--max-tasks", type=_positive_int, help="Exit after running this many tasks."
        )
        parser.add_argument(
            "--worker-id",
            type=_worker_id,
            help="Name of this worker (default: host-pid-random).",
        )
        parser.add_argument(
            "--visibility-timeout",
            type=_positive_float,
            help="Seconds a lease lasts without a heartbeat (default: OPTIONS, 60).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=_positive_float,
            help="Seconds to let running tasks finish after SIGTERM (default: OPTIONS, 30).",
        )
        parser.add_argument(
            "--poll-interval",
            type=_positive_float,
            help="Longest wait between polls when idle (default: OPTIONS, 1.0).",
        )

    def execute(self, *args: Any, **options: Any) -> str | None:
        # Create the backend before the system checks do, so that a bad TASKS entry ends
        # as a one-line CommandError naming the key, not as a traceback from the checks.
        self._backend(options["backend"])
        return super().execute(*args, **options)

    def check(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().check(*args, **kwargs)
        except (InvalidTaskBackend, TasksPlusError) as exc:  # another alias's entry
            raise CommandError(str(exc)) from exc

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = int(options["verbosity"])
        _configure_logging(verbosity)
        backend = self._backend(options["backend"])
        settings = backend.settings
        queues = self._queues(backend, options["queues"])
        worker_id = options["worker_id"]
        if worker_id is None:
            worker_id = default_worker_id()
        else:  # call_command() passes options without argparse's type check
            try:
                _worker_id(worker_id)
            except ArgumentTypeError as exc:
                raise CommandError(f"--worker-id {exc}") from None
        processes = options["processes"]
        suffix_room = len(f"-{processes}") if processes > 1 else 0
        if len(worker_id) + suffix_room > WORKER_ID_MAX_LENGTH:
            raise CommandError(
                f"--worker-id is {len(worker_id)} characters; at most "
                f"{WORKER_ID_MAX_LENGTH - suffix_room} fit."
            )
        if options["prefetch"] is not None and options["prefetch"] < 0:
            raise CommandError("--prefetch must be 0 or more.")
        concurrency = options["concurrency"] or settings.concurrency
        prefetch = options["prefetch"]
        if prefetch is None:
            prefetch = settings.prefetch
        # Unset everywhere: adaptive, from the concurrency up while tasks are short.
        adaptive = prefetch is None
        config = WorkerConfig(
            backend_alias=backend.alias,
            queues=queues,
            concurrency=concurrency,
            prefetch=concurrency if prefetch is None else prefetch,
            adaptive_prefetch=adaptive,
            worker_id=worker_id,
            visibility_timeout=options["visibility_timeout"] or settings.visibility_timeout,
            shutdown_timeout=options["shutdown_timeout"] or settings.shutdown_timeout,
            poll_interval=options["poll_interval"] or settings.poll_interval,
            burst=options["burst"],
            max_tasks=options["max_tasks"],
            log_each_task=verbosity >= 2,
        )
        if verbosity >= 1:
            self._banner(backend, config, processes)
        sys.stdout.flush()
        if processes == 1:
            code = Worker(config).run()
        else:

            def run_child(index: int) -> int:
                child = WorkerConfig(**{**config.__dict__, "worker_id": f"{worker_id}-{index}"})
                return Worker(child).run()

            code = supervise(processes, run_child, restart=not config.burst)
        sys.stdout.flush()
        sys.stderr.flush()
        if code:
            # Threads still running abandoned tasks would block a normal exit.
            os._exit(code)

    def _backend(self, alias: str) -> DatabaseBackend:
        configured = getattr(settings, "TASKS", {}) or {}
        if alias not in configured:
            known = ", ".join(sorted(configured)) or "nothing"
            raise CommandError(f"Unknown task backend {alias!r}; TASKS configures: {known}.")
        try:
            backend = task_backends[alias]
        except (InvalidTaskBackend, TasksPlusError) as exc:
            raise CommandError(f"Task backend {alias!r}: {exc}") from exc
        if not isinstance(backend, DatabaseBackend):
            raise CommandError(
                f"Task backend {alias!r} is {type(backend).__module__}."
                f"{type(backend).__qualname__}; runtasks needs "
                "django_tasks_plus.backend.DatabaseBackend."
            )
        return backend

    def _queues(self, backend: DatabaseBackend, requested: list[str] | None) -> tuple[str, ...]:
        served = sorted(backend.settings.queues)
        if not served:  # QUEUES: [] lets tasks name any queue; the worker must be told which
            if not requested or "*" in requested:
                raise CommandError(
                    f"TASKS[{backend.alias!r}]['QUEUES'] is empty, so tasks may name any "
                    "queue and there is no list of queues to serve: name them with "
                    "--queue NAME (repeatable)."
                )
            for name in requested:
                problem = queue_name_problem(name)
                if problem:
                    raise CommandError(f"--queue {name!r}: {problem}")
            return tuple(dict.fromkeys(requested))
        if not requested or "*" in requested:
            return tuple(served)
        unknown = sorted(set(requested) - set(served))
        if unknown:
            raise CommandError(
                f"Unknown queue(s) {', '.join(map(repr, unknown))} for backend "
                f"{backend.alias!r}; it serves: {', '.join(served)}."
            )
        return tuple(dict.fromkeys(requested))

    def _banner(self, backend: DatabaseBackend, config: WorkerConfig, processes: int) -> None:
        connection = connections[backend.settings.database]
        name = connection.settings_dict.get("NAME")
        worker_ids = config.worker_id if processes == 1 else f"{config.worker_id}-0…{processes - 1}"
        self.stdout.write(
            f"django-tasks-plus worker {worker_ids}\n"
            f"  backend:     {backend.alias} ({type(backend).__name__})\n"
            f"  database:    {backend.settings.database} ({connection.vendor}: {name})\n"
            f"  queues:      {', '.join(config.queues)}\n"
            f"  processes:   {processes} x {config.concurrency} threads\n"
            f"  prefetch:    {_describe_prefetch(config)}\n"
            f"  visibility:  {config.visibility_timeout:g} s"
            f"{'   mode: burst' if config.burst else ''}"
        )
