"""``manage.py runtasks``: run the worker."""

from __future__ import annotations

import logging
import os
import sys
from argparse import ArgumentTypeError
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

from ...backend import DatabaseBackend
from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...conf import positive_int_problem, positive_seconds_problem
from ...limits import WORKER_ID_MAX_LENGTH
from ...worker.childwatch import RELAUNCHED_WORKER, SUPERVISOR_PID, lean_supervisor_runnable
from ...worker.config import (
    WorkerConfig,
    WorkerConfigError,
    default_worker_id,
    worker_backend,
    worker_id_problem,
)
from ...worker.engine import MAX_ADAPTIVE_PREFETCH, Worker, prepare_to_fork
from ...worker.reload import Reloader, is_reloaded_child, require_watchfiles
from ...worker.services import ServiceStartError
from ...worker.supervisor import Relaunch, supervise
from ..base import BackendCommand

LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.INFO, 3: logging.DEBUG}
# The supervisor's own records (as worker/supervisor.py's: one logger for the worker side).
logger = logging.getLogger("django_tasks_plus.worker")


# argparse types: parse the text, then check the number with the settings' own validators.


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    problem = positive_seconds_problem(number)
    if problem:
        raise ArgumentTypeError(problem)
    return number


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    problem = positive_int_problem(number)
    if problem:
        raise ArgumentTypeError(problem)
    return number


def _worker_id(value: str) -> str:
    problem = worker_id_problem(value)
    if problem:
        raise ArgumentTypeError(problem)
    return value


def _relaunched_worker() -> tuple[int, str] | None:
    """The worker this process replaces, when the lean supervisor restarted it
    (``childwatch.RELAUNCHED_WORKER``): its index and worker id. Taken out of the
    environment, so the task code and its subprocesses do not inherit it."""
    value = os.environ.pop(RELAUNCHED_WORKER, None)
    if value is None:
        return None
    index, _, worker_id = value.partition(" ")
    if not index.isdigit() or worker_id_problem(worker_id):
        raise CommandError(
            f"{RELAUNCHED_WORKER}={value!r} is not '<index> <worker id>'; it is set by "
            "runtasks --processes for the workers it restarts, not by hand."
        )
    return int(index), worker_id


def _supervisor_pid(relaunched: bool) -> int | None:
    """The pid of the supervisor or reloader that started this process
    (``childwatch.SUPERVISOR_PID``), taken out of the environment as the relaunch marker
    is; a restarted worker whose supervisor did not name itself (one still running an
    earlier release) takes its parent's."""
    value = os.environ.pop(SUPERVISOR_PID, None)
    if value is None:
        return os.getppid() if relaunched else None
    if not value.isdigit() or int(value) < 1:  # 1: a supervisor that is a container's init
        raise CommandError(
            f"{SUPERVISOR_PID}={value!r} is not a process id; it is set by runtasks "
            "--processes and --reload for the workers they start, not by hand."
        )
    return int(value)


def _flag(error: WorkerConfigError) -> str:
    """A ``WorkerConfigError`` as runtasks words it: the keyword as its ``--flag``."""
    if error.option is None:
        return error.problem
    return f"--{error.option.replace('_', '-')} {error.problem}"


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


def _run_child(config: WorkerConfig, index: int) -> int:
    """One of --processes' workers; a start-up failure is one line, as for a single
    process, and exit status 1."""
    try:
        return Worker(config).run()
    except ServiceStartError as exc:
        logger.error("Worker process %d: %s", index, exc)
        return 1


def _describe_prefetch(config: WorkerConfig) -> str:
    if config.adaptive_prefetch:
        return f"adaptive, {config.prefetch} to {MAX_ADAPTIVE_PREFETCH}"
    return str(config.prefetch)


class Command(BackendCommand):
    help = "Run tasks from the django-tasks-plus database queue."

    # True when this command is the process's program (manage.py, django-admin), not a
    # call_command() inside some other program: only then may --processes replace the
    # process with the lean supervisor.
    owns_the_process = False

    def run_from_argv(self, argv: list[str]) -> None:
        self.owns_the_process = True
        super().run_from_argv(argv)

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
            "1024 while tasks are short).",
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
            "--reload",
            action="store_true",
            help="Development only: restart the worker when a Python file under the current "
            "directory changes (needs django-tasks-plus[reload]).",
        )
        parser.add_argument(
            "--worker-id",
            type=_worker_id,
            help="Name of this worker (default: host-pid-random).",
        )
        parser.add_argument(
            "--visibility-timeout",
            type=_seconds,
            help="Seconds a lease lasts without a heartbeat (default: OPTIONS, 60).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=_seconds,
            help="Seconds to let running tasks finish after SIGTERM (default: OPTIONS, 30).",
        )
        parser.add_argument(
            "--poll-interval",
            type=_seconds,
            help="Longest wait between polls when idle (default: OPTIONS, 1.0).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = int(options["verbosity"])
        _configure_logging(verbosity)
        backend = self._backend(options["backend"])
        processes = options["processes"]
        worker_id = options["worker_id"]
        relaunched = _relaunched_worker()
        supervisor_pid = _supervisor_pid(relaunched is not None)
        if relaunched is not None:  # one of --processes' workers, restarted on its own
            processes, worker_id = 1, relaunched[1]
        if worker_id is None:
            worker_id = default_worker_id()
        # call_command() passes options without argparse's type check: check here too,
        # leaving room for the "-N" suffix of each forked process.
        suffix_room = len(f"-{processes}") if processes > 1 else 0
        problem = worker_id_problem(worker_id, WORKER_ID_MAX_LENGTH - suffix_room)
        if problem:
            raise CommandError(f"--worker-id {problem}")
        try:
            config = WorkerConfig.from_settings(
                backend.alias,
                queues=options["queues"],
                concurrency=options["concurrency"],
                prefetch=options["prefetch"],
                worker_id=worker_id,
                visibility_timeout=options["visibility_timeout"],
                shutdown_timeout=options["shutdown_timeout"],
                poll_interval=options["poll_interval"],
                burst=options["burst"],
                max_tasks=options["max_tasks"],
                log_each_task=verbosity >= 1,
            )
        except WorkerConfigError as exc:
            raise CommandError(_flag(exc)) from None
        config = replace(config, supervisor_pid=supervisor_pid)
        if options.get("reload") and not is_reloaded_child():
            return self._reload(config)
        if verbosity >= 1 and relaunched is None:
            self._banner(backend, config, processes)
        sys.stdout.flush()
        if relaunched is not None:
            code = _run_child(config, relaunched[0])
        elif processes == 1:
            try:
                code = Worker(config).run()
            except ServiceStartError as exc:
                raise CommandError(str(exc)) from exc
        else:
            worker_ids = [f"{worker_id}-{index}" for index in range(processes)]
            supervisor = os.getpid()  # this process, and the lean one it becomes

            def run_child(index: int) -> int:
                child = replace(config, worker_id=worker_ids[index], supervisor_pid=supervisor)
                return _run_child(child, index)

            prepare_to_fork(config)
            code = supervise(
                processes,
                run_child,
                restart=not config.burst,
                relaunch=self._relaunch(worker_ids),
            )
        sys.stdout.flush()
        sys.stderr.flush()
        if code:
            # Threads still running abandoned tasks would block a normal exit.
            os._exit(code)

    def _relaunch(self, worker_ids: list[str]) -> Relaunch | None:
        """How the lean supervisor restarts a worker: this command line again (as Django's
        runserver re-runs itself); None when this process is not the command's own."""
        if not self.owns_the_process or not lean_supervisor_runnable():
            return None
        from django.utils.autoreload import get_child_arguments

        try:
            command = get_child_arguments()
        except RuntimeError as exc:  # a script path that no longer exists
            logger.warning("Workers will be supervised by this process: %s", exc)
            return None
        return Relaunch(command=command, worker_ids=worker_ids)

    def _reload(self, config: WorkerConfig) -> None:
        """Watch the code and run the worker in a child that restarts on change."""
        if config.burst:
            raise CommandError(
                "--reload and --burst do not mix: a burst worker exits when the queue is "
                "empty, so there is nothing to restart."
            )
        # How Django's runserver re-runs itself (python -m, -W and -X options kept).
        from django.utils.autoreload import get_child_arguments

        try:
            require_watchfiles()
            command = get_child_arguments()
        except (ImportError, RuntimeError) as exc:
            raise CommandError(str(exc)) from None
        sys.stdout.flush()
        code = Reloader(command, Path.cwd(), stop_timeout=config.shutdown_timeout).run()
        sys.stdout.flush()
        sys.stderr.flush()
        if code:
            os._exit(code)

    def _backend(self, alias: str) -> DatabaseBackend:
        try:
            return worker_backend(alias)
        except WorkerConfigError as exc:
            raise CommandError(_flag(exc)) from exc

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
