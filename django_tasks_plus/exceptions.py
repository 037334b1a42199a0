"""Every exception django-tasks-plus raises, under one base.

``retryable`` says whether trying the same thing again can help: callers and the worker
use it to tell a transient condition (database unavailable) from a permanent one (bad
arguments). Errors about invalid tasks also derive from Django's own ``InvalidTask``, and
errors about values that cannot be stored from ``TypeError``, so code written against
``django.tasks`` keeps catching them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.core.exceptions import ImproperlyConfigured

from .compat import InvalidTask


class TasksPlusError(Exception):
    """Base class of every error raised by django-tasks-plus."""

    retryable: bool = False


class InvalidBackendOptions(TasksPlusError, ImproperlyConfigured):
    """The TASKS setting (QUEUES or OPTIONS) has an unknown key or a bad value."""


class InvalidTaskOptions(TasksPlusError, InvalidTask):
    """A task definition or a ``using()`` override has a bad option."""


class TimeOutOfRange(InvalidTaskOptions, ValueError):
    """A time or a duration given to the queue lies further ahead than its horizon.

    One bound (``timebounds.HORIZON``, ten years) applies to every time that comes from
    user code, checked where the value is created: ``run_after`` at enqueue, a
    ``TaskDeferred``, a middleware's ``Hold``, a retry policy's delay, a breaker's
    durations, a ``dedup_ttl``, a ``timeout``. ``field`` names what was refused and
    ``value`` is the value as given. Also a ``ValueError``: it is a bad argument.
    """

    def __init__(self, message: str, *, field: str, value: object) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class InvalidTaskArguments(TasksPlusError, InvalidTask, TypeError):
    """The arguments cannot be stored (not JSON-serializable) or do not fit the task.

    Also a ``TypeError``: that is what Django's own backends raise for such arguments, so
    code written to Django's contract (``except TypeError``) catches it too.

    ``field_path`` locates the bad value as data: ``('args', 1, 'when')`` for a value the
    codec refused, ``('user', 'age')`` (relative to the payload) for a schema error, and
    ``()`` when the call as a whole is wrong (arity).
    """

    def __init__(self, message: str, *, field_path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.field_path = field_path


class PayloadTooLarge(TasksPlusError, InvalidTask):
    """The encoded arguments exceed ``OPTIONS["MAX_PAYLOAD_BYTES"]``; nothing was written."""

    def __init__(self, message: str, *, limit: int, size: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.size = size


class EnqueueRefused(TasksPlusError):
    """An enqueue middleware refused the call (``envelope.py``); nothing was written.

    ``reason`` says why, for the caller; raise it from a middleware instead of calling
    ``call_next``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class QueueFull(TasksPlusError):
    """The queue already holds its ``max_depth`` of READY tasks; nothing was written.

    Retryable: the queue drains as workers run its tasks.
    """

    retryable = True

    def __init__(self, message: str, *, queue_name: str, limit: int, depth: int) -> None:
        super().__init__(message)
        self.queue_name = queue_name
        self.limit = limit
        self.depth = depth


class InvalidRetryPolicy(TasksPlusError, InvalidTask):
    """A retry policy is not callable or returned something that is not a delay."""


class TaskNotRegistered(TasksPlusError):
    """A stored row names a path that does not resolve to a task object.

    Only ``Task`` objects are ever executed: a path naming a plain function, a module or
    anything else is refused, so a forged row cannot run arbitrary code.
    """


class CorruptTaskRecord(TasksPlusError):
    """A stored task row holds data that cannot be decoded; the row is left as it was.

    Rows are only ever written by this library, so this means an edit by hand, a bad
    restore or a bug: ``task_id`` and ``column`` say where to look.
    """

    def __init__(self, message: str, *, task_id: str, column: str) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.column = column


class UnsupportedDatabase(TasksPlusError):
    """The configured database vendor (or its version) cannot run the queue."""


class DatabaseUnavailable(TasksPlusError):
    """The task database could not be reached; trying again later may succeed."""

    retryable = True


class TaskRowLocked(TasksPlusError):
    """An operator's change to a task (cancel, redrive, run now, discard, delete) met
    the task's row locked by another database session for longer than it may wait: a
    transaction still open in task code, a script or a ``psql`` session. Nothing was
    changed; try again once that transaction ends. Attributes: ``task_id``, ``waited``
    (seconds)."""

    retryable = True

    def __init__(self, message: str, *, task_id: str, waited: float) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.waited = waited


class DedupKeyLocked(TasksPlusError):
    """An enqueue with a dedup key met another transaction taking the same key and not
    yet committed (another enqueue, or a take-over of a lapsed key, inside a transaction
    still open) for longer than it may wait: whether that transaction keeps the key is
    not known until it ends. Nothing was enqueued; try again once it ends. Attributes:
    ``key``, ``waited`` (seconds)."""

    retryable = True

    def __init__(self, message: str, *, key: str, waited: float) -> None:
        super().__init__(message)
        self.key = key
        self.waited = waited


class CircuitLocked(TasksPlusError):
    """Forcing a circuit open or closed met its row locked by another database session
    for longer than it may wait (a transaction still open elsewhere). Nothing was
    changed; try again once that transaction ends. Attributes: ``name``, ``key``,
    ``waited`` (seconds)."""

    retryable = True

    def __init__(self, message: str, *, name: str, key: str, waited: float) -> None:
        super().__init__(message)
        self.name = name
        self.key = key
        self.waited = waited


class LeaseExpired(TasksPlusError):
    """Recorded as the error of an attempt whose worker stopped renewing its lease."""

    retryable = True


class TaskTimeout(TasksPlusError):
    """Raised inside a task that ran longer than its ``timeout``."""

    retryable = True


class ReturnValueNotSerializable(TasksPlusError, TypeError):
    """The task returned a value that cannot be stored as JSON.

    Also a ``TypeError``, the error Django's own backends record for such a value.
    """


class TaskDeferred(TasksPlusError):
    """Raise from a task to run it again later without spending an attempt.

    Give either ``delay`` (a ``timedelta`` or seconds) or ``run_after`` (an aware datetime),
    at most ``timebounds.HORIZON`` ahead (``TimeOutOfRange`` otherwise).
    """

    retryable = True

    def __init__(
        self,
        message: str = "",
        *,
        delay: timedelta | float | None = None,
        run_after: datetime | None = None,
    ) -> None:
        # Imported here: timebounds raises the errors this module defines.
        from .timebounds import as_delay, not_beyond_horizon

        if (delay is None) == (run_after is None):
            raise TypeError("TaskDeferred needs exactly one of delay= or run_after=.")
        if delay is not None:
            delay = as_delay(delay, "TaskDeferred delay")
            if delay < timedelta(0):
                raise ValueError(f"TaskDeferred delay must not be negative, got {delay}.")
        if run_after is not None:
            if not isinstance(run_after, datetime) or run_after.tzinfo is None:
                raise ValueError("TaskDeferred run_after must be an aware datetime.")
            run_after = not_beyond_horizon(run_after, "TaskDeferred run_after", now=_now())
        super().__init__(message or "task deferred")
        self.delay = delay
        self.run_after = run_after


def _now() -> datetime:
    # The host's clock: the worker checks the time again by the database's when it
    # writes the deferral (``lifecycle.deferred_until``).
    return datetime.now(UTC)


class TransactionLeaked(TasksPlusError):
    """Recorded as the error of an attempt that left a database transaction open.

    The worker rolled the transaction back (so the writes made inside it are lost) and
    discarded the connection, so the next task on that thread starts clean.
    """


class OutcomeNotStorable(TasksPlusError):
    """Recorded when an attempt's outcome (its error text, say) could not be written as it
    was: the task is dead-lettered with this error instead, and nothing else is lost."""


class Cancelled(TasksPlusError):
    """Recorded as the error of a cancelled task; raise it from a task to stop on request."""


class Abort(TasksPlusError):
    """Raise from a task to dead-letter it now, whatever its retry policy says."""


class BreakerHeldTooLong(Abort):
    """Recorded as the error of a task its circuit breaker held past ``held_ttl``: the
    remote host did not recover in time, so the task is dead-lettered (redrive it once the
    host is back)."""


class CircuitNotFound(TasksPlusError, LookupError):
    """``force_close()`` named a circuit (breaker name and key) that is not stored: closing
    it would change nothing, and the circuit meant (under another name) would stay open.
    ``others`` lists the names the key has stored circuits under."""

    def __init__(self, message: str, *, name: str, key: str, others: tuple[str, ...]) -> None:
        super().__init__(message)
        self.name = name
        self.key = key
        self.others = others


class UnknownBreaker(TasksPlusError, LookupError):
    """``force_open()`` named a breaker nothing uses (no stored circuit, no waiting task,
    no ``Breaker`` in this process): a typo would open a circuit no task ever consults.
    Pass ``create=True`` to open it anyway. ``known`` lists the names in use."""

    def __init__(self, message: str, *, name: str, known: tuple[str, ...]) -> None:
        super().__init__(message)
        self.name = name
        self.known = known


__all__ = [
    "Abort",
    "BreakerHeldTooLong",
    "Cancelled",
    "CircuitNotFound",
    "CorruptTaskRecord",
    "DatabaseUnavailable",
    "InvalidBackendOptions",
    "InvalidRetryPolicy",
    "InvalidTaskArguments",
    "InvalidTaskOptions",
    "LeaseExpired",
    "OutcomeNotStorable",
    "PayloadTooLarge",
    "QueueFull",
    "ReturnValueNotSerializable",
    "TaskDeferred",
    "TaskNotRegistered",
    "TaskRowLocked",
    "TaskTimeout",
    "TasksPlusError",
    "TimeOutOfRange",
    "TransactionLeaked",
    "UnknownBreaker",
    "UnsupportedDatabase",
]
