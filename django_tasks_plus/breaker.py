"""Circuit breakers: the definition users declare and the state machine, as pure functions.

A breaker guards a remote dependency (a host) shared by many tasks. Its *circuit* for one
key is

* **closed**: tasks run; failures are remembered (pruned to the failure window) and a
  success forgets them. When the failures trip the policy, the circuit **opens**;
* **open**: tasks are held (not run, no attempt spent) until ``recovery_delay`` after the
  circuit opened; the first task claimed after that becomes the **probe** and the
  circuit is **half-open**;
* **half-open**: only the probe runs; other tasks are held (parked) until the probe
  would be stale. The probe's success closes the circuit and releases them, its
  failure opens it again; a probe that has not reported within ``recovery_delay`` (its
  worker died) is stale, and the next task claimed becomes the probe instead.

A task held past ``held_ttl`` is dropped (dead-lettered) while the circuit is not closed.

Nothing here does I/O or reads a clock: the worker-side middleware (``circuits.py``) reads
and locks the stored circuit, asks these functions what to do, and writes the result.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from .exceptions import Abort, Cancelled, InvalidTaskOptions, TaskDeferred
from .limits import BREAKER_NAME_MAX_LENGTH, KEY_MAX_LENGTH
from .timebounds import HORIZON, as_delay

DEFAULT_FAILURE_THRESHOLD = 5
DEFAULT_FAILURE_WINDOW = timedelta(minutes=5)
DEFAULT_RECOVERY_DELAY = timedelta(minutes=30)
DEFAULT_HELD_TTL = timedelta(days=7)
DEFAULT_RELEASE_INTERVAL = timedelta(seconds=1)
# With a failure predicate there is no window: it sees the failures of the last hour, at
# most this many, so a stored circuit stays small whatever the predicate wants.
PREDICATE_RETENTION = timedelta(hours=1)
MAX_REMEMBERED_FAILURES = 1000
# The longest duration: the bound on every time from user code (``timebounds``). One
# near ``timedelta.max`` would also overflow the datetime arithmetic of ``decide``/``prune``.
MAX_DURATION = HORIZON
# Exceptions that say nothing about the remote host: the task decided (Abort), asked to
# run later (TaskDeferred) or stopped on request (Cancelled). Not failures by default.
NEVER_FAILURES: tuple[type[BaseException], ...] = (Abort, TaskDeferred, Cancelled)


# The Breakers created in this process (at import of the task modules), by name, with
# the recovery delay of the last one of each name: an operator opening a circuit by hand
# is warned about a name no task of theirs uses, and the pages say when a probe is due.
_DECLARED: dict[str, timedelta] = {}


def declared_names() -> frozenset[str]:
    """The names of every ``Breaker`` created in this process so far."""
    return frozenset(_DECLARED)


def declared_recovery(name: str) -> timedelta | None:
    """The recovery delay of the breaker named ``name`` created in this process (the
    last one, if several share the name); None if none was."""
    return _DECLARED.get(name)


class State(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


KeyFunction = Callable[..., "str | None"]
FailurePredicate = Callable[[Sequence[datetime]], bool]
StateChangeHook = Callable[[str, State, State], object]
DropHook = Callable[[str, "DroppedTask"], object]


@dataclass(frozen=True, slots=True)
class DroppedTask:
    """What ``on_drop`` is told about a task held past the held TTL."""

    task_id: str
    task_path: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    held_since: datetime


def _duration(value: Any, name: str) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidTaskOptions(
            f"Breaker {name} must be a timedelta or a number of seconds, got {value!r}."
        )
    value = as_delay(value, f"Breaker {name}")  # TimeOutOfRange past the horizon
    if value <= timedelta(0):
        raise InvalidTaskOptions(f"Breaker {name} must be positive, got {value}.")
    return value


@dataclass(frozen=True, eq=False)
class Breaker:
    """A circuit breaker to give tasks: ``@task(breaker=Breaker(key=...))``.

    ``key(*args, **kwargs)`` is called with a task's own arguments at enqueue and names
    the circuit it belongs to (a host name, say); ``None`` means "no breaker for this
    call". Breakers sharing a ``name`` share their circuits: give one ``Breaker`` object
    to several tasks, or give distinct breakers distinct names.

    A circuit opens after ``failure_threshold`` failures within ``failure_window``
    (defaults: 5 within 5 minutes), or when ``failure(timestamps)`` says so (a predicate
    given instead; it sees the failures of the last hour). ``failures`` lists the
    exception classes that count (default: every exception except ``Abort`` and
    ``TaskDeferred``); other exceptions are neither failures nor successes.
    """

    key: KeyFunction
    name: str = "default"
    failure_threshold: int | None = None
    failure_window: timedelta | float | None = None
    failure: FailurePredicate | None = None
    recovery_delay: timedelta | float = DEFAULT_RECOVERY_DELAY
    held_ttl: timedelta | float = DEFAULT_HELD_TTL
    release_interval: timedelta | float = DEFAULT_RELEASE_INTERVAL
    failures: tuple[type[BaseException], ...] | None = None
    on_state_change: StateChangeHook | None = None
    on_drop: DropHook | None = None

    def __post_init__(self) -> None:
        if not callable(self.key):
            raise InvalidTaskOptions(
                f"Breaker key must be a function of the task's arguments, got {self.key!r}."
            )
        try:
            check_name(self.name)
        except ValueError as exc:
            raise InvalidTaskOptions(str(exc)) from None
        if self.failure is not None:
            if self.failure_threshold is not None or self.failure_window is not None:
                raise InvalidTaskOptions(
                    "Give a Breaker either failure= (a predicate) or failure_threshold= and "
                    "failure_window=, not both."
                )
            if not callable(self.failure):
                raise InvalidTaskOptions(
                    f"Breaker failure must be a predicate of the failure times, got "
                    f"{self.failure!r}."
                )
        else:
            threshold = self.failure_threshold
            if threshold is None:
                threshold = DEFAULT_FAILURE_THRESHOLD
            if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
                raise InvalidTaskOptions(
                    f"Breaker failure_threshold must be a positive integer, got {threshold!r}."
                )
            object.__setattr__(self, "failure_threshold", threshold)
            window = self.failure_window
            window = DEFAULT_FAILURE_WINDOW if window is None else window
            object.__setattr__(self, "failure_window", _duration(window, "failure_window"))
        for name in ("recovery_delay", "held_ttl", "release_interval"):
            object.__setattr__(self, name, _duration(getattr(self, name), name))
        counted = self.failures
        if counted is not None:
            if isinstance(counted, type):
                counted = (counted,)
            if (
                not isinstance(counted, tuple | list)
                or not counted
                or not all(
                    isinstance(kind, type) and issubclass(kind, BaseException) for kind in counted
                )
            ):
                raise InvalidTaskOptions(
                    "Breaker failures must be a non-empty tuple of exception classes (a "
                    f"breaker that counts nothing never opens), got {counted!r}."
                )
            object.__setattr__(self, "failures", tuple(counted))
        for hook in ("on_state_change", "on_drop"):
            value = getattr(self, hook)
            if value is not None and not callable(value):
                raise InvalidTaskOptions(f"Breaker {hook} must be callable, got {value!r}.")
        _DECLARED[self.name] = self.recovery

    # -- typed views of the normalised fields ------------------------------------------

    @property
    def recovery(self) -> timedelta:
        return self.recovery_delay  # type: ignore[return-value]

    @property
    def ttl(self) -> timedelta:
        return self.held_ttl  # type: ignore[return-value]

    @property
    def recheck(self) -> timedelta:
        """How long a closing probe waits at most for holds decided just before it."""
        return self.release_interval  # type: ignore[return-value]

    @property
    def retention(self) -> timedelta:
        """How long a failure is remembered."""
        if self.failure is not None:
            return PREDICATE_RETENTION
        return self.failure_window  # type: ignore[return-value]

    def counts(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by an attempt, is a failure of the remote host."""
        if self.failures is not None:
            return isinstance(exc, self.failures)
        return isinstance(exc, Exception) and not isinstance(exc, NEVER_FAILURES)

    def tripped(self, failures: Sequence[datetime]) -> bool:
        """Whether these (pruned) failures open the circuit. A predicate may raise: the
        caller treats that as "not tripped" and logs it."""
        if self.failure is not None:
            return bool(self.failure(tuple(failures)))
        return len(failures) >= self.failure_threshold  # type: ignore[operator]


def scoped_key(name: str, key: str) -> str:
    """The key stored on a task row: the breaker's name and the circuit's key."""
    return f"{name}/{key}"


def split_scoped_key(scoped: str) -> tuple[str, str]:
    name, _, key = scoped.partition("/")
    return name, key


def check_name(name: Any) -> str:
    """A breaker name, checked: it is stored before the key, separated by ``/``."""
    if not isinstance(name, str) or not name or len(name) > BREAKER_NAME_MAX_LENGTH:
        raise ValueError(
            f"Breaker name must be a non-empty string of at most "
            f"{BREAKER_NAME_MAX_LENGTH} characters, got {name!r}."
        )
    if "/" in name or "\x00" in name:
        raise ValueError(f"Breaker name must not contain '/' or NUL, got {name!r}.")
    return name


def check_key(value: Any, where: str) -> str | None:
    """A key function's result, checked: a string that fits the column, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ValueError(
            f"{where} must return a non-empty string without NUL (or None for no breaker), "
            f"got {value!r}."
        )
    if len(value) > KEY_MAX_LENGTH - BREAKER_NAME_MAX_LENGTH - 1:
        raise ValueError(
            f"{where} returned a key of {len(value)} characters; at most "
            f"{KEY_MAX_LENGTH - BREAKER_NAME_MAX_LENGTH - 1} are stored."
        )
    return value


# -- the circuit ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Circuit:
    """The stored state of one key's circuit."""

    state: State = State.CLOSED
    failures: tuple[datetime, ...] = ()
    opened_at: datetime | None = None
    probe_task_id: str | None = None
    probe_started_at: datetime | None = None
    parked_until: datetime | None = None  # siblings already held until then


CLOSED = Circuit()


@dataclass(frozen=True, slots=True)
class Run:
    """Run the task; ``probe``: it is the half-open circuit's one probe."""

    probe: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """Do not run the task; it is READY again at ``until``. ``park_until``: hold the
    key's other READY tasks until then too (once per value: see ``Circuit.parked_until``)."""

    until: datetime
    reason: str
    park_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """Held past the held TTL while the circuit is still not closed: dead-letter it."""

    held_since: datetime


Decision = Run | Wait | Drop


def decide(
    breaker: Breaker,
    circuit: Circuit,
    *,
    now: datetime,
    task_id: str,
    held_since: datetime | None,
) -> tuple[Decision, Circuit]:
    """What to do with a claimed task, and the circuit afterwards (a probe is recorded)."""
    if circuit.state is State.CLOSED:
        return Run(), circuit
    if held_since is not None and now >= held_since + breaker.ttl:
        return Drop(held_since), circuit
    deadline = (held_since or now) + breaker.ttl
    if circuit.state is State.OPEN:
        opened_at = circuit.opened_at or now
        probe_at = opened_at + breaker.recovery
        if now < probe_at:
            until = min(probe_at, deadline)
            return Wait(until, f"circuit open until {probe_at.isoformat()}", probe_at), circuit
        return Run(probe=True), _probing(circuit, task_id, now)
    # Half-open: one probe at a time; a probe silent for the recovery delay is stale.
    if circuit.probe_task_id == task_id:
        return Run(probe=True), _probing(circuit, task_id, now)
    started = circuit.probe_started_at
    if circuit.probe_task_id is None or started is None or now >= started + breaker.recovery:
        return Run(probe=True), _probing(circuit, task_id, now)
    # Held with the parked tasks, not for a release interval: a task held one by one
    # would be claimed again every interval, each claim taking this row's lock, for as
    # long as the probe runs. The probe's end releases the park, this task with it.
    stale_at = started + breaker.recovery
    reason = f"circuit half-open: waiting for probe {circuit.probe_task_id}"
    return Wait(min(stale_at, deadline), reason, stale_at), circuit


def _probing(circuit: Circuit, task_id: str, now: datetime) -> Circuit:
    return replace(circuit, state=State.HALF_OPEN, probe_task_id=task_id, probe_started_at=now)


def record_success(circuit: Circuit, *, task_id: str) -> Circuit:
    """The remote host answered. A closed circuit forgets its failures; the probe's
    success closes a half-open one. Any other success (a task that started before the
    circuit opened) changes nothing: while the circuit is not closed, the probe decides."""
    if circuit.state is State.CLOSED:
        return CLOSED
    if circuit.state is State.HALF_OPEN and circuit.probe_task_id == task_id:
        return CLOSED
    return circuit


def record_failure(
    breaker: Breaker, circuit: Circuit, *, now: datetime, task_id: str
) -> tuple[Circuit, Exception | None]:
    """A counted failure at ``now``; also returns what a raising predicate raised."""
    failures = prune(breaker, (*circuit.failures, now), now)
    if circuit.state is State.OPEN:
        return replace(circuit, failures=failures), None
    if circuit.state is State.HALF_OPEN and circuit.probe_task_id == task_id:
        return _opened(failures, now), None
    if circuit.state is State.HALF_OPEN:  # a task that started before the circuit opened
        return replace(circuit, failures=failures), None
    try:
        tripped = breaker.tripped(failures)
    except Exception as exc:
        return replace(circuit, failures=failures), exc
    if tripped:
        return _opened(failures, now), None
    return replace(circuit, failures=failures), None


def record_neutral(circuit: Circuit, *, task_id: str) -> Circuit:
    """The attempt ended in a way that says nothing about the host; a probe that did
    frees the probe slot, so the next task claimed probes instead."""
    if circuit.state is State.HALF_OPEN and circuit.probe_task_id == task_id:
        return replace(circuit, probe_task_id=None, probe_started_at=None)
    return circuit


def _opened(failures: tuple[datetime, ...], now: datetime) -> Circuit:
    return Circuit(state=State.OPEN, failures=failures, opened_at=now)


def prune(breaker: Breaker, failures: Sequence[datetime], now: datetime) -> tuple[datetime, ...]:
    """The failures still remembered at ``now``, oldest first, at most 1,000."""
    horizon = now - breaker.retention
    kept = sorted(at for at in failures if at > horizon)
    return tuple(kept[-MAX_REMEMBERED_FAILURES:])


def next_probe(circuit: Circuit, recovery: timedelta | None) -> datetime | None:
    """When the circuit lets a task probe the remote host (``decide``'s rule): an open
    circuit at ``opened_at + recovery``; a half-open one whose probe stays silent, at
    ``probe_started_at + recovery`` (another task probes then). Without the recovery
    delay (no breaker of that name loaded here), the time its held tasks were parked
    until, which is the probe time the workers computed. None for a closed circuit or
    when nothing says."""
    if circuit.state is State.OPEN:
        if recovery is not None and circuit.opened_at is not None:
            return circuit.opened_at + recovery
        parked, opened = circuit.parked_until, circuit.opened_at
        return parked if parked is not None and (opened is None or parked > opened) else None
    if circuit.state is State.HALF_OPEN:
        started = circuit.probe_started_at
        return started + recovery if started is not None and recovery is not None else None
    return None


def force(state: State, *, now: datetime) -> Circuit:
    """The circuit an operator sets: closed (forgets everything) or open from now."""
    if state is State.OPEN:
        return _opened((), now)
    if state is State.CLOSED:
        return CLOSED
    raise ValueError("An operator can force a circuit closed or open, not half-open.")


# -- stored form ----------------------------------------------------------------------------


class CorruptCircuit(ValueError):
    """A stored circuit that cannot be read; the caller treats it as closed and logs."""


def failures_text(failures: Sequence[datetime]) -> str:
    """The failure times as stored: a JSON list of ISO 8601 strings."""
    return json.dumps([at.isoformat() for at in failures])


def parse_circuit(
    state: Any,
    failures: Any,
    opened_at: datetime | None,
    probe_task_id: Any,
    probe_started_at: datetime | None,
    parked_until: datetime | None,
) -> Circuit:
    """A stored row's columns as a ``Circuit``; raises ``CorruptCircuit`` saying what
    is wrong (an unknown state, unreadable failure times, an open circuit with no time)."""
    try:
        known = State(state)
    except ValueError:
        raise CorruptCircuit(f"unknown state {state!r}") from None
    try:
        times = json.loads(failures) if failures else []
        if not isinstance(times, list):
            raise TypeError("not a list")
        parsed = tuple(_aware(datetime.fromisoformat(at)) for at in times)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CorruptCircuit(f"unreadable failure times ({exc})") from None
    if known is State.OPEN and opened_at is None:
        raise CorruptCircuit("open, but with no time it opened")
    if probe_task_id is not None and not isinstance(probe_task_id, str):
        raise CorruptCircuit(f"probe task id {probe_task_id!r} is not text")
    return Circuit(
        state=known,
        failures=tuple(sorted(parsed))[-MAX_REMEMBERED_FAILURES:],
        opened_at=opened_at,
        probe_task_id=probe_task_id or None,
        probe_started_at=probe_started_at,
        parked_until=parked_until,
    )


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
