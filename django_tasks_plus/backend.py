"""``DatabaseBackend``: the ``django.tasks`` face of the queue (enqueue, results, checks)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.utils import timezone

from . import compat, events
from .codec import DecodeError
from .collector import PAUSE_FROM, collector_paused
from .conf import BackendSettings, parse_settings, queue_name_problem
from .db import UnsupportedDatabase, dialect_for
from .db.rowlock import OPERATOR_LOCK_WAIT, task_row_held
from .definition import Task, resolve_task, task_enqueue_middleware, validate_task_options
from .envelope import (
    EnqueueHandler,
    Envelope,
    after_middleware,
    build,
    build_enqueue_chain,
    rows,
)
from .exceptions import (
    Cancelled,
    CorruptTaskRecord,
    DatabaseUnavailable,
    InvalidBackendOptions,
    InvalidTaskArguments,
    InvalidTaskOptions,
    QueueFull,
    TaskNotRegistered,
)
from .extensions import load_service_factories
from .finished import send_task_finished
from .lifecycle import error_record
from .metadata import decode_metadata, run_keys
from .results import clone_results, make_result, result_from_record, unreadable_record
from .retry import RetryPolicy
from .signalbatch import send_each


@dataclass(frozen=True)
class CancelOutcome:
    """What ``cancel()`` did: ``"cancelled"``, ``"cancel_requested"`` or ``"already_finished"``."""

    task_id: str
    outcome: str
    status: str

    @property
    def message(self) -> str:
        return {
            "cancelled": "The task was READY and will never run (status FAILED, Cancelled).",
            "cancel_requested": "The task is RUNNING; it was asked to stop cooperatively.",
            "already_finished": f"The task had already finished ({self.status}); left alone.",
        }[self.outcome]


class DatabaseBackend(compat.BaseTaskBackend):
    """Stores tasks in the project's database; ``manage.py runtasks`` runs them."""

    task_class = Task
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings: BackendSettings = parse_settings(alias, params)
        self.queues = set(self.settings.queues)
        # Each task's enqueue middleware chain, by (path, its own entries): built once.
        self._enqueue_chains: dict[tuple[str, tuple[Any, ...]], EnqueueHandler] = {}
        # Service factories the backend's task definitions asked for (``services=``),
        # each once, in definition order: every worker of this backend runs them.
        self.task_services: dict[int, Any] = {}
        self._services_seen: set[tuple[Any, ...]] = set()

    # -- definition time ---------------------------------------------------------------

    def validate_task(self, task: compat.Task) -> None:
        """Django's rules (a queue not in ``QUEUES`` is ``InvalidTask``), then our own.

        Only ``QUEUE_RESOLUTION="fallback"`` lets an unserved queue through; the task's
        rows then go to the fallback queue.
        """
        served = self.settings.serves(task.queue_name)
        if not served and self.settings.queue_resolution == "fallback":
            # Validate everything else as if it named the fallback queue; rows go there.
            dataclasses.replace(task, queue_name=self.settings.fallback_queue)
            return
        super().validate_task(task)
        if not self.settings.queues:  # any name is valid (Django), if the column can hold it
            problem = queue_name_problem(task.queue_name)
            if problem:
                raise InvalidTaskOptions(f"Queue {task.queue_name!r} is not valid: {problem}")
        if isinstance(task, Task):
            validate_task_options(task)
            if task.services:
                self._add_task_services(task)

    def _add_task_services(self, task: Task) -> None:
        try:
            if task.services in self._services_seen:  # validated at every enqueue: once will do
                return
        except TypeError:  # an unhashable entry: not a factory, refused below
            pass
        for factory in load_service_factories(task.services, f"{task.module_path}: services"):
            self.task_services.setdefault(id(factory), factory)
        self._services_seen.add(task.services)

    def retry_policy_for(self, task: compat.Task) -> RetryPolicy:
        """The task's own policy, else the backend default."""
        policy = getattr(task, "retry", None)
        return policy if policy is not None else self.settings.retry

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(self, task: compat.Task, args: Any, kwargs: Any) -> compat.TaskResult:
        """Insert the task on the caller's connection, inside the caller's transaction."""
        return self.enqueue_many(task, [(args, kwargs)])[0]

    def enqueue_many(
        self,
        task: compat.Task,
        calls: Iterable[Any],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[compat.TaskResult]:
        """Enqueue one task per ``(args, kwargs)`` call: all rows or none.

        With a ``dedup_key`` the key governs the whole batch: if it is held, nothing is
        inserted and the results of the tasks holding it are returned instead.
        ``metadata`` starts every row's map (a feature's per-call data, such as a
        schedule's occurrence); the enqueue middleware sees it and may add to it.

        The pipeline (``envelope.py``): validate → build → middleware → write → results.
        A batch of 64 calls or more runs with Python's cyclic garbage collector paused
        (``collector.py``).
        """
        calls = calls if isinstance(calls, list | tuple) else list(calls)
        with collector_paused() if len(calls) >= PAUSE_FROM else nullcontext():
            return self._enqueue_many(task, calls, metadata)

    def _enqueue_many(
        self,
        task: compat.Task,
        calls: Sequence[Any],
        metadata: Mapping[str, Any] | None,
    ) -> list[compat.TaskResult]:
        self.validate_task(task)
        self._require_app()
        envelope = build(
            self.settings,
            task,
            (_split_call(call, index) for index, call in enumerate(calls)),
            now=timezone.now(),
        )
        if metadata:
            envelope = envelope.with_metadata(**metadata)
        if not envelope.calls:
            return []
        chain = self._enqueue_chain(task)
        if chain is None:
            return self._write(envelope)
        results = chain(envelope)
        if type(results) is not list:
            raise TypeError(
                f"The enqueue middleware of {task.module_path} returned {results!r}, not the "
                "list of results call_next returned."
            )
        return results

    def _enqueue_chain(self, task: compat.Task) -> EnqueueHandler | None:
        """The backend's enqueue middleware, then the task's own, around the write step;
        None (no chain at all) in the common case. Built once per task definition."""
        own = getattr(task, "enqueue_middleware", ())
        if not own and not self.settings.enqueue_middleware:
            return None
        key = (task.module_path, own)
        try:
            chain = self._enqueue_chains.get(key)
            cacheable = True
        except TypeError:  # an unhashable entry: build the chain each time
            chain, cacheable = None, False
        if chain is None:
            middlewares = self.settings.enqueue_middleware + task_enqueue_middleware(task)
            chain = build_enqueue_chain(middlewares, partial(self._write_from_chain, task))
            if cacheable:
                self._enqueue_chains[key] = chain
        return chain

    def _write_from_chain(self, task: compat.Task, envelope: Any) -> list[compat.TaskResult]:
        return self._write(after_middleware(task, envelope))

    def _write(self, envelope: Envelope) -> list[compat.TaskResult]:
        """The write step, then the results: dedup key, queue depth, INSERT, all in the
        caller's transaction (a batch or a dedup key opens one of its own, nested)."""
        task = envelope.task
        values = rows(self.settings, envelope)
        database = self.settings.database
        connection = connections[database]
        results: list[compat.TaskResult] = []

        def build_results() -> None:
            # The results need no answer from the database: built while a COPY's rows
            # are still being taken in.
            results.extend(self._new_results(envelope, values[0]["queue_name"]))

        try:
            # One task without a dedup key is one INSERT statement, atomic by itself: no
            # BEGIN/COMMIT round trips around it in autocommit mode.
            single_statement = len(values) == 1 and getattr(task, "dedup_key", None) is None
            with nullcontext() if single_statement else transaction.atomic(using=database):
                held_by = self._take_dedup_key(connection, envelope)
                if held_by is not None:
                    if events.listened(events.TASK_DEDUPLICATED):
                        emit = partial(
                            events.emit_deduplicated, self.alias, task, len(values), held_by
                        )
                        transaction.on_commit(emit, using=database)
                    return [self.get_result(task_id) for task_id in held_by]
                self._check_depth(values[0]["queue_name"], len(values))
                dialect_for(connection).insert_tasks(
                    connection, values, notify=self.settings.notify, meanwhile=build_results
                )
        except DatabaseError as exc:
            if not _connection_lost(connection, exc):
                raise
            raise DatabaseUnavailable(
                f"Cannot enqueue {task.module_path}: database {database!r} is unavailable ({exc})."
            ) from exc
        # Listeners hear of the tasks only once they exist for everyone else too.
        transaction.on_commit(partial(self._announce_enqueued, results), using=database)
        return results

    def _announce_enqueued(self, results: Sequence[compat.TaskResult]) -> None:
        events.emit_enqueued(self.alias, results)  # first: a raising receiver cannot skip it
        send_each(compat.task_enqueued, type(self), "task_result", results)

    async def aenqueue_many(
        self, task: compat.Task, calls: Iterable[Any]
    ) -> list[compat.TaskResult]:
        return await sync_to_async(self.enqueue_many, thread_sensitive=True)(task, list(calls))

    def _take_dedup_key(self, connection: Any, envelope: Envelope) -> list[str] | None:
        task = envelope.task
        key = getattr(task, "dedup_key", None)
        if key is None:
            return None
        from .db.dedup import take_key  # imports the models: not at module import

        now = envelope.enqueued_at
        ttl = getattr(task, "dedup_ttl", None) or self.settings.dedup_ttl
        return take_key(
            connection,
            backend_name=self.alias,
            key=key,
            task_ids=[call.id for call in envelope.calls],
            now=now,
            expires_at=now + ttl,
            until_finished=getattr(task, "dedup_until", "ttl") == "finished",
        )

    def _check_depth(self, queue: str, count: int) -> None:
        """Refuse the batch if it would overfill a queue with a ``max_depth``."""
        limit = self.settings.max_depths.get(queue)
        if limit is None:
            return
        from .db.store import ready_depth

        depth = ready_depth(self.settings.database, self.alias, queue, limit)
        if depth + count > limit:
            raise QueueFull(
                f"Queue {queue!r} holds {depth:,} READY task(s); adding {count:,} would "
                f"exceed its max_depth of {limit:,}.",
                queue_name=queue,
                limit=limit,
                depth=depth,
            )

    def _new_results(self, envelope: Envelope, queue: str) -> list[compat.TaskResult]:
        """One READY result per call; all rows of a batch share task, queue and times."""
        task = envelope.task
        if queue != task.queue_name:
            task = dataclasses.replace(task, queue_name=queue)
        calls = envelope.calls
        first = make_result(
            task,
            id=calls[0].id,
            status=compat.TaskResultStatus.READY,
            backend=self.alias,
            args=calls[0].shown_args,
            kwargs=calls[0].shown_kwargs,
            enqueued_at=envelope.enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
        )
        if len(calls) == 1:  # a single enqueue: nothing to clone
            return [first]
        rest = clone_results(
            first, ((call.id, call.shown_args, call.shown_kwargs) for call in calls[1:])
        )
        return [first, *rest]

    # -- results ------------------------------------------------------------------------

    def get_result(self, result_id: str) -> compat.TaskResult:
        record = self._record(result_id)
        try:
            task = resolve_task(record.task_path)
        except TaskNotRegistered as exc:
            raise TaskNotRegistered(
                f"Task result {result_id} names {record.task_path!r}, which is not a task "
                f"in this codebase: {exc}"
            ) from exc
        return result_from_record(task, record)

    def get_metadata(self, result_id: str) -> Mapping[str, Any]:
        """The task's metadata, decoded (``django_tasks_plus.get_metadata``): one read of
        one column by primary key."""
        self._require_app()
        from .models import TaskRecord

        pk = _task_pk(result_id)
        rows = TaskRecord.objects.using(self.settings.database).filter(
            pk=pk, backend_name=self.alias
        )
        try:
            found = list(rows.values_list("metadata", flat=True)[:1])
        except RecursionError:  # a JSON column too deep for Python's parser
            raise unreadable_record(self.settings.database, str(pk)) from None
        if not found:
            raise compat.TaskResultDoesNotExist(result_id)
        try:
            return decode_metadata(found[0])
        except DecodeError as exc:
            raise CorruptTaskRecord(
                f"Task {pk}: the stored {exc} The row is left as it is; fix or discard it.",
                task_id=str(pk),
                column="metadata",
            ) from exc

    def _record(self, result_id: str) -> Any:
        self._require_app()
        from .models import TaskRecord  # not at import: keeps check E001 reachable

        pk = _task_pk(result_id)
        try:
            return TaskRecord.objects.using(self.settings.database).get(
                pk=pk, backend_name=self.alias
            )
        except TaskRecord.DoesNotExist as exc:
            raise compat.TaskResultDoesNotExist(result_id) from exc
        except RecursionError:  # a JSON column too deep for Python's parser
            raise unreadable_record(self.settings.database, str(pk)) from None

    # -- operations ---------------------------------------------------------------------

    def cancel(self, result_id: str, *, lock_wait: float = OPERATOR_LOCK_WAIT) -> CancelOutcome:
        """Cancel a task: READY never runs; RUNNING is asked to stop; finished is left.

        Like every operator's change below, it waits at most ``lock_wait`` seconds for a
        row another session holds locked, then raises ``TaskRowLocked`` having changed
        nothing (``db/rowlock.py``)."""
        from .db.store import cancel_ready, request_cancel

        database = self.settings.database
        for _ in range(3):  # where rows are not locked, it may move between READY and RUNNING
            record = self._record(result_id)
            task_id = str(record.pk)
            with task_row_held(database, task_id, lock_wait):
                if record.status == compat.TaskResultStatus.READY:
                    now = timezone.now()
                    cancelled = Cancelled("cancelled before it ran")
                    error = error_record(
                        cancelled,
                        "",
                        attempt=record.attempt,
                        worker_id=None,
                        at=now,
                    )
                    if cancel_ready(database, task_id, error, now):
                        self._event_on_commit(events.TASK_CANCELLED, record)
                        transaction.on_commit(
                            partial(self._announce_final, task_id, cancelled), using=database
                        )
                        return CancelOutcome(task_id, "cancelled", compat.TaskResultStatus.FAILED)
                elif record.status == compat.TaskResultStatus.RUNNING:
                    if request_cancel(database, task_id):
                        self._event_on_commit(events.TASK_CANCEL_REQUESTED, record)
                        return CancelOutcome(
                            task_id, "cancel_requested", compat.TaskResultStatus.RUNNING
                        )
                else:
                    return CancelOutcome(task_id, "already_finished", record.status)
        record = self._record(result_id)
        return CancelOutcome(str(record.pk), "already_finished", record.status)

    def redrive(self, result_id: str, *, lock_wait: float = OPERATOR_LOCK_WAIT) -> bool:
        """Run a dead-lettered (FAILED) task again with a fresh retry budget."""
        from .db.store import redrive

        record = self._record(result_id)
        clear = run_keys()  # per-run metadata ends with the run
        database = self.settings.database
        with task_row_held(database, str(record.pk), lock_wait):
            if not redrive(
                database,
                str(record.pk),
                timezone.now(),
                clear_metadata=clear,
                queue=self._wakes(record),
            ):
                return False
            self._event_on_commit(events.TASK_REDRIVEN, record)
        return True

    def run_now(
        self,
        result_id: str,
        *,
        attempt: int | None = None,
        lock_wait: float = OPERATOR_LOCK_WAIT,
    ) -> bool:
        """Make a READY task that waits for its time (a retry, a scheduled or a held
        task) due now; False if it is not READY, already due, or (``attempt`` given) in
        another wait than that one. A held task's circuit still decides at its claim."""
        from .db.store import run_now

        record = self._record(result_id)
        database = self.settings.database
        with task_row_held(database, str(record.pk), lock_wait):
            return run_now(database, str(record.pk), attempt=attempt, queue=self._wakes(record))

    def delete(self, result_id: str, *, lock_wait: float = OPERATOR_LOCK_WAIT) -> bool:
        """Delete a task that is not RUNNING (waiting or finished); False if it runs."""
        from .db.store import delete

        record = self._record(result_id)
        database = self.settings.database
        with task_row_held(database, str(record.pk), lock_wait):
            return delete(database, str(record.pk))

    def discard(self, result_id: str, *, lock_wait: float = OPERATOR_LOCK_WAIT) -> bool:
        """Keep a dead task dead but release the ordering key it blocks."""
        from .db.store import discard

        record = self._record(result_id)
        database = self.settings.database
        with task_row_held(database, str(record.pk), lock_wait):
            if not discard(database, str(record.pk), queue=self._wakes(record)):
                return False
            self._event_on_commit(events.TASK_DISCARDED, record)
        return True

    def _wakes(self, record: Any) -> str | None:
        """The queue whose workers an operation that makes ``record`` due wakes (none
        with ``NOTIFY`` off: workers poll)."""
        return record.queue_name if self.settings.notify else None

    def _event_on_commit(self, name: str, record: Any) -> None:
        """Emit an operation's event once its write commits (at once in autocommit)."""
        if events.listened(name):
            emit = partial(
                events.emit_operation,
                name,
                self.alias,
                str(record.pk),
                record.task_path,
                record.queue_name,
            )
            transaction.on_commit(emit, using=self.settings.database)

    def _announce_final(self, task_id: str, exception: BaseException) -> None:
        """``task_finished`` for a task this backend ended (a cancel), with the exception
        recorded as its error, as the worker sends it for a failed attempt."""
        try:
            result = self.get_result(task_id)
        except TaskNotRegistered:
            return
        send_task_finished(type(self), result, exception)

    # -- checks -------------------------------------------------------------------------

    def _require_app(self) -> None:
        """Refuse to touch the tables when the app that owns them is not installed.

        Without this, Django's ``RuntimeError`` about the model's ``app_label`` is what a
        user who forgot ``INSTALLED_APPS`` would see, which does not say what to do.
        """
        # The label lookup is the fast path (every enqueue passes here); is_installed()
        # also finds the app under a custom label.
        if "django_tasks_plus" not in apps.app_configs and not apps.is_installed(
            "django_tasks_plus"
        ):
            raise InvalidBackendOptions(
                f"TASKS[{self.alias!r}] uses DatabaseBackend, but 'django_tasks_plus' is not in "
                "INSTALLED_APPS: add 'django_tasks_plus' to INSTALLED_APPS and run migrate."
            )

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Run by Django's task-backend check (``django.tasks.checks`` on Django 6, the
        backport's on 5.2), which Django registers when the tasks framework is imported."""
        errors: list[checks.CheckMessage] = list(super().check(**kwargs))
        if not apps.is_installed("django_tasks_plus"):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses DatabaseBackend, but 'django_tasks_plus' is "
                    "not in INSTALLED_APPS.",
                    hint="Add 'django_tasks_plus' to INSTALLED_APPS and run migrate.",
                    id="django_tasks_plus.E001",
                )
            )
            return errors  # the checks below need the app's models
        database = self.settings.database
        if database not in connections:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] is {database!r}, which is not "
                    "in DATABASES.",
                    id="django_tasks_plus.E002",
                )
            )
            return errors
        try:
            dialect = dialect_for(connections[database])
        except UnsupportedDatabase as exc:
            errors.append(checks.Error(str(exc), id="django_tasks_plus.E003"))
            return errors
        for problem in dialect.check(connections[database]):
            errors.append(checks.Error(problem, id="django_tasks_plus.E004"))
        return errors


def _connection_lost(connection: Any, exc: DatabaseError) -> bool:
    """Whether ``exc`` means the database cannot be reached now, rather than a bad write.

    ``OperationalError`` and ``InterfaceError`` are the DB-API's classes for that, but a
    session the server ends can surface as another class (PostgreSQL's
    ``idle_in_transaction_session_timeout`` arrives as an ``InternalError``), so a driver
    connection left closed or broken (or already dropped by Django) counts too.
    """
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    raw = connection.connection
    return raw is None or bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))


def _task_pk(result_id: str) -> uuid.UUID:
    """A result id as the row's primary key; anything else names no task."""
    try:
        return uuid.UUID(str(result_id))
    except ValueError as exc:
        raise compat.TaskResultDoesNotExist(result_id) from exc


def _split_call(call: Any, index: int) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """Accept ``(args, kwargs)`` pairs (and ``(args,)``) in ``enqueue_many``."""
    if isinstance(call, tuple | list) and len(call) in (1, 2):
        args = call[0]
        kwargs = call[1] if len(call) == 2 else {}
        # type() first: the ABC check on Mapping is slow, and dicts are the usual case.
        if isinstance(args, tuple | list) and (type(kwargs) is dict or isinstance(kwargs, Mapping)):
            return args, kwargs
    raise InvalidTaskArguments(
        f"enqueue_many() call #{index} must be an (args, kwargs) pair such as "
        f"((1, 2), {{'x': 3}}), got {call!r}."
    )
