"""The Prometheus text exposition of the metrics, rendered by ``prometheus_client``.

A collector reads the database when scraped: the all-time counters and histograms per
backend, queue and task (totals never go down: the leader prunes minutes, not totals),
and the gauges of each queue, the workers and the circuit breakers, counted then
(``breakers.py`` caps the circuits named one by one).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .breakers import STATES, breaker_gauges
from .catalog import (
    COUNTER_NAMES,
    COUNTERS,
    HISTOGRAM_NAMES,
    HISTOGRAMS,
    feature_counters,
    split_stored_name,
)
from .queries import all_time, queue_gauges, workers

PREFIX = "django_tasks_plus"
LABELS = ["backend", "queue", "task"]
GAUGES = {
    "ready": "Tasks READY and due now.",
    "scheduled": "Tasks READY with a future run_after (retries, scheduled, held).",
    "running": "Tasks RUNNING now.",
    "dead": "Tasks FAILED (dead-lettered).",
}


class TasksCollector(Collector):
    """Yields the metric families of ``backends`` (TASKS aliases) when collected."""

    def __init__(self, backends: Sequence[str]) -> None:
        self.backends = list(backends)

    def collect(self) -> Iterator[Metric]:
        counters = {
            name: CounterMetricFamily(f"{PREFIX}_{name}", COUNTERS[name][1], labels=LABELS)
            for name in COUNTER_NAMES
        }
        features = {
            name: CounterMetricFamily(
                f"{PREFIX}_{name}",
                counter.help,
                labels=[*(LABELS if counter.per_task else ["backend"]), *counter.labels],
            )
            for name, counter in feature_counters().counters.items()
        }
        histograms = {
            kind: HistogramMetricFamily(f"{PREFIX}_{kind}_seconds", HISTOGRAMS[kind], labels=LABELS)
            for kind in HISTOGRAM_NAMES
        }
        gauges = {
            name: GaugeMetricFamily(f"{PREFIX}_{name}_tasks", text, labels=["backend", "queue"])
            for name, text in GAUGES.items()
        }
        oldest = GaugeMetricFamily(
            f"{PREFIX}_oldest_ready_age_seconds",
            "How long the longest-waiting task that could run now (due, not blocked) has waited.",
            labels=["backend", "queue"],
        )
        alive = GaugeMetricFamily(
            f"{PREFIX}_workers",
            "Registered workers, alive (recent heartbeat) or stale.",
            labels=["backend", "state"],
        )
        circuits = _CircuitFamilies()
        for backend in self.backends:
            circuits.add(backend)
            # A counter without queue and task: its rows' values added up per own labels.
            untasked: dict[tuple[str, tuple[str, ...]], int] = {}
            for (queue, task), numbers in sorted(all_time(backend).items()):
                labels = [backend, queue, task]
                for name, value in numbers["counters"].items():
                    counters[name].add_metric(labels, value)
                for stored, value in numbers["features"].items():
                    name, own = split_stored_name(stored)
                    counter = feature_counters().counters[name]
                    own_labels = tuple(own.get(label, "") for label in counter.labels)
                    if counter.per_task:
                        features[name].add_metric([*labels, *own_labels], value)
                    else:
                        untasked[(name, own_labels)] = untasked.get((name, own_labels), 0) + value
                for kind in HISTOGRAM_NAMES:
                    found = numbers[kind]
                    histograms[kind].add_metric(labels, found.cumulative(), found.sum)
            for (name, own_labels), value in sorted(untasked.items()):
                features[name].add_metric([backend, *own_labels], value)
            for gauge in queue_gauges(backend):
                for name in GAUGES:
                    gauges[name].add_metric([backend, gauge.queue], getattr(gauge, name))
                oldest.add_metric([backend, gauge.queue], gauge.oldest_ready_age or 0.0)
            found_workers = workers(backend)
            live = sum(1 for worker in found_workers if worker.alive)
            alive.add_metric([backend, "alive"], live)
            alive.add_metric([backend, "stale"], len(found_workers) - live)
        yield from counters.values()
        yield from features.values()
        yield from histograms.values()
        yield from gauges.values()
        yield oldest
        yield alive
        yield from circuits.families()


class _CircuitFamilies:
    """The breaker gauges: per circuit (at most ``breakers.CIRCUIT_SERIES`` per backend)
    its state as one series per state (1 for the state it is in, as a Prometheus
    state set), its held tasks and when it opened; per breaker and state, how many."""

    def __init__(self) -> None:
        labels = ["backend", "breaker", "key"]
        self.state = GaugeMetricFamily(
            f"{PREFIX}_breaker_state",
            "1 for the state a circuit is in (closed, open, half-open), else 0.",
            labels=[*labels, "state"],
        )
        self.held = GaugeMetricFamily(
            f"{PREFIX}_breaker_held_tasks",
            "READY tasks a circuit holds back (counted up to 10,000).",
            labels=labels,
        )
        self.opened = GaugeMetricFamily(
            f"{PREFIX}_breaker_opened_timestamp_seconds",
            "When a circuit that is not closed opened (Unix time).",
            labels=labels,
        )
        self.counts = GaugeMetricFamily(
            f"{PREFIX}_breaker_circuits",
            "Stored circuits per breaker and state, every one counted.",
            labels=["backend", "breaker", "state"],
        )

    def add(self, backend: str) -> None:
        found = breaker_gauges(backend)
        for circuit in found.circuits:
            labels = [backend, circuit.name, circuit.key]
            for state in STATES:
                self.state.add_metric([*labels, state], 1.0 if state == circuit.state else 0.0)
            self.held.add_metric(labels, circuit.held)
            if circuit.opened_at is not None:
                self.opened.add_metric(labels, circuit.opened_at.timestamp())
        for name in sorted({name for name, _state in found.counts}):
            for state in STATES:
                self.counts.add_metric([backend, name, state], found.counts.get((name, state), 0))

    def families(self) -> Iterator[Metric]:
        yield from (self.state, self.held, self.opened, self.counts)


def render(backends: Sequence[str]) -> bytes:
    """The exposition text of ``backends``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TasksCollector(backends))
    return generate_latest(registry)
