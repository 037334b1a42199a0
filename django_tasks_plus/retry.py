"""Retry policies: pure functions of (attempt, elapsed, exception) -> delay or give up.

A policy is any callable ``policy(attempt, elapsed, exc) -> timedelta | None``:

* ``attempt`` is the number of the attempt that just failed (1 for the first run),
* ``elapsed`` is the time since the task was first enqueued,
* ``exc`` is the exception it raised.

Returning a ``timedelta`` schedules the next attempt that far in the future (at most
``timebounds.HORIZON``: a longer one raises ``TimeOutOfRange`` and dead-letters the task);
returning ``None`` dead-letters the task. No I/O happens here, so policies are tested without a
database and the worker can call them under any lock.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from .exceptions import InvalidRetryPolicy
from .timebounds import as_delay

RetryPolicy = Callable[[int, timedelta, BaseException], "timedelta | None"]


def _as_timedelta(name: str, value: timedelta | float) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidRetryPolicy(f"{name} must be a timedelta or seconds, got {value!r}.")
    delta = as_delay(value, name)  # TimeOutOfRange past the horizon
    if delta < timedelta(0):
        raise InvalidRetryPolicy(f"{name} must not be negative, got {delta}.")
    return delta


@dataclass(frozen=True)
class ExponentialBackoff:
    """Delay ``initial_delay * factor ** (attempt - 1)``, capped at ``max_delay``.

    With ``jitter`` the delay is drawn uniformly from [delay/2, delay], which keeps the
    order of magnitude while spreading a thundering herd of retries.
    """

    initial_delay: timedelta = timedelta(seconds=1)
    max_delay: timedelta = timedelta(hours=12)
    max_attempts: int = 10
    factor: float = 2.0
    jitter: bool = True
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "initial_delay", _as_timedelta("initial_delay", self.initial_delay)
        )
        object.__setattr__(self, "max_delay", _as_timedelta("max_delay", self.max_delay))
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise InvalidRetryPolicy(f"max_attempts must be an int, got {self.max_attempts!r}.")
        if self.max_attempts < 1:
            raise InvalidRetryPolicy(f"max_attempts must be at least 1, got {self.max_attempts}.")
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float):
            raise InvalidRetryPolicy(f"factor must be a number, got {self.factor!r}.")
        if self.factor < 1:
            raise InvalidRetryPolicy(f"factor must be at least 1, got {self.factor}.")
        if self.max_delay < self.initial_delay:
            raise InvalidRetryPolicy(
                f"max_delay ({self.max_delay}) must not be shorter than "
                f"initial_delay ({self.initial_delay})."
            )

    def base_delay(self, attempt: int) -> timedelta:
        """The un-jittered delay after the given failed attempt."""
        cap = self.max_delay.total_seconds()
        try:
            seconds = self.initial_delay.total_seconds() * self.factor ** (attempt - 1)
        except OverflowError:
            seconds = cap
        return timedelta(seconds=min(seconds, cap))

    def __call__(self, attempt: int, elapsed: timedelta, exc: BaseException) -> timedelta | None:
        if attempt >= self.max_attempts:
            return None
        delay = self.base_delay(attempt)
        if self.jitter:
            delay = delay * self.rng.uniform(0.5, 1.0)
        return delay


def exponential_backoff(
    *,
    initial_delay: timedelta | float = timedelta(seconds=1),
    max_delay: timedelta | float = timedelta(hours=12),
    max_attempts: int = 10,
    factor: float = 2.0,
    jitter: bool = True,
) -> ExponentialBackoff:
    """The default policy: 1 s, 2 s, 4 s … up to 12 h between attempts, 10 attempts."""
    return ExponentialBackoff(
        initial_delay=initial_delay,  # type: ignore[arg-type]
        max_delay=max_delay,  # type: ignore[arg-type]
        max_attempts=max_attempts,
        factor=factor,
        jitter=jitter,
    )


def no_retry(attempt: int, elapsed: timedelta, exc: BaseException) -> None:
    """The policy used when retries are turned off (``RETRY: None``)."""
    return None


def validate_policy(policy: object, where: str) -> RetryPolicy:
    """Return ``policy`` if it can be a retry policy, else raise naming ``where``.

    Catches the easy mistake of naming the factory (``exponential_backoff``) instead of
    a policy (``exponential_backoff()``) before it dead-letters tasks at run time.
    """
    expected = "a callable policy (attempt, elapsed, exc) -> timedelta | None"
    if not callable(policy):
        raise InvalidRetryPolicy(
            f"{where} must be {expected}, such as exponential_backoff(), got {policy!r}."
        )
    try:
        inspect.signature(policy).bind(1, timedelta(0), Exception())
    except TypeError as exc:
        raise InvalidRetryPolicy(
            f"{where} must be {expected}, but {policy!r} cannot be called that way ({exc}). "
            "Did you mean to call a factory, e.g. exponential_backoff()?"
        ) from exc
    except ValueError:  # no introspectable signature (some builtins): trust it
        pass
    return policy


def next_delay(
    policy: RetryPolicy, attempt: int, elapsed: timedelta, exc: BaseException
) -> timedelta | None:
    """Ask the policy, and refuse answers that cannot be a delay."""
    delay = policy(attempt, elapsed, exc)
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, timedelta | int | float):
        raise InvalidRetryPolicy(
            f"retry policy {policy!r} returned {delay!r}; expected a timedelta or None."
        )
    delay = as_delay(delay, f"the delay returned by retry policy {policy!r}")
    if delay < timedelta(0):
        raise InvalidRetryPolicy(f"retry policy {policy!r} returned a negative delay ({delay}).")
    return delay
