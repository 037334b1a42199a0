"""Lifecycle events: the one place that says what happened to tasks and workers.

Enqueue, the worker and the reaper call the small ``emit_*`` helpers below at each step
of a task's life; a helper does nothing unless someone subscribed to its event, so an
unobserved queue pays one dictionary lookup per step. Subscribers (metrics, the
dashboard, logging, tracing) receive one frozen ``Event`` per occurrence: a name,
numbers (``measurements``) and ``labels``.

Handlers run synchronously, on the thread that emits (see ``docs/events.md`` for which
thread that is), and must be quick. A handler that raises is logged with the event's
name and otherwise ignored: observing the queue can never change what it does.
Django's ``task_enqueued``/``task_started``/``task_finished`` signals are separate and
unchanged; they are sent as Django documents them, not from here.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from .compat import TaskResultStatus
from .registries import app, installed_app

if TYPE_CHECKING:
    from .compat import Task, TaskResult
    from .lifecycle import ClaimedTask, Transition

logger = logging.getLogger("django_tasks_plus.events")

# -- names --------------------------------------------------------------------------------
# Enqueue side: emitted once the enqueuing (or operating) transaction commits.
TASK_ENQUEUED = "task.enqueued"  # one per enqueue()/enqueue_many() call, with its count
TASK_DEDUPLICATED = "task.deduplicated"  # the dedup key was held: nothing was inserted
TASK_CANCELLED = "task.cancelled"  # a READY task cancelled, or a RUNNING one that stopped
TASK_CANCEL_REQUESTED = "task.cancel_requested"  # a RUNNING task was asked to stop
TASK_REDRIVEN = "task.redriven"
TASK_DISCARDED = "task.discarded"
# Worker side.
TASKS_CLAIMED = "tasks.claimed"  # one per claim statement that returned tasks
TASK_STARTED = "task.started"
TASK_SUCCEEDED = "task.succeeded"
TASK_ATTEMPT_FAILED = "task.attempt_failed"  # the attempt recorded an error
TASK_RETRY_SCHEDULED = "task.retry_scheduled"
TASK_DEFERRED = "task.deferred"
TASK_DEAD_LETTERED = "task.dead_lettered"
TASK_LEASE_LOST = "task.lease_lost"
TASK_REAPED = "task.reaped"
WORKER_STARTED = "worker.started"
WORKER_STOPPED = "worker.stopped"
# Flow control (middleware holds, circuit breakers) and leadership.
TASK_HELD = "task.held"  # a middleware held one claimed task back (no attempt spent)
TASK_RELEASED = "task.released"  # held tasks made due now (a circuit closed), with count
LEADER_ELECTED = "leader.elected"
LEADER_LOST = "leader.lost"
# Circuit breakers (circuits.py); labels name the breaker and the key.
BREAKER_STATE_CHANGED = "breaker.state_changed"  # labels: old and new state, why
BREAKER_PROBE_STARTED = "breaker.probe_started"  # the half-open circuit's one probe runs
BREAKER_PARKED = "breaker.parked"  # a key's waiting tasks held in one statement, with count
BREAKER_DROPPED = "breaker.dropped"  # a task held past the held TTL was dead-lettered

EMITTED = frozenset(
    {
        TASK_ENQUEUED,
        TASK_DEDUPLICATED,
        TASK_CANCELLED,
        TASK_CANCEL_REQUESTED,
        TASK_REDRIVEN,
        TASK_DISCARDED,
        TASKS_CLAIMED,
        TASK_STARTED,
        TASK_SUCCEEDED,
        TASK_ATTEMPT_FAILED,
        TASK_RETRY_SCHEDULED,
        TASK_DEFERRED,
        TASK_DEAD_LETTERED,
        TASK_LEASE_LOST,
        TASK_REAPED,
        WORKER_STARTED,
        WORKER_STOPPED,
        TASK_HELD,
        TASK_RELEASED,
        LEADER_ELECTED,
        LEADER_LOST,
        BREAKER_STATE_CHANGED,
        BREAKER_PROBE_STARTED,
        BREAKER_PARKED,
        BREAKER_DROPPED,
    }
)
RESERVED: frozenset[str] = frozenset()
NAMES = EMITTED | RESERVED

_CANCELLED_PATH = "django_tasks_plus.exceptions.Cancelled"
_FAILURE_NAMES = frozenset(
    {TASK_ATTEMPT_FAILED, TASK_RETRY_SCHEDULED, TASK_DEAD_LETTERED, TASK_CANCELLED}
)


class Event(NamedTuple):
    """One occurrence. ``measurements`` are numbers (durations in seconds, counts);
    ``labels`` say what it is about (ids, paths, queue, worker, status, reason).

    Immutable. A named tuple rather than a frozen dataclass because it is built on the
    worker's hot path: it costs about a third as much to create.
    """

    name: str
    measurements: Mapping[str, float]
    labels: Mapping[str, Any]
    time: float  # wall-clock seconds since the epoch, when emitted

    @property
    def metadata(self) -> Mapping[str, Any]:
        """Deprecated: ``labels`` (a task's *metadata* is its stored map, ``metadata.py``)."""
        warnings.warn(
            "Event.metadata is deprecated; use Event.labels.", DeprecationWarning, stacklevel=2
        )
        return self.labels


Handler = Callable[[Event], object]


class EventBus:
    """The app's event registry: the event names and who listens to each. The app owns
    the one in use (``bus()``: its ``AppConfig.event_bus``).

    The engine's names are built in; a feature registers the names it emits
    (``register_names``) before anyone may subscribe to them. ``handlers`` (name ->
    handlers) is replaced as a whole under the lock, never changed in place, so emitting
    reads it without a lock; a name with no handler has no key. ``reset()`` forgets every
    subscriber and every feature's name (tests; ``metrics.install()`` subscribes the
    aggregator again; ``registries.reset()`` does both)."""

    def __init__(self, builtin: frozenset[str]) -> None:
        self.builtin = builtin
        self.names: frozenset[str] = builtin
        self.handlers: dict[str, tuple[Handler, ...]] = {}
        self._lock = threading.Lock()

    def register_names(self, *names: str, builtin: bool = False) -> None:
        """Let subscribers use ``names`` (a feature's events: ``"feature.what_happened"``).
        Registering a name again changes nothing. ``builtin=True``: a feature of the app
        (registered by ``AppConfig.ready``), kept by ``reset()``."""
        for name in names:
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(
                    f"An event name is lowercase words joined by '.' or '_', such as "
                    f"'schedule.fired', got {name!r}."
                )
        with self._lock:
            self.names = self.names | frozenset(names)
            if builtin:
                self.builtin = self.builtin | frozenset(names)

    def checked(self, names: Sequence[str]) -> tuple[str, ...]:
        if not names:
            return tuple(sorted(self.names))
        unknown = [name for name in names if name not in self.names]
        if unknown:
            raise ValueError(
                f"Unknown event name(s) {', '.join(map(repr, unknown))}; use the constants in "
                f"django_tasks_plus.events or a name a feature registered "
                f"(events.register_names), one of: {', '.join(sorted(self.names))}."
            )
        return tuple(names)

    def subscribe(self, handler: Handler, *names: str) -> Handler:
        """Call ``handler(event)`` for each event named (every event when none is named).

        Subscribing the same handler to a name twice has no further effect. Returns
        ``handler``, so a bare ``@subscribe`` decorator subscribes a function to everything.
        """
        if not callable(handler):
            raise TypeError(f"An event handler must be callable, got {handler!r}.")
        wanted = self.checked(names)
        with self._lock:
            updated = dict(self.handlers)
            for name in wanted:
                current = updated.get(name, ())
                if not any(_same(handler, h) for h in current):
                    updated[name] = (*current, handler)
            self.handlers = updated
        return handler

    def unsubscribe(self, handler: Handler, *names: str) -> None:
        """Stop calling ``handler`` for the events named (for every event when none is)."""
        wanted = self.checked(names)
        with self._lock:
            updated = dict(self.handlers)
            for name in wanted:
                remaining = tuple(h for h in updated.get(name, ()) if not _same(handler, h))
                if remaining:
                    updated[name] = remaining
                else:
                    updated.pop(name, None)
            self.handlers = updated

    def reset(self) -> None:
        """No subscriber and only the built-in names (tests)."""
        with self._lock:
            self.handlers = {}
            self.names = self.builtin


_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")

_NO_HANDLERS: Mapping[str, tuple[Handler, ...]] = MappingProxyType({})


def bus() -> EventBus:
    """The app's event bus (owned by the installed app, ``apps.TasksPlusConfig``)."""
    return cast(EventBus, app().event_bus)


def _handlers() -> Mapping[str, tuple[Handler, ...]]:
    """The subscribers by name, read without a lock; none when the app is not installed
    (emitting never raises)."""
    config = installed_app()
    if config is None:
        return _NO_HANDLERS
    return cast(EventBus, config.event_bus).handlers


def register_names(*names: str, builtin: bool = False) -> None:
    """A feature's event names (``bus().register_names``)."""
    bus().register_names(*names, builtin=builtin)


# -- subscribing --------------------------------------------------------------------------


def _same(a: Handler, b: Handler) -> bool:
    """The same handler: by identity, not ``==`` (two handler objects may compare equal),
    except that ``obj.method`` is a new object each time it is read."""
    if a is b:
        return True
    self_a = getattr(a, "__self__", None)
    if self_a is None or self_a is not getattr(b, "__self__", None):
        return False
    return _method_of(a) == _method_of(b)


def _method_of(bound: Handler) -> object:
    """A method's function; a built-in method (``list.append``) has only its name."""
    return getattr(bound, "__func__", None) or getattr(bound, "__name__", None)


def subscribe(handler: Handler, *names: str) -> Handler:
    """``bus().subscribe``: call ``handler(event)`` for each event named (every event when
    none is named); returns ``handler``, so a bare ``@subscribe`` decorates a function."""
    return bus().subscribe(handler, *names)


def unsubscribe(handler: Handler, *names: str) -> None:
    """``bus().unsubscribe``: stop calling ``handler`` for the events named (every event
    when none is)."""
    bus().unsubscribe(handler, *names)


@contextmanager
def subscribed(handler: Handler, *names: str) -> Iterator[Handler]:
    """``subscribe`` for the duration of a ``with`` block (tests, one-off measurements)."""
    subscribe(handler, *names)
    try:
        yield handler
    finally:
        unsubscribe(handler, *names)


def listened(name: str) -> bool:
    """Whether anyone subscribed to ``name``: check it before building anything costly."""
    return name in _handlers()


def emit(name: str, measurements: Mapping[str, float], labels: Mapping[str, Any]) -> None:
    """Deliver one event to its subscribers, in subscription order; never raises.

    The helpers below call this, and so do the features for the names they registered.
    """
    handlers = _handlers().get(name)
    if handlers:
        _deliver(handlers, name, measurements, labels)


def _deliver(
    handlers: tuple[Handler, ...],
    name: str,
    measurements: Mapping[str, float],
    labels: Mapping[str, Any],
) -> None:
    """``emit`` once the subscribers are known: the per-attempt helpers look them up
    once, not once to decide and again to deliver."""
    event = Event(name, measurements, labels, time.time())
    for handler in handlers:
        try:
            handler(event)
        except Exception:
            logger.exception("Event subscriber %r failed on %s; ignored.", handler, name)


# -- enqueue side ---------------------------------------------------------------------------


def emit_enqueued(backend: str, results: Sequence[TaskResult]) -> None:
    """One event per enqueue call, after commit; ``count`` is the number of rows."""
    if TASK_ENQUEUED not in _handlers() or not results:
        return
    task = results[0].task
    emit(
        TASK_ENQUEUED,
        {"count": len(results)},
        {
            "backend": backend,
            "task_path": task.module_path,
            "queue": task.queue_name,
            "priority": task.priority,
            "task_ids": tuple(result.id for result in results),
            "dedup_key": getattr(task, "dedup_key", None),
            "ordering_key": getattr(task, "ordering_key", None),
        },
    )


def emit_deduplicated(backend: str, task: Task, count: int, held_by: Sequence[str]) -> None:
    """The key was held: ``count`` calls inserted nothing; ``held_by`` are the holder's ids."""
    emit(
        TASK_DEDUPLICATED,
        {"count": count},
        {
            "backend": backend,
            "task_path": task.module_path,
            "queue": task.queue_name,
            "dedup_key": getattr(task, "dedup_key", None),
            "held_by": tuple(held_by),
        },
    )


def emit_operation(name: str, backend: str, task_id: str, task_path: str, queue: str) -> None:
    """Cancelled, cancel requested, redriven or discarded by an operator call."""
    emit(
        name,
        {},
        {"backend": backend, "task_id": task_id, "task_path": task_path, "queue": queue},
    )


# -- worker side ----------------------------------------------------------------------------


def emit_claimed(
    backend: str, worker_id: str, queues: Sequence[str], count: int, limit: int, seconds: float
) -> None:
    """One claim statement returned ``count`` tasks (asked for ``limit``) in ``seconds``."""
    if TASKS_CLAIMED not in _handlers():
        return
    emit(
        TASKS_CLAIMED,
        {"count": count, "limit": limit, "duration": seconds},
        {"backend": backend, "worker_id": worker_id, "queues": tuple(queues)},
    )


def _task_labels(claimed: ClaimedTask) -> dict[str, Any]:
    return {
        "backend": claimed.backend_name,
        "task_id": claimed.id,
        "task_path": claimed.task_path,
        "queue": claimed.queue_name,
        "worker_id": claimed.worker_ids[-1] if claimed.worker_ids else None,
    }


def emit_started(claimed: ClaimedTask, started: datetime) -> None:
    """About to call the task function; ``queue_time`` is how long it waited once due."""
    handlers = _handlers().get(TASK_STARTED)
    if not handlers:
        return
    labels = _task_labels(claimed)
    labels["priority"] = claimed.priority
    _deliver(
        handlers,
        TASK_STARTED,
        {
            "attempt": claimed.attempt,
            "queue_time": max(0.0, (started - claimed.run_after).total_seconds()),
        },
        labels,
    )


def emit_outcome(
    claimed: ClaimedTask,
    outcome: Transition,
    run_time: float | None,
    clock: Callable[[], datetime],
) -> None:
    """An attempt's outcome was written: succeeded, deferred, or attempt failed followed
    by retry scheduled, dead-lettered or cancelled. ``run_time`` is None for the reaper.

    Called on the worker's outcome-writer thread, so it never raises.
    """
    handlers = _handlers()
    if not handlers:  # the common case, decided before anything else
        return
    try:
        if outcome.status == TaskResultStatus.SUCCESSFUL:
            succeeded = handlers.get(TASK_SUCCEEDED)
            if succeeded:
                numbers = _attempt_numbers(claimed, run_time)
                _deliver(succeeded, TASK_SUCCEEDED, numbers, _task_labels(claimed))
            return
        if outcome.error is None:
            if outcome.held_because is not None:
                if TASK_HELD in handlers:
                    run_after = outcome.values.get("run_after")
                    emit(
                        TASK_HELD,
                        {**_attempt_numbers(claimed, run_time), **_delay(run_after, clock)},
                        {
                            **_task_labels(claimed),
                            "run_after": run_after,
                            "reason": outcome.held_because,
                        },
                    )
                return
            if TASK_DEFERRED in handlers and outcome.status == TaskResultStatus.READY:
                run_after = outcome.values.get("run_after")
                emit(
                    TASK_DEFERRED,
                    {**_attempt_numbers(claimed, run_time), **_delay(run_after, clock)},
                    {**_task_labels(claimed), "run_after": run_after},
                )
            return
        _emit_failure(claimed, outcome, run_time, clock)
    except Exception:
        logger.exception("Could not emit the outcome events of task %s; ignored.", claimed.id)


def _emit_failure(
    claimed: ClaimedTask,
    outcome: Transition,
    run_time: float | None,
    clock: Callable[[], datetime],
) -> None:
    """``task.attempt_failed``, then what became of the task."""
    if _FAILURE_NAMES.isdisjoint(_handlers()):
        return
    error = outcome.error or {}
    labels = {**_task_labels(claimed), "exception": error.get("exception_class_path")}
    emit(
        TASK_ATTEMPT_FAILED,
        _attempt_numbers(claimed, run_time),
        {**labels, "status": str(outcome.status)},
    )
    if outcome.status == TaskResultStatus.READY:
        run_after = outcome.values.get("run_after")
        emit(
            TASK_RETRY_SCHEDULED,
            {"attempt": claimed.attempt, **_delay(run_after, clock)},
            {**labels, "run_after": run_after},
        )
        return
    cancelled = labels["exception"] == _CANCELLED_PATH
    emit(
        TASK_CANCELLED if cancelled else TASK_DEAD_LETTERED,
        {"attempt": claimed.attempt},
        {**labels, "reason": outcome.values.get("dead_letter_reason", "")},
    )


def _attempt_numbers(claimed: ClaimedTask, run_time: float | None) -> dict[str, float]:
    if run_time is None:
        return {"attempt": claimed.attempt}
    return {"attempt": claimed.attempt, "run_time": run_time}


def _delay(run_after: Any, clock: Callable[[], datetime]) -> dict[str, float]:
    if not isinstance(run_after, datetime):
        return {}
    return {"delay": max(0.0, (run_after - clock()).total_seconds())}


def emit_lease_lost(worker_id: str, tasks: Sequence[ClaimedTask]) -> None:
    """This worker's leases on ``tasks`` were taken over; one event per task."""
    if TASK_LEASE_LOST not in _handlers():
        return
    for claimed in tasks:
        emit(
            TASK_LEASE_LOST,
            {"attempt": claimed.attempt},
            {**_task_labels(claimed), "worker_id": worker_id},
        )


def emit_reaped(claimed: ClaimedTask, outcome: Transition, now: datetime) -> None:
    """An expired lease was settled: ``task.reaped``, then the attempt's outcome events
    (its ``worker_id`` is the worker that stopped renewing the lease)."""
    try:
        if TASK_REAPED in _handlers():
            emit(
                TASK_REAPED,
                {"attempt": claimed.attempt},
                {**_task_labels(claimed), "status": str(outcome.status)},
            )
    except Exception:
        logger.exception("Could not emit task.reaped for task %s; ignored.", claimed.id)
    emit_outcome(claimed, outcome, None, lambda: now)


def emit_worker_started(
    backend: str, worker_id: str, queues: Sequence[str], concurrency: int
) -> None:
    emit(
        WORKER_STARTED,
        {"concurrency": concurrency},
        {"backend": backend, "worker_id": worker_id, "queues": tuple(queues)},
    )


def emit_worker_stopped(
    backend: str, worker_id: str, *, claimed: int, abandoned: int, uptime: float
) -> None:
    emit(
        WORKER_STOPPED,
        {"claimed": claimed, "abandoned": abandoned, "uptime": uptime},
        {"backend": backend, "worker_id": worker_id},
    )
