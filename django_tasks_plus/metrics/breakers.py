"""The circuit breakers as metrics: gauges read when asked (the Prometheus endpoint's
scrape), each circuit's state, the tasks it holds, when it opened, and how many circuits
each breaker has in each state; and counters per breaker name (``install_counters``).

A breaker key is often a remote host, so a backend may store thousands of circuits:
one series per circuit would make the scrape as large. At most ``limit`` circuits are
named one by one (those not closed first, the most recently opened first, then the
closed ones most recently changed); the per-state counts cover every circuit, so an
alert on "any circuit open" never misses one left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .. import compat, events
from ..breaker import CorruptCircuit, State, parse_circuit, scoped_key
from ..db import breakers as store
from ..db.waiting import COUNT_CAP
from .aggregate import register_counter
from .queries import _settings

# Circuits named one by one per backend and scrape, at most.
CIRCUIT_SERIES = 100
STATES: tuple[str, ...] = tuple(state.value for state in State)


@dataclass(frozen=True, slots=True)
class CircuitGauge:
    """One stored circuit now. A row that cannot be read works as closed, and reads so."""

    name: str
    key: str
    state: str  # one of ``STATES``
    held: int  # READY tasks it holds back (not yet due), at most ``COUNT_CAP``
    held_capped: bool  # more may be held than ``held`` says
    opened_at: datetime | None  # when it opened, while it is not closed


@dataclass(frozen=True, slots=True)
class BreakerGauges:
    """A backend's circuits: ``circuits`` named one by one (at most ``limit``), and
    ``counts``: every stored circuit per ``(breaker name, state)``."""

    circuits: list[CircuitGauge]
    counts: dict[tuple[str, str], int]

    @property
    def stored(self) -> int:
        return sum(self.counts.values())


def _state(value: str) -> str:
    """A stored state as it works: an unknown one (a corrupt row) is closed."""
    return value if value in STATES else State.CLOSED.value


def breaker_gauges(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    *,
    limit: int = CIRCUIT_SERIES,
    cap: int = COUNT_CAP,
    now: datetime | None = None,
) -> BreakerGauges:
    """The backend's circuits now: one grouped read of the breaker table, at most
    ``limit`` circuit rows, and their held counts, each reading at most ``cap + 1`` of
    its key's READY rows (one statement per ``db.breakers.HELD_BATCH`` circuits)."""
    database = _settings(backend).database
    now = now or store.database_now(database)
    counts: dict[tuple[str, str], int] = {}
    for name, state, count in store.state_counts(database, backend):
        counts[(name, _state(state))] = counts.get((name, _state(state)), 0) + count
    rows = store.leading_circuits(database, backend, limit)
    held = store.held_capped(
        database, backend, [scoped_key(row.name, row.key) for row in rows], now, cap
    )
    circuits = []
    for row in rows:
        try:
            circuit = parse_circuit(*(getattr(row, column) for column in store.CIRCUIT_COLUMNS))
            state, opened_at = circuit.state.value, circuit.opened_at
        except CorruptCircuit:
            state, opened_at = State.CLOSED.value, None
        count, capped = held.get(scoped_key(row.name, row.key), (0, False))
        circuits.append(
            CircuitGauge(
                name=row.name,
                key=row.key,
                state=state,
                held=count,
                held_capped=capped,
                opened_at=None if state == State.CLOSED.value else opened_at,
            )
        )
    return BreakerGauges(circuits=circuits, counts=counts)


def install_counters() -> None:
    """The breakers' counters per breaker name, registered by ``AppConfig.ready``: state
    changes (by the state entered), tasks parked, tasks released. Not per key: a counter
    is stored per minute and all-time, never pruned, so a series per host would stay
    forever; the gauges name the keys, capped."""
    register_counter(
        "breaker_transitions",
        events.BREAKER_STATE_CHANGED,
        help="Circuit state changes, by the state entered (new).",
        labels=("breaker", "new"),
        per_task=False,
        builtin=True,
    )
    register_counter(
        "breaker_parked",
        events.BREAKER_PARKED,
        help="Waiting tasks a circuit held back at once (parked).",
        labels=("breaker",),
        per_task=False,
        builtin=True,
    )
    register_counter(
        "breaker_released",
        events.TASK_RELEASED,
        help="Held tasks made due again as their circuit closed.",
        labels=("breaker",),
        per_task=False,
        builtin=True,
    )


__all__ = [
    "CIRCUIT_SERIES",
    "STATES",
    "BreakerGauges",
    "CircuitGauge",
    "breaker_gauges",
    "install_counters",
]
