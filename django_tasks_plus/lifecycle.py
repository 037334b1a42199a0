"""What happens to a task row after an attempt: pure functions from event to new state.

The worker (after running a task), the reaper (after a lease ran out) and shutdown (for
claims never started) all describe what happened as an event; ``transition()`` turns it,
with the retry policy and the clock, into the columns to write. The write itself is
fenced by the lease token elsewhere (``db``), so this module stays free of I/O and is
tested on its own.
"""

from __future__ import annotations

import traceback as traceback_module
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from .compat import TaskResultStatus
from .exceptions import Cancelled, InvalidRetryPolicy, OutcomeNotStorable, TimeOutOfRange
from .retry import RetryPolicy, next_delay
from .timebounds import later, not_beyond_horizon


class ClaimedTask(NamedTuple):
    """A task row as a worker holds it while its lease lasts.

    A named tuple rather than a frozen dataclass: as immutable, and built in a quarter of
    the time (a frozen dataclass sets each of its twenty fields through
    ``object.__setattr__``), which a claim does thousands of times a second.
    """

    id: str
    task_path: str
    queue_name: str
    priority: int
    args: Any
    kwargs: Any
    attempt: int
    worker_ids: tuple[str, ...]
    errors: tuple[Mapping[str, Any], ...]
    enqueued_at: datetime
    run_after: datetime
    started_at: datetime | None
    lease_token: str
    backend_name: str = "default"
    ordering_key: str | None = None
    claimed_at: datetime | None = None  # the claim's clock; started_at equals it on a first run
    requested_run_after: datetime | None = None  # the caller's run_after, as Django shows it
    held_since: datetime | None = None  # when a middleware first held it back (a breaker)
    breaker_key: str | None = None  # "name/key" of the circuit breaker guarding it
    metadata: Any = None  # the parsed metadata column (``metadata.decode_metadata`` reads it)
    stored_size: int = 0  # characters of the stored args and kwargs (sizes prefetch)

    @property
    def first_run(self) -> bool:
        """Whether this claim set ``started_at`` (the task never started before)."""
        return self.claimed_at is not None and self.started_at == self.claimed_at

    @property
    def lease(self) -> Lease:
        return (self.id, self.lease_token)


Lease = tuple[str, str]
"""A held lease: (task id, lease token). A task can be claimed again after its lease was
lost, so the id alone does not name one attempt."""


# How a claim ended: what happened to one claimed task.
@dataclass(frozen=True)
class Succeeded:
    return_value: Any


@dataclass(frozen=True)
class Failed:
    """The attempt raised; the retry policy decides between retry and dead letter."""

    exception: BaseException
    traceback: str = ""


@dataclass(frozen=True)
class Aborted:
    """Dead-letter now (``Abort`` raised, unknown task, corrupt row, bad return value…)."""

    exception: BaseException
    traceback: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Deferred:
    """Run again at ``run_after`` without spending an attempt."""

    run_after: datetime


@dataclass(frozen=True)
class Postponed(Deferred):
    """A middleware answered ``Hold`` (``middleware.py``): the task did not run. Back to
    READY at ``run_after`` as if never claimed; ``reason`` says why (breaker open…)."""

    reason: str = ""


@dataclass(frozen=True)
class Released:
    """Claimed but never started (graceful stop): back to READY as if never claimed."""


ClaimEnd = Succeeded | Failed | Aborted | Deferred | Released
"""How one claim of a task ended (not an ``events.Event``, which is what observers hear)."""


@dataclass(frozen=True)
class Transition:
    """The new column values for one task row, and whether the task is now final."""

    status: str
    values: dict[str, Any] = field(default_factory=dict)
    error: Mapping[str, Any] | None = None
    # Set when a middleware held the task (never written: for logs and events).
    held_because: str | None = None

    @property
    def is_final(self) -> bool:
        return self.status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)


def exception_path(exc: BaseException) -> str:
    kind = type(exc)
    try:
        return storable_text(f"{kind.__module__}.{kind.__qualname__}")
    except Exception:  # a hostile metaclass; the path is only a label
        return "<unknown exception class>"


def describe(exc: BaseException) -> str:
    """``str(exc)``, never raising: task code may raise exceptions whose ``__str__`` fails,
    and formatting one must not change what happens to the task."""
    try:
        return storable_text(str(exc))
    except Exception as problem:
        return f"<{exception_path(exc)} object; str() raised {type(problem).__name__}>"


def storable_text(text: str) -> str:
    """``text`` as every supported database can store it: NUL (which PostgreSQL refuses)
    and lone surrogates (which UTF-8 cannot encode) are shown escaped instead."""
    text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def format_traceback(exc: BaseException) -> str:
    try:
        return storable_text("".join(traceback_module.format_exception(exc)))
    except Exception:  # the traceback module already guards __str__; this is for the rest
        return f"{exception_path(exc)}: {describe(exc)} (no traceback could be formatted)"


def error_record(
    exc: BaseException,
    traceback: str,
    *,
    attempt: int,
    worker_id: str | None,
    at: datetime,
    started_at: datetime | None = None,
) -> dict[str, Any]:
    """The JSON kept per failed attempt; the first two keys are Django's ``TaskError``.

    ``started_at``: when the attempt's code began, if it did (the admin shows each
    attempt's start and duration from it and ``at``)."""
    text = traceback or format_traceback(exc)
    record = {
        "exception_class_path": exception_path(exc),
        "traceback": storable_text(text),
        "attempt": attempt,
        "worker_id": worker_id,
        "at": at.isoformat(),
    }
    if started_at is not None:
        record["started_at"] = started_at.isoformat()
    return record


def _without_last_attempt(task: ClaimedTask) -> dict[str, Any]:
    """Undo the claim's bookkeeping, for attempts that should not count."""
    return {"attempt": max(0, task.attempt - 1), "worker_ids": list(task.worker_ids[:-1])}


def _dead(
    task: ClaimedTask, error: dict[str, Any], reason: str, now: datetime, *, block: bool
) -> Transition:
    values = {
        "errors": [*task.errors, error],
        "finished_at": now,
        "dead_letter_reason": storable_text(reason[:2000]),
    }
    if block and task.ordering_key is not None:
        values["ordering_blocked"] = True
    return Transition(TaskResultStatus.FAILED, values, error)


def transition(
    task: ClaimedTask,
    event: ClaimEnd,
    *,
    policy: RetryPolicy,
    now: datetime,
    block_ordering: bool = False,
    started: datetime | None = None,
) -> Transition:
    """Decide the row's next state after ``event``; never raises for a bad policy.

    ``block_ordering``: the task's ``ordering_failure`` is ``"block"``, so a dead-lettered
    task keeps its ordering key blocked. Cancelled tasks never block their key.
    ``started``: when the attempt really began (a claimed task may wait in the worker's
    prefetch buffer first); recorded as ``last_attempted_at`` (and ``started_at`` on the
    first run) so the timeline shows execution, not claiming.
    """
    outcome = _decide(
        task, event, policy=policy, now=now, block_ordering=block_ordering, started=started
    )
    if isinstance(event, Postponed):
        # Kept across holds: how long a task has waited is measured from the first one.
        outcome.values["held_since"] = task.held_since or now
    elif task.held_since is not None and not isinstance(event, Released):
        outcome.values["held_since"] = None  # it ran: the next hold starts a new wait
    if started is not None and not isinstance(event, Released | Postponed):
        outcome.values["last_attempted_at"] = started
        if task.first_run:
            outcome.values["started_at"] = started
    return outcome


def _decide(
    task: ClaimedTask,
    event: ClaimEnd,
    *,
    policy: RetryPolicy,
    now: datetime,
    block_ordering: bool,
    started: datetime | None = None,
) -> Transition:
    worker_id = task.worker_ids[-1] if task.worker_ids else None
    if isinstance(event, Succeeded):
        return Transition(
            TaskResultStatus.SUCCESSFUL, {"return_value": event.return_value, "finished_at": now}
        )
    if isinstance(event, Released | Postponed):
        values = _without_last_attempt(task)
        if values["attempt"] == 0:  # never ran at all: it has not started either
            values.update(started_at=None, last_attempted_at=None)
        if isinstance(event, Postponed):
            values["run_after"] = event.run_after
            return Transition(TaskResultStatus.READY, values, held_because=event.reason)
        return Transition(TaskResultStatus.READY, values)
    if isinstance(event, Deferred):
        return Transition(
            TaskResultStatus.READY, {**_without_last_attempt(task), "run_after": event.run_after}
        )
    if isinstance(event, Aborted):
        error = error_record(
            event.exception,
            event.traceback,
            attempt=task.attempt,
            worker_id=worker_id,
            at=now,
            started_at=started,
        )
        reason = event.reason or f"{exception_path(event.exception)}: {describe(event.exception)}"
        blocks = block_ordering and not isinstance(event.exception, Cancelled)
        return _dead(task, error, reason, now, block=blocks)

    error = error_record(
        event.exception,
        event.traceback,
        attempt=task.attempt,
        worker_id=worker_id,
        at=now,
        started_at=started,
    )
    try:
        delay = next_delay(policy, task.attempt, now - task.enqueued_at, event.exception)
    except (InvalidRetryPolicy, TimeOutOfRange) as exc:
        return _dead(
            task, error, f"retry policy failed: {describe(exc)}", now, block=block_ordering
        )
    except Exception as exc:  # a user policy that crashes must not lose the task
        reason = f"retry policy raised {exception_path(exc)}: {describe(exc)}"
        return _dead(task, error, reason, now, block=block_ordering)
    if delay is None:
        reason = (
            f"gave up after {task.attempt} attempt(s); last error "
            f"{exception_path(event.exception)}: {describe(event.exception)}"
        )
        return _dead(task, error, reason, now, block=block_ordering)
    return Transition(
        TaskResultStatus.READY,
        {"errors": [*task.errors, error], "run_after": now + delay},
        error,
    )


def unstorable_outcome(
    task: ClaimedTask, intended: Transition, problem: BaseException, *, now: datetime
) -> Transition:
    """Dead-letter ``task`` because ``intended`` could not be written (the database
    refused a value in it): the task's fate is recorded, with the reason, instead of its
    lease running out and the task running again only to fail the same way."""
    exc = OutcomeNotStorable(
        f"the attempt's outcome ({intended.status}) could not be stored: "
        f"{exception_path(problem)}: {describe(problem)}"
    )
    worker_id = task.worker_ids[-1] if task.worker_ids else None
    error = error_record(exc, "", attempt=task.attempt, worker_id=worker_id, at=now)
    blocked = bool(intended.values.get("ordering_blocked", False))
    return _dead(task, error, describe(exc), now, block=blocked)


def deferred_until(
    now: datetime,
    delay: timedelta | None,
    run_after: datetime | None,
    *,
    source: tuple[str, str] = ("TaskDeferred delay", "TaskDeferred run_after"),
) -> datetime:
    """When a ``TaskDeferred`` (or a ``Hold``) asks to run again, by the worker's clock.

    Both check their time when created (by the host's clock); this checks it again by
    ``now``, so whatever reaches the row is within ``timebounds.HORIZON``. Raises
    ``TimeOutOfRange`` otherwise, naming the delay's or the time's field in ``source``:
    the caller fails that attempt.
    """
    delay_field, run_after_field = source
    if run_after is not None:
        return not_beyond_horizon(run_after, run_after_field, now=now)
    return later(now, delay or timedelta(0), delay_field)
