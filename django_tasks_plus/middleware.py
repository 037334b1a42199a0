"""Execution middleware: an ordered chain of callables around each attempt of a task.

The contract, Django style: a middleware is a *factory* that takes the next callable in
the chain and returns the callable that handles an attempt::

    def timing(call_next):
        def middleware(attempt):
            began = time.monotonic()
            try:
                return call_next(attempt)
            finally:
                statsd.timing(attempt.task_path, time.monotonic() - began)
        return middleware

``attempt`` is an ``Attempt``: the claimed task's id, the ``Task``, its path, queue,
priority, attempt number, the decoded arguments, its metadata and the running
``TaskResult``. A middleware may

* wrap the call (timing, tracing, connection hygiene): what ``call_next`` returns is the
  attempt's value; what it raises (task code, ``TaskTimeout``, a later middleware)
  propagates through every middleware outside it, so a tracer can record it;
* change the arguments: ``call_next(dataclasses.replace(attempt, kwargs={...}))``;
* short-circuit: return a ``Hold`` instead of calling ``call_next``. The task is not run
  and goes back to READY at ``Hold.until`` without spending an attempt;
* fail the attempt: an exception a middleware raises is the attempt's error, exactly as
  if the task had raised it (the task's retry policy applies; ``TaskDeferred`` and
  ``Abort`` keep their meaning).

Order: ``OPTIONS["MIDDLEWARE"]`` (outermost first), then the task's own
``@task(middleware=[...])``, then the task function. Factories are called once per
(backend, task), the first time a worker process runs that task, never per attempt; a
task without any middleware is called directly, at no cost. Middlewares are synchronous
(an ``async`` task is run to completion by the innermost call), and the task's
``timeout`` covers the task function alone, not the middlewares around it.

This module is pure: the worker (``worker/execution.py``) builds and calls the chain and
turns a ``Hold`` into the ``lifecycle.Postponed`` claim end.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from .timebounds import as_delay, not_beyond_horizon

if TYPE_CHECKING:
    from . import compat

Handler = Callable[["Attempt"], Any]
Middleware = Callable[[Handler], Handler]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a claimed task, as the middleware chain sees it.

    Replace ``args``/``kwargs`` with ``dataclasses.replace()`` to call the task with other
    arguments; the other fields describe the attempt and changing them changes nothing.
    """

    id: str
    task: compat.Task
    task_path: str
    queue_name: str
    priority: int
    number: int  # 1 on the first attempt; a Hold does not count one
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    result: compat.TaskResult  # RUNNING; what TaskContext.task_result shows the task
    backend: str
    held_since: datetime | None = None  # when a Hold first kept it back; None: never held
    breaker_key: str | None = None  # "name/key" of its circuit breaker (``circuits.py``)
    # The task's metadata (``metadata.py``), decoded and read-only; TaskContext shows it too.
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Hold:
    """Returned by a middleware instead of calling ``call_next``: do not run the task now.

    The task goes back to READY, due at ``until`` (or ``delay`` from now, on the
    database's clock), its attempt count unchanged, and the worker logs ``reason``. The
    coming circuit breaker and rate limiter answer with a ``Hold`` while they refuse.
    Either lies at most ``timebounds.HORIZON`` ahead (``TimeOutOfRange`` otherwise).
    """

    until: datetime | None = None
    delay: timedelta | None = None
    reason: str = ""

    def __init__(
        self,
        until: datetime | None = None,
        *,
        delay: timedelta | float | None = None,
        reason: str = "",
    ) -> None:
        if (until is None) == (delay is None):
            raise TypeError("Hold needs exactly one of until= or delay=.")
        if until is not None:
            if not isinstance(until, datetime) or until.tzinfo is None:
                raise ValueError(f"Hold until must be an aware datetime, got {until!r}.")
            until = not_beyond_horizon(until, "Hold until", now=datetime.now(UTC))
        if delay is not None:
            if isinstance(delay, bool) or not isinstance(delay, timedelta | int | float):
                raise TypeError(f"Hold delay must be a timedelta or seconds, got {delay!r}.")
            delay = as_delay(delay, "Hold delay")
            if delay < timedelta(0):
                raise ValueError(f"Hold delay must not be negative, got {delay}.")
        if not isinstance(reason, str):
            raise TypeError(f"Hold reason must be a string, got {reason!r}.")
        # A plain str: the worker's log and events format it on their own threads.
        reason = str.__str__(reason)
        object.__setattr__(self, "until", until)
        object.__setattr__(self, "delay", delay)
        object.__setattr__(self, "reason", reason)


def build_chain(
    middlewares: Sequence[Middleware], innermost: Handler, *, handles: str = "the attempt"
) -> Handler:
    """Wrap ``innermost`` in ``middlewares``, the first one outermost.

    Raises ``TypeError`` naming the factory that did not return a callable. ``handles``
    names what a handler takes (enqueue middleware handles the envelope: ``envelope.py``).
    """
    handler = innermost
    for factory in reversed(middlewares):
        wrapped = factory(handler)
        if not callable(wrapped):
            raise TypeError(
                f"middleware {_name(factory)} returned {wrapped!r}, not a callable: a "
                f"middleware takes call_next and returns a function of {handles}."
            )
        handler = wrapped
    return handler


def load_middleware(
    entries: Any, where: str, *, handles: str = "the attempt"
) -> tuple[Middleware, ...]:
    """Resolve a MIDDLEWARE list (dotted paths or factories) into factories.

    Raises ``ValueError`` whose message starts with ``where`` and names the bad entry;
    callers turn it into their own error class. Results are cached, since a task's
    options are validated again at every enqueue.
    """
    if isinstance(entries, str) or not isinstance(entries, list | tuple):
        raise ValueError(
            f"{where} must be a list of middleware factories or their dotted paths, "
            f"got {entries!r}."
        )
    try:
        return _load(tuple(entries), where, handles)
    except TypeError:  # an unhashable entry: not cacheable, and not a factory either
        return _load.__wrapped__(tuple(entries), where, handles)


@lru_cache(maxsize=256)
def _load(entries: tuple[Any, ...], where: str, handles: str) -> tuple[Middleware, ...]:
    return tuple(
        _load_one(entry, f"{where}[{index}]", handles) for index, entry in enumerate(entries)
    )


def _load_one(entry: Any, where: str, handles: str) -> Middleware:
    factory = entry
    if isinstance(entry, str):
        try:
            factory = import_string(entry)
        except ImportError as exc:
            raise ValueError(f"{where} names {entry!r}, which cannot be imported: {exc}") from exc
    if not callable(factory):
        raise ValueError(
            f"{where} is {factory!r}, not a callable; a middleware is a factory that takes "
            f"call_next and returns a function of {handles}."
        )
    if any(factory is builder for builder in _BUILDERS):
        raise ValueError(
            f"{where} is {_name(factory)}, which builds a middleware from its own settings: "
            f"list what it returns, e.g. {factory.__name__}(2.0)."
        )
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have none; trust them
        return factory
    try:
        signature.bind(None)
    except TypeError:
        raise ValueError(
            f"{where} ({_name(factory)}{signature}) cannot be called with one argument: a "
            "middleware is a factory that takes call_next (the next callable in the chain)."
        ) from None
    return factory


def _name(factory: Any) -> str:
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or repr(factory)
    return f"{module}.{name}" if module else name


# -- built-in middlewares ------------------------------------------------------------------

slow_logger = logging.getLogger("django_tasks_plus.middleware")


def log_slow_attempts(threshold_seconds: float = 1.0) -> Middleware:
    """A middleware that logs a warning for each attempt slower than ``threshold_seconds``,
    with how it ended (returned, held, or the exception it raised).

    Put the factory it returns in ``MIDDLEWARE``: ``log_slow_attempts(2.0)`` directly, or
    a dotted path to a module-level ``slow = log_slow_attempts(2.0)``.
    """
    if callable(threshold_seconds):
        raise TypeError(
            "log_slow_attempts(threshold_seconds) builds a middleware: configure "
            "log_slow_attempts(2.0), not log_slow_attempts itself."
        )
    if (
        isinstance(threshold_seconds, bool)
        or not isinstance(threshold_seconds, int | float)
        or threshold_seconds < 0
    ):
        raise ValueError(
            f"log_slow_attempts threshold must be a number of seconds >= 0, "
            f"got {threshold_seconds!r}."
        )
    threshold = float(threshold_seconds)

    def factory(call_next: Handler) -> Handler:
        def middleware(attempt: Attempt) -> Any:
            began = time.monotonic()
            ending = "raised"
            try:
                value = call_next(attempt)
                ending = "was held" if isinstance(value, Hold) else "returned"
                return value
            except BaseException as exc:
                ending = f"raised {type(exc).__name__}"
                raise
            finally:
                seconds = time.monotonic() - began
                if seconds >= threshold:
                    slow_logger.warning(
                        "Task %s (%s) attempt %d %s after %.3f s (slow: over %.3f s)",
                        attempt.id,
                        attempt.task_path,
                        attempt.number,
                        ending,
                        seconds,
                        threshold,
                    )

        return middleware

    factory.__qualname__ = f"log_slow_attempts({threshold_seconds!r})"
    return factory


# Functions that take settings and return a middleware: listing one uncalled is a mistake.
_BUILDERS: tuple[Callable[..., Middleware], ...] = (log_slow_attempts,)
