"""Circuit breakers at work: the middleware that guards each call, and the operator API.

``@task(breaker=Breaker(...))`` puts ``breaker_middleware`` innermost in the task's
middleware chain (``breaker_middleware_for``, registered in ``extensions.task_middleware``
by ``AppConfig.ready``); the engine knows nothing else about breakers. Around each
attempt of a task whose call has a breaker key, the middleware

1. reads the key's circuit (no lock: a closed circuit costs one indexed read);
2. when it is not closed, locks the row and asks ``breaker.decide``: run (maybe as the
   probe), hold (a ``middleware.Hold``: READY again later, no attempt spent; the key's
   other waiting tasks are held in the same way, in one statement), or drop
   (``BreakerHeldTooLong``, which dead-letters the task);
3. after the call, records a counted failure, the probe's outcome, or a success that
   clears remembered failures, under the row lock; a probe that closes the circuit
   releases the key's held tasks (and, once the holds decided just before the close
   are written, releases again).

State changes, probes, holds of many tasks, releases and drops are emitted as events and
logged; ``on_state_change`` and ``on_drop`` run after the change is committed. A hook or
a failure predicate that raises is logged and changes nothing. A stored circuit that
cannot be read is treated as closed and logged, and overwritten by the next change. A
circuit the database cannot answer for (a lost connection, a lock or statement timeout)
holds the task a few seconds without spending an attempt (``_undecided``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from . import compat, events
from .breaker import (
    CLOSED,
    Breaker,
    Circuit,
    CorruptCircuit,
    Drop,
    DroppedTask,
    Run,
    State,
    Wait,
    check_key,
    check_name,
    decide,
    declared_names,
    declared_recovery,
    failures_text,
    force,
    next_probe,
    parse_circuit,
    record_failure,
    record_neutral,
    record_success,
    scoped_key,
    split_scoped_key,
)
from .db import breakers as store
from .db.rowlock import lock_refused_as
from .exceptions import (
    BreakerHeldTooLong,
    CircuitLocked,
    CircuitNotFound,
    InvalidBackendOptions,
    UnknownBreaker,
)
from .middleware import Attempt, Handler, Hold, Middleware

logger = logging.getLogger("django_tasks_plus.breakers")
# How long a task waits when its circuit could not be read (``_undecided``).
UNDECIDED_HOLD = timedelta(seconds=5)

# How often a closing probe looks whether the holds decided just before it are written.
LATE_HOLD_POLL = 0.02


@dataclass(frozen=True, slots=True)
class _Key:
    """Where one circuit lives."""

    database: str
    backend: str
    name: str
    key: str

    @property
    def scoped(self) -> str:
        return scoped_key(self.name, self.key)


def breaker_middleware_for(task: compat.Task) -> tuple[Middleware, ...]:
    """What the breaker feature adds to a task's middleware (``extensions.task_middleware``,
    registered by ``AppConfig.ready``): its breaker's, innermost, when it has one."""
    return (breaker_middleware,) if getattr(task, "breaker", None) is not None else ()


def breaker_middleware(call_next: Handler) -> Handler:
    """The middleware a task's ``breaker=`` adds (innermost); see the module docstring."""

    def middleware(attempt: Attempt) -> Any:
        breaker = getattr(attempt.task, "breaker", None)
        if not isinstance(breaker, Breaker) or attempt.breaker_key is None:
            return call_next(attempt)
        # The circuit the task was enqueued under: a breaker renamed since then leaves its
        # waiting tasks with the circuit that holds them, and new tasks use the new name.
        name, key = split_scoped_key(attempt.breaker_key)
        where = _Key(_database(attempt.backend), attempt.backend, name or breaker.name, key)
        return _guarded(breaker, where, attempt, call_next)

    return middleware


def _database(backend: str) -> str:
    settings = getattr(compat.task_backends[backend], "settings", None)
    database = getattr(settings, "database", None)
    if not isinstance(database, str):
        raise InvalidBackendOptions(
            f"Task backend {backend!r} is not django_tasks_plus' DatabaseBackend; circuit "
            "breakers keep their state in its database."
        )
    return database


def _guarded(breaker: Breaker, where: _Key, attempt: Attempt, call_next: Handler) -> Any:
    try:
        before = _read(where)
        probe = False
        if before.state is not State.CLOSED:
            decision, before = _decide(breaker, where, attempt)
            if isinstance(decision, Wait):
                reason = f"breaker {where.scoped}: {decision.reason}"
                return Hold(until=decision.until, reason=reason)
            if isinstance(decision, Drop):
                raise _dropped(breaker, where, attempt, decision)
            probe = decision.probe
    except (OperationalError, InterfaceError) as exc:
        return _undecided(breaker, where, attempt, exc)
    try:
        value = call_next(attempt)
    except BaseException as exc:
        if breaker.counts(exc):
            _record(breaker, where, attempt, "failure")
        elif probe:
            _record(breaker, where, attempt, "neutral")
        raise
    if isinstance(value, Hold):  # an inner middleware held it: the host was not tried
        if probe:
            _record(breaker, where, attempt, "neutral")
    elif probe or before.failures:
        _record(breaker, where, attempt, "success")
    return value


def _undecided(
    breaker: Breaker, where: _Key, attempt: Attempt, exc: OperationalError | InterfaceError
) -> Hold:
    """The database could not answer for the circuit (a lost connection, a lock or
    statement timeout): trouble that is not the task's, so the task waits a little without
    spending an attempt. Past the held TTL (by this host's clock: the database's is what
    failed), the error fails the attempt as any other would, so a breaker that cannot be
    read for days does not hold its tasks for ever."""
    held_since = attempt.held_since
    if held_since is not None and datetime.now(UTC) >= held_since + breaker.ttl:
        raise exc
    logger.warning(
        "Circuit breaker %s: its state could not be read (%s: %s); task %s held %s s "
        "without spending an attempt.",
        where.scoped,
        type(exc).__name__,
        exc,
        attempt.id,
        UNDECIDED_HOLD.total_seconds(),
    )
    reason = f"breaker {where.scoped}: its state could not be read ({type(exc).__name__})"
    return Hold(delay=UNDECIDED_HOLD, reason=reason)


# -- reading and deciding ---------------------------------------------------------------------


def _parse(where: _Key, columns: tuple[Any, ...] | None) -> Circuit:
    if columns is None:
        return CLOSED
    try:
        return parse_circuit(*columns)
    except CorruptCircuit as exc:
        logger.warning(
            "Circuit breaker %s: the stored state is corrupt (%s); treated as closed.",
            where.scoped,
            exc,
        )
        return CLOSED


def _read(where: _Key) -> Circuit:
    return _parse(where, store.stored_circuit(where.database, where.backend, where.name, where.key))


def _decide(breaker: Breaker, where: _Key, attempt: Attempt) -> tuple[Run | Wait | Drop, Circuit]:
    """Decide under the row lock; then announce a change and hold the key's other tasks."""
    with transaction.atomic(using=where.database):
        now = store.database_now(where.database)
        columns = store.locked_circuit(where.database, where.backend, where.name, where.key, now)
        current = _parse(where, columns)
        decision, after = decide(
            breaker, current, now=now, task_id=attempt.id, held_since=attempt.held_since
        )
        park = None
        parked = 0
        target = decision.park_until if isinstance(decision, Wait) else None
        if target is not None and (after.parked_until is None or after.parked_until < target):
            park = target
            after = replace(after, parked_until=park)
            # Under the row lock: whoever sees ``parked_until`` next knows the key's waiting
            # tasks are parked already. Parked after the commit, they could still be claimed
            # (and held one by one) by workers whose holds went ahead meanwhile.
            parked = store.park_tasks(where.database, where.backend, where.scoped, park, now)
        if after != current:
            _save(where, after, now)
    _announce(breaker, where, current, after, attempt.id)
    if isinstance(decision, Run) and decision.probe and current.probe_task_id != attempt.id:
        logger.info("Circuit breaker %s: task %s probes the remote host.", where.scoped, attempt.id)
        events.emit(
            events.BREAKER_PROBE_STARTED,
            {},
            {**_labels(where), "task_id": attempt.id, "task_path": attempt.task_path},
        )
    if park is not None:
        if parked:
            logger.info(
                "Circuit breaker %s: %d waiting task(s) held until %s.",
                where.scoped,
                parked,
                park.isoformat(),
            )
        events.emit(events.BREAKER_PARKED, {"count": parked}, {**_labels(where), "until": park})
    return decision, after


def _dropped(breaker: Breaker, where: _Key, attempt: Attempt, drop: Drop) -> BreakerHeldTooLong:
    """The task was held past the held TTL: tell ``on_drop``; the error dead-letters it."""
    details = DroppedTask(
        task_id=attempt.id,
        task_path=attempt.task_path,
        args=tuple(attempt.args),
        kwargs=dict(attempt.kwargs),
        held_since=drop.held_since,
    )
    logger.warning(
        "Circuit breaker %s: task %s (%s) held since %s, past the held TTL of %s; dropped.",
        where.scoped,
        attempt.id,
        attempt.task_path,
        drop.held_since.isoformat(),
        breaker.ttl,
    )
    events.emit(
        events.BREAKER_DROPPED,
        {},
        {
            **_labels(where),
            "task_id": attempt.id,
            "task_path": attempt.task_path,
            "held_since": drop.held_since,
        },
    )
    _call_hook("on_drop", breaker.on_drop, where.key, details)
    return BreakerHeldTooLong(
        f"breaker held too long: circuit {where.scoped} did not close within the held TTL "
        f"of {breaker.ttl} (held since {drop.held_since.isoformat()})"
    )


# -- recording outcomes -----------------------------------------------------------------------


def _record(breaker: Breaker, where: _Key, attempt: Attempt, outcome: str) -> None:
    """Record the attempt's outcome; never raises (the task's own outcome matters more)."""
    if connections[where.database].in_atomic_block:
        # The task left a transaction open: the worker rolls it back and fails the attempt
        # (TransactionLeaked); a write here would be rolled back with it.
        logger.warning(
            "Circuit breaker %s: task %s left a transaction open; its outcome is not recorded.",
            where.scoped,
            attempt.id,
        )
        return
    try:
        with transaction.atomic(using=where.database):
            now = store.database_now(where.database)
            columns = store.locked_circuit(
                where.database, where.backend, where.name, where.key, now
            )
            current = _parse(where, columns)
            problem = None
            if outcome == "failure":
                after, problem = record_failure(breaker, current, now=now, task_id=attempt.id)
            elif outcome == "success":
                after = record_success(current, task_id=attempt.id)
            else:
                after = record_neutral(current, task_id=attempt.id)
            if after != current:
                _save(where, after, now)
    except DatabaseError as exc:
        logger.warning(
            "Circuit breaker %s: could not record the %s of task %s (%s).",
            where.scoped,
            outcome,
            attempt.id,
            exc,
        )
        return
    if problem is not None:
        logger.error(
            "Circuit breaker %s: the failure predicate raised %s: %s; the circuit stays %s.",
            where.scoped,
            type(problem).__name__,
            problem,
            after.state,
        )
    _announce(breaker, where, current, after, attempt.id)
    if after.state is State.CLOSED and current.state is not State.CLOSED:
        _release_on_close(breaker, where, now, attempt.id)
    elif current.probe_task_id is not None and after.probe_task_id is None:
        # The probe ended saying nothing about the host: the tasks parked until it would
        # have gone stale are due now, so that one of them probes at once.
        _release(where, now)


def _release_on_close(breaker: Breaker, where: _Key, now: datetime, probe_id: str) -> None:
    """The probe closed the circuit: release its held tasks, including the holds that
    were decided before the close but are written after the release.

    A task claimed while the probe ran is held until the probe would be stale; a worker
    that decided so just before the close may write that hold after the release below,
    and nothing else would release it before the park ends. Such an attempt is RUNNING
    now (a hold is decided under the row lock, before the close), so: note the key's
    running attempts first, release, wait for those to be written (at most
    ``release_interval``), and release once more. A few statements per close, never one
    per held task.
    """
    try:
        leases = store.running_leases(where.database, where.backend, where.scoped, probe_id)
    except DatabaseError:
        leases = []
    _release(where, now)
    if not leases:
        return
    try:
        deadline = time.monotonic() + breaker.recheck.total_seconds()
        while time.monotonic() < deadline and store.still_running(where.database, leases):
            time.sleep(LATE_HOLD_POLL)
        _release(where, store.database_now(where.database), quiet=True)
    except DatabaseError as exc:
        logger.warning(
            "Circuit breaker %s closed, but the holds written since could not be released "
            "(%s); each runs when its hold ends.",
            where.scoped,
            exc,
        )


def _release(where: _Key, now: datetime, *, quiet: bool = False) -> int:
    """The circuit closed: the tasks it held are due now. ``quiet``: announce only a
    release that found tasks (a second look after the first)."""
    try:
        released = store.release_tasks(where.database, where.backend, where.scoped, now)
    except DatabaseError as exc:
        logger.warning(
            "Circuit breaker %s closed, but its held tasks could not be released now (%s); "
            "each runs when its hold ends.",
            where.scoped,
            exc,
        )
        return 0
    if released:
        logger.info("Circuit breaker %s: %d held task(s) released.", where.scoped, released)
    elif quiet:
        return 0
    events.emit(events.TASK_RELEASED, {"count": released}, _labels(where))
    return released


# -- shared -----------------------------------------------------------------------------------


def _save(where: _Key, circuit: Circuit, now: datetime) -> None:
    store.save_circuit(
        where.database, where.backend, where.name, where.key, circuit_columns(circuit), now
    )


def circuit_columns(circuit: Circuit) -> dict[str, Any]:
    """The row's columns for ``circuit``."""
    return {
        "state": circuit.state.value,
        "failures": failures_text(circuit.failures),
        "opened_at": circuit.opened_at,
        "probe_task_id": circuit.probe_task_id,
        "probe_started_at": circuit.probe_started_at,
        "parked_until": circuit.parked_until,
    }


def _labels(where: _Key) -> dict[str, Any]:
    return {"backend": where.backend, "breaker": where.name, "key": where.key}


def _announce(
    breaker: Breaker | None, where: _Key, before: Circuit, after: Circuit, cause: str
) -> None:
    """Log, emit and tell ``on_state_change`` about a change of state (after commit)."""
    if before.state is after.state:
        return
    logger.warning(
        "Circuit breaker %s: %s -> %s (%s).", where.scoped, before.state, after.state, cause
    )
    events.emit(
        events.BREAKER_STATE_CHANGED,
        {"failures": len(after.failures)},
        {**_labels(where), "old": before.state.value, "new": after.state.value, "cause": cause},
    )
    if breaker is not None:
        _call_hook("on_state_change", breaker.on_state_change, where.key, before.state, after.state)


def _call_hook(name: str, hook: Callable[..., object] | None, *args: Any) -> None:
    if hook is None:
        return
    try:
        hook(*args)
    except Exception:
        logger.exception("Circuit breaker %s hook %r raised; ignored.", name, hook)


# -- the operator's API -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    """One stored circuit as an operator sees it."""

    name: str
    key: str
    state: str  # "closed", "open", "half-open", or "corrupt" (worked as closed)
    failures: int
    last_failure_at: datetime | None
    opened_at: datetime | None
    probe_task_id: str | None
    probe_started_at: datetime | None
    held: int  # tasks held back for this key and not yet due
    updated_at: datetime
    problem: str = ""  # why a corrupt row cannot be read
    probe_at: datetime | None = None  # when a task may next probe (``breaker.next_probe``)


def breaker_states(backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS) -> list[BreakerStatus]:
    """Every circuit the backend's breakers have stored (a key that never failed has none)."""
    database = _database(backend)
    held = store.held_counts(database, backend, store.database_now(database))
    statuses = []
    for row in store.breaker_rows(database, backend):
        problem = ""
        try:
            circuit = parse_circuit(*(getattr(row, column) for column in store.CIRCUIT_COLUMNS))
        except CorruptCircuit as exc:
            circuit, problem = CLOSED, str(exc)
        statuses.append(
            BreakerStatus(
                name=row.name,
                key=row.key,
                state="corrupt" if problem else circuit.state.value,
                failures=len(circuit.failures),
                last_failure_at=circuit.failures[-1] if circuit.failures else None,
                opened_at=circuit.opened_at,
                probe_task_id=circuit.probe_task_id,
                probe_started_at=circuit.probe_started_at,
                held=held.get(scoped_key(row.name, row.key), 0),
                updated_at=row.updated_at,
                problem=problem,
                probe_at=None if problem else next_probe(circuit, declared_recovery(row.name)),
            )
        )
    return statuses


def force_close(
    key: str,
    *,
    name: str = "default",
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    lock_wait: float = store.CIRCUIT_LOCK_WAIT,
) -> int:
    """Close a stored circuit now (its failures forgotten) and release the tasks it held;
    returns how many were released. Hooks do not run: they belong to the workers' breakers.

    Raises ``CircuitNotFound`` when no circuit of that name and key is stored (nothing
    is written: a mistyped or missing name would otherwise leave the real circuit open),
    listing the names the key has circuits under; ``ValueError`` for a name or key no
    breaker could have; ``CircuitLocked`` when another session keeps the circuit's row
    locked for ``lock_wait`` seconds.
    """
    where = _where(key, name, backend)
    with _locked_out_as_error(where, lock_wait), transaction.atomic(using=where.database):
        now = store.database_now(where.database)
        columns = store.locked_existing_circuit(
            where.database, backend, where.name, where.key, lock_wait
        )
        if columns is None:
            raise _not_found(where)
        current = _parse(where, columns)
        after = force(State.CLOSED, now=now)
        _save(where, after, now)
    _announce(None, where, current, after, "operator")
    return _release(where, now)


def force_open(
    key: str,
    *,
    name: str = "default",
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    create: bool = False,
    lock_wait: float = store.CIRCUIT_LOCK_WAIT,
) -> None:
    """Open a circuit now: its tasks are held from their next claim on, and a probe runs
    once the breaker's recovery delay has passed, as after failures.

    A key with no stored circuit gets one, if its breaker name is in use: by a stored
    circuit, a waiting task, or a ``Breaker`` created in this process. Any other name
    raises ``UnknownBreaker`` (a typo would open a circuit no task consults) unless
    ``create=True``. Raises ``ValueError`` for a name or key no breaker could have, and
    ``CircuitLocked`` when another session keeps the circuit's row locked for
    ``lock_wait`` seconds.
    """
    where = _where(key, name, backend)
    if not create and not _known_name(where):
        known = tuple(sorted(declared_names() | store.stored_names(where.database, backend)))
        raise UnknownBreaker(
            f"No breaker named {where.name!r} is in use in backend {backend!r}: no stored "
            f"circuit, no waiting task and no Breaker loaded in this process has that name "
            f"(names in use: {', '.join(known) or 'none'}). Pass create=True (manage.py "
            "breakers open --create) to open it anyway.",
            name=where.name,
            known=known,
        )
    with _locked_out_as_error(where, lock_wait), transaction.atomic(using=where.database):
        now = store.database_now(where.database)
        columns = store.locked_circuit(
            where.database, backend, where.name, where.key, now, lock_wait
        )
        current = _parse(where, columns)
        after = force(State.OPEN, now=now)
        _save(where, after, now)
    _announce(None, where, current, after, "operator")


def _locked_out_as_error(where: _Key, lock_wait: float) -> AbstractContextManager[None]:
    """An operator's force that met the circuit's row locked past ``lock_wait``: the
    typed ``CircuitLocked`` (nothing changed), not the driver's lock error."""
    return lock_refused_as(
        where.database,
        lambda _waited: CircuitLocked(
            f"Circuit {where.scoped!r} of backend {where.backend!r}: another database "
            f"session holds its row locked (a transaction still open); waited "
            f"{lock_wait:g} s and changed nothing. Try again once that transaction ends.",
            name=where.name,
            key=where.key,
            waited=lock_wait,
        ),
    )


def _where(key: str, name: str, backend: str) -> _Key:
    check_name(name)
    checked = check_key(key, "A breaker key")  # raises ValueError, as check_name
    if checked is None:
        raise ValueError("A breaker key is required to force a circuit.")
    return _Key(_database(backend), backend, name, checked)


def _known_name(where: _Key) -> bool:
    if where.name in declared_names():
        return True
    return store.name_in_use(where.database, where.backend, where.name)


def _not_found(where: _Key) -> CircuitNotFound:
    others = store.circuits_of_key(where.database, where.backend, where.key)
    if others:
        listed = ", ".join(f"{name} ({state})" for name, state in others)
        hint = f"{where.key!r} has stored circuits under: {listed}; give that name."
    else:
        hint = (
            f"no breaker has a stored circuit for {where.key!r}; a key that never failed is closed."
        )
    return CircuitNotFound(
        f"No circuit {where.scoped!r} is stored in backend {where.backend!r}, so there is "
        f"nothing to close: {hint}",
        name=where.name,
        key=where.key,
        others=tuple(name for name, _state in others),
    )
