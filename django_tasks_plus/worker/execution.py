"""Running one claimed task: resolve, call (through its middleware chain, if any), decide
the outcome, write it (fenced), signal.

Nothing a task does can crash the worker: every exception, including ``SystemExit`` and
``KeyboardInterrupt`` raised by task code, becomes the attempt's outcome, and formatting
it never raises (``lifecycle.describe``). A row that cannot run at all (unknown path,
corrupt arguments) is dead-lettered with the reason. After every attempt the thread's
connections are cleaned (``hygiene``): a transaction the task left open is rolled back,
and the attempt fails with ``TransactionLeaked`` rather than report a lost success. Before
the task's code and before each ``task_finished`` send, a connection the server hung up
on is replaced, so neither runs on a connection already known to be dead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import lru_cache, partial
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.db import DatabaseError

from .. import compat, events
from ..binding import bind_payload, payload_to_call
from ..codec import DecodeError, EncodeError, decode_call, to_json
from ..context import TaskContext
from ..db.store import cancel_requested
from ..definition import compiled_schema, resolve_task, task_middleware
from ..exceptions import (
    Abort,
    Cancelled,
    InvalidTaskArguments,
    InvalidTaskOptions,
    ReturnValueNotSerializable,
    TaskDeferred,
    TaskNotRegistered,
    TaskTimeout,
    TimeOutOfRange,
    TransactionLeaked,
)
from ..finished import send_task_finished
from ..lifecycle import (
    Aborted,
    ClaimedTask,
    ClaimEnd,
    Deferred,
    Failed,
    Postponed,
    Succeeded,
    Transition,
    deferred_until,
    describe,
    exception_path,
    format_traceback,
)
from ..metadata import EMPTY as EMPTY_METADATA
from ..metadata import decode_metadata
from ..middleware import Attempt, Handler, Hold, build_chain, load_middleware
from ..results import result_from_claim, stored_return_value, task_errors
from ..stored import CorruptJson
from .hygiene import clean_up_after_attempt, replace_lost_connections, return_pooled_sessions
from .outcome import outcome_for
from .tally import OutcomeTally
from .tasklog import describe_outcome
from .timeouts import AttemptTimer, interrupted

if TYPE_CHECKING:
    from ..backend import DatabaseBackend
    from .reporter import Reporter

logger = logging.getLogger("django_tasks_plus.worker")

Clock = Callable[[], datetime]
_UNBUILT: Any = object()  # a task's middleware chain not built yet in this process


@lru_cache(maxsize=256)
def _is_async_cached(func: Callable[..., Any]) -> bool:
    return iscoroutinefunction(func)


def _is_async(func: Callable[..., Any]) -> bool:
    """``iscoroutinefunction``, answered once per task function: it unwraps and inspects
    the function's code at every call (half a microsecond, paid per attempt)."""
    try:
        return _is_async_cached(func)
    except TypeError:  # an unhashable callable: asked every time
        return iscoroutinefunction(func)


def _call(
    task: compat.Task,
    result: compat.TaskResult,
    args: list[Any],
    kwargs: dict[str, Any],
    metadata: Mapping[str, Any] = EMPTY_METADATA,
) -> Any:
    if task.takes_context:
        args = [TaskContext(task_result=result, metadata=metadata), *args]
    timeout = getattr(task, "timeout", None)
    if _is_async(task.func):

        async def bounded() -> Any:
            try:
                return await asyncio.wait_for(task.func(*args, **kwargs), timeout)
            except TimeoutError as exc:
                raise TaskTimeout(f"attempt ran longer than {timeout} s") from exc

        return async_to_sync(bounded)()
    if timeout is None:  # no timer to arm: nothing to set up or tear down per attempt
        return task.func(*args, **kwargs)
    timer = AttemptTimer(timeout)
    try:
        with timer:
            return task.func(*args, **kwargs)
    except TaskTimeout as exc:
        if exc.args:
            raise
        # Raised asynchronously by the timer, which cannot pass a message.
        raise TaskTimeout(f"attempt ran longer than {timeout} s") from None
    finally:
        timer.stop()  # again: a raise that landed on entering __exit__ skipped its body


def _call_attempt(task: compat.Task, attempt: Attempt) -> Any:
    """The innermost link of a middleware chain: the task itself, with the attempt's
    (possibly replaced) arguments; the timeout covers this call only."""
    return _call(task, attempt.result, list(attempt.args), dict(attempt.kwargs), attempt.metadata)


def prepare_call(task: compat.Task, claimed: ClaimedTask) -> tuple[list[Any], dict[str, Any]]:
    """Decode the stored arguments and re-validate them against the task's schema.

    Raises ``DecodeError``, ``InvalidTaskArguments`` or ``InvalidTaskOptions``: a row that
    cannot be called as stored (corrupt, or enqueued by a deploy whose payload no longer
    validates) is dead-lettered with the reason instead of being run.
    """
    for name, value in (("args", claimed.args), ("kwargs", claimed.kwargs)):
        if isinstance(value, CorruptJson):
            raise DecodeError(name, f"cannot be read as JSON ({value.problem}).")
    args, kwargs = decode_call(claimed.args, claimed.kwargs)
    schema = compiled_schema(task)
    if schema is None:
        return args, kwargs
    payload = bind_payload(task.func, args, kwargs, takes_context=task.takes_context)
    try:
        validated = schema.validate(payload)
    except InvalidTaskArguments as exc:
        raise InvalidTaskArguments(f"payload no longer matches the task's schema: {exc}") from exc
    return [], payload_to_call(task.func, validated, takes_context=task.takes_context)


class TaskRunner:
    """Runs claimed tasks for one worker; safe to use from many threads at once."""

    def __init__(
        self,
        backend: DatabaseBackend,
        *,
        clock: Clock,
        reporter: Reporter,
        on_written: Callable[[ClaimedTask], None],
        schedule: Callable[[Callable[[], None]], object],
        log_each_task: bool = False,
        on_settle: Callable[[ClaimedTask], None] | None = None,
        tally: OutcomeTally | None = None,
    ) -> None:
        self.backend = backend
        self.tally = tally  # counts the outcomes that landed, for the worker's row
        self.database = backend.settings.database
        self.clock = clock
        self.log_each_task = log_each_task
        self.on_settle = on_settle
        self.reporter = reporter
        self.on_written = on_written
        self.schedule = schedule
        # task_finished sends of the batch being written; touched by the reporter only.
        self._announcements: list[Callable[[], None]] = []
        # Each task's middleware chain, built on its first attempt; None: no middleware.
        self._chains: dict[str, Handler | None] = {}
        reporter.after_batch = self.after_batch

    def run(self, claimed: ClaimedTask) -> None:
        """Run one claimed task on this thread and hand its outcome to the reporter.

        Returns as soon as the outcome is queued, so the thread is free for the next task
        while the outcome waits for its group commit; ``on_written(claimed)`` reports the end.
        """
        started = time.monotonic()
        try:
            self._run(claimed, started)  # cleans the connections up after the task's code
        except BaseException as exc:  # last line of defence: the worker thread must survive
            logger.exception("Task %s (%s): unexpected worker error", claimed.id, claimed.task_path)
            self._fail_unexpectedly(claimed, exc, started)
            # The next attempt on this thread starts clean.
            clean_up_after_attempt(interrupted=interrupted())
        finally:
            return_pooled_sessions()

    def _fail_unexpectedly(self, claimed: ClaimedTask, exc: BaseException, began: float) -> None:
        """Record the attempt as failed, by the task's own policy and ordering option,
        rather than wait for the reaper; a final outcome still sends ``task_finished``."""
        try:
            try:
                task: compat.Task | None = resolve_task(claimed.task_path)
            except TaskNotRegistered:
                task = None
            now = self.clock()
            outcome = outcome_for(
                self.backend, claimed, Failed(exc, format_traceback(exc)), task=task, now=now
            )
            announce = None
            if task is not None and outcome.is_final:
                result = result_from_claim(task, claimed, now)
                _update_result(result, outcome, now)
                announce = partial(self._announce, result, exc)
            self._hand_off(claimed, outcome, began, announce=announce)
        except BaseException:
            logger.exception(
                "Task %s: could not record the failure; its lease will expire.", claimed.id
            )
            self.on_written(claimed)

    def _cancel_requested(self, claimed: ClaimedTask) -> bool:
        """Whether a cancel was asked for; False when the database cannot say right now."""
        try:
            return cancel_requested(self.database, claimed.id)
        except DatabaseError as exc:
            logger.warning("Task %s: could not check for a cancel request (%s).", claimed.id, exc)
            clean_up_after_attempt()
            return False

    def _run(self, claimed: ClaimedTask, began: float) -> None:
        replace_lost_connections()  # for task_started's receivers and the task's code
        try:
            task = resolve_task(claimed.task_path)
        except TaskNotRegistered as exc:
            return self._settle_unrunnable(claimed, exc, None, began)
        try:
            args, kwargs = prepare_call(task, claimed)
            metadata = decode_metadata(claimed.metadata)
        except DecodeError as exc:
            corrupt = InvalidTaskArguments(f"stored arguments are corrupt: {exc}")
            return self._settle_unrunnable(claimed, corrupt, task, began)
        except (InvalidTaskArguments, InvalidTaskOptions) as exc:
            return self._settle_unrunnable(claimed, exc, task, began)

        started = self.clock()
        result = result_from_claim(task, claimed, started)
        events.emit_started(claimed, started)
        value, raised = self._call_task(claimed, task, result, args, kwargs, metadata)
        # Before anything else touches this thread's connections (the cancel check below).
        leaked = clean_up_after_attempt(interrupted=interrupted())
        event, exception = self._classify(claimed, value, raised, leaked)
        return self._settle(claimed, task, result, event, started, began, exception)

    def _call_task(
        self,
        claimed: ClaimedTask,
        task: compat.Task,
        result: compat.TaskResult,
        args: list[Any],
        kwargs: dict[str, Any],
        metadata: Mapping[str, Any],
    ) -> tuple[Any, BaseException | None]:
        """Send ``task_started`` and call the task through its middleware chain, if it has
        one: ``(value, None)`` or ``(None, raised)``; a middleware's ``Hold`` is a value."""
        try:
            compat.task_started.send(sender=type(self.backend), task_result=result)
            chain = self._chains.get(claimed.task_path, _UNBUILT)
            if chain is _UNBUILT:
                chain = self._build_chain(claimed.task_path, task)
            if chain is None:
                return _call(task, result, args, kwargs, metadata), None
            attempt = Attempt(
                id=claimed.id,
                task=result.task,
                task_path=claimed.task_path,
                queue_name=claimed.queue_name,
                priority=claimed.priority,
                number=claimed.attempt,
                args=tuple(args),
                kwargs=kwargs,
                result=result,
                backend=claimed.backend_name,
                held_since=claimed.held_since,
                breaker_key=claimed.breaker_key,
                metadata=metadata,
            )
            return chain(attempt), None
        except BaseException as exc:  # task code may raise anything, even SystemExit
            return None, exc

    def _build_chain(self, path: str, task: compat.Task) -> Handler | None:
        """The backend's middleware, then the task's own, around the task; cached per
        task. A factory that raises fails this attempt and is tried again on the next."""
        own = task_middleware(task)
        middlewares = self.backend.settings.middleware
        if own:
            try:
                middlewares += load_middleware(own, f"{path}: middleware")
            except ValueError as exc:
                raise InvalidTaskOptions(str(exc)) from exc
        chain = build_chain(middlewares, partial(_call_attempt, task)) if middlewares else None
        self._chains[path] = chain
        return chain

    def _classify(
        self, claimed: ClaimedTask, value: Any, raised: BaseException | None, leaked: list[str]
    ) -> tuple[ClaimEnd, BaseException | None]:
        """What the attempt amounts to, and the exception ``task_finished`` re-raises."""
        if leaked and (raised is None or isinstance(raised, TaskDeferred)):
            # Its writes inside the open transaction were rolled back: not a success.
            error: Exception = TransactionLeaked(
                f"{claimed.task_path} left a transaction open on database "
                f"{', '.join(map(repr, leaked))}; it was rolled back, so the writes made "
                "inside it are lost. Use transaction.atomic() as a 'with' block (or "
                "decorator) so that it is always closed."
            )
            return Failed(error, format_traceback(error)), error
        if leaked:
            logger.warning(
                "Task %s (%s) raised and left a transaction open on %s; it was rolled back.",
                claimed.id,
                claimed.task_path,
                ", ".join(leaked),
            )
        if raised is None:
            if isinstance(value, Hold):
                try:
                    return self._held(claimed, value), None
                except TimeOutOfRange as refused:
                    return _refused_time(claimed, refused)
            try:
                return Succeeded(to_json(value, "return value")), None
            except EncodeError as exc:
                error = ReturnValueNotSerializable(
                    f"{claimed.task_path} returned a value that cannot be stored: {exc}"
                )
                error.__cause__ = exc
                return Aborted(error, format_traceback(error)), error
        if isinstance(raised, TaskDeferred):
            try:
                when = deferred_until(self.clock(), raised.delay, raised.run_after)
            except TimeOutOfRange as refused:  # too far by the database's clock: a failure
                return _refused_time(claimed, refused)
            return Deferred(when), None
        if isinstance(raised, Abort | Cancelled):
            return Aborted(raised, format_traceback(raised)), raised
        if self._cancel_requested(claimed):
            # Cancelled while running: recorded as a cancellation, never retried.
            cancelled = Cancelled(
                f"cancelled while running; it then raised {exception_path(raised)}: "
                f"{describe(raised)}"
            )
            return Aborted(cancelled, format_traceback(raised), reason=str(cancelled)), raised
        return Failed(raised, format_traceback(raised)), raised

    def _held(self, claimed: ClaimedTask, hold: Hold) -> Postponed:
        """A middleware held the task back: READY again at ``until``, no attempt spent."""
        until = deferred_until(
            self.clock(), hold.delay, hold.until, source=("Hold delay", "Hold until")
        )
        logger.info(
            "Task %s (%s) held until %s without spending an attempt: %s",
            claimed.id,
            claimed.task_path,
            until.isoformat(),
            hold.reason or "no reason given",
        )
        return Postponed(until, reason=hold.reason)

    def _settle_unrunnable(
        self, claimed: ClaimedTask, exc: Exception, task: compat.Task | None, began: float
    ) -> None:
        """Dead-letter a row that cannot run; no signals, since the task never started."""
        clean_up_after_attempt()  # resolving and validating may have run module code
        event = Aborted(exc, format_traceback(exc), reason=describe(exc))
        outcome = outcome_for(self.backend, claimed, event, task=task, now=self.clock())
        logger.error("Task %s dead-lettered: %s", claimed.id, describe(exc))
        self._hand_off(claimed, outcome, began, announce=None)

    def _settle(
        self,
        claimed: ClaimedTask,
        task: compat.Task,
        result: compat.TaskResult,
        event: ClaimEnd,
        started: datetime,
        began: float,
        exception: BaseException | None = None,
    ) -> None:
        """Decide the outcome and hand it to the reporter.

        Once a final outcome is written, ``task_finished`` is sent on a worker thread; for
        a failure the exception is raised again around the send, so receivers see it in
        ``sys.exc_info()`` as Django documents, and the row already shows the outcome.
        """
        now = self.clock()
        outcome = outcome_for(self.backend, claimed, event, task=task, now=now, started=started)
        announce = None
        if outcome.is_final:
            _update_result(result, outcome, now)
            announce = partial(self._announce, result, exception)
        self._hand_off(claimed, outcome, began, announce=announce)

    def _hand_off(
        self,
        claimed: ClaimedTask,
        outcome: Transition,
        began: float,
        *,
        announce: Callable[[], None] | None,
    ) -> None:
        if self.on_settle is not None:
            # From here on the lease may end by our own write: not a lost lease.
            self.on_settle(claimed)
        seconds = time.monotonic() - began
        self.reporter.submit(
            claimed, outcome, partial(self._after_write, claimed, outcome, seconds, announce)
        )

    def _after_write(
        self,
        claimed: ClaimedTask,
        outcome: Transition,
        seconds: float,
        announce: Callable[[], None] | None,
        landed: bool,
    ) -> None:
        """Runs on the reporter thread: keep it short. Whatever happens, the lease is
        released (``on_written``), so one task's values cannot stall the worker."""
        try:
            status = outcome.status
            if landed:
                if self.tally is not None:
                    self.tally.add(outcome)
                if announce is not None:
                    self._announcements.append(announce)
                events.emit_outcome(claimed, outcome, seconds, self.clock)
            else:
                logger.warning(
                    "Task %s: lease lost (another worker owns it now) or the write was "
                    "refused; its outcome (%s) is discarded.",
                    claimed.id,
                    status,
                )
            # A landed hold was logged by _held already, when the middleware answered.
            if self.log_each_task and (outcome.held_because is None or not landed):
                logger.info(
                    "%s%s",
                    self._outcome_line(claimed, outcome, seconds),
                    "" if landed else " [result discarded: lease lost]",
                )
        finally:
            self.on_written(claimed)

    def _outcome_line(self, claimed: ClaimedTask, outcome: Transition, seconds: float) -> str:
        """The ``-v 1`` line; if a value in the outcome cannot be described, a plainer
        line that says so (the row itself is written either way)."""
        try:
            return describe_outcome(claimed, outcome, seconds, self.clock())
        except Exception as exc:
            logger.warning(
                "Task %s: its outcome could not be described for the log (%s: %s).",
                claimed.id,
                exception_path(exc),
                describe(exc),
            )
            head = f"Task {claimed.id} {claimed.task_path}"
            return f"{head} {outcome.status} (attempt {claimed.attempt})"

    def after_batch(self) -> None:
        """Reporter thread, after a batch: send its ``task_finished`` signals on a worker
        thread, one hand-off for the whole batch rather than one per task."""
        if not self._announcements:
            return
        announcements, self._announcements = self._announcements, []
        self.schedule(partial(_run_all, announcements))

    def _announce(self, result: compat.TaskResult, exception: BaseException | None) -> None:
        """Send ``task_finished``; re-raise a failure around it so receivers see it."""
        try:
            send_task_finished(type(self.backend), result, exception)
        except Exception:
            logger.exception("A task_finished receiver failed for task %s", result.id)


def _refused_time(claimed: ClaimedTask, refused: TimeOutOfRange) -> tuple[ClaimEnd, BaseException]:
    """A deferral or hold whose time is out of range by the worker's clock (the check
    when it was created uses the host's): that attempt fails with the typed error, and
    the task's retry policy decides, as for any failure."""
    logger.warning("Task %s (%s): %s", claimed.id, claimed.task_path, describe(refused))
    return Failed(refused, format_traceback(refused)), refused


def _run_all(jobs: list[Callable[[], None]]) -> None:
    """Send a batch's ``task_finished`` signals, one after the other on this thread.

    Before each send, a connection the server hung up on (a restart, a terminated
    session) or on which the previous send's query failed is checked and replaced, so no
    receiver runs on a connection already known to be dead, however long the batch; this
    costs no query unless there is such a sign. After each send, a transaction a receiver
    left open is rolled back, so it cannot swallow the writes of what runs next.
    """
    for job in jobs:
        try:
            replace_lost_connections()
        except Exception:
            logger.exception("Could not replace a lost database connection before task_finished")
        job()  # each one catches and logs its own failures
        try:
            leaked = clean_up_after_attempt()
        except Exception:
            logger.exception("Could not clean the database connection after task_finished")
            continue
        if leaked:
            logger.error(
                "A task_finished receiver left a transaction open on database %s; it was "
                "rolled back, so the writes made inside it are lost.",
                ", ".join(map(repr, leaked)),
            )
    return_pooled_sessions()


def _update_result(result: compat.TaskResult, outcome: Transition, now: datetime) -> None:
    """Give signal receivers the final state without another query."""
    object.__setattr__(result, "status", compat.TaskResultStatus(outcome.status))
    object.__setattr__(result, "finished_at", outcome.values.get("finished_at", now))
    if "return_value" in outcome.values:
        value = stored_return_value(outcome.values["return_value"], result.id)
        object.__setattr__(result, "_return_value", value)
    if outcome.error is not None:
        result.errors.extend(task_errors([outcome.error]))
