"""What is counted and measured: counter names, the events they count, the fixed
histogram buckets, and how each number is named in the metrics table.

Pure definitions, shared by the aggregator (which fills them), the queries (which read
them back) and the Prometheus endpoint (which names them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from .. import events
from ..limits import METRIC_NAME_MAX_LENGTH
from ..registries import app

# Counter -> (the events it counts, help text). An event's ``count`` measurement, when it
# has one (a bulk enqueue, a breaker holding many tasks), adds that many.
COUNTERS: dict[str, tuple[tuple[str, ...], str]] = {
    "enqueued": ((events.TASK_ENQUEUED,), "Tasks enqueued."),
    "deduplicated": ((events.TASK_DEDUPLICATED,), "Enqueue calls refused by a held dedup key."),
    "started": ((events.TASK_STARTED,), "Attempts started."),
    "succeeded": ((events.TASK_SUCCEEDED,), "Attempts that succeeded."),
    "attempt_failed": ((events.TASK_ATTEMPT_FAILED,), "Attempts that recorded an error."),
    "retried": ((events.TASK_RETRY_SCHEDULED,), "Retries scheduled after a failed attempt."),
    "deferred": ((events.TASK_DEFERRED,), "Attempts that deferred their task."),
    "dead_lettered": ((events.TASK_DEAD_LETTERED,), "Tasks that ended FAILED (dead-lettered)."),
    "cancelled": ((events.TASK_CANCELLED,), "Tasks cancelled."),
    "redriven": ((events.TASK_REDRIVEN,), "Dead tasks redriven."),
    "discarded": ((events.TASK_DISCARDED,), "Dead tasks whose ordering key was released."),
    "lease_lost": ((events.TASK_LEASE_LOST,), "Leases a worker found taken over."),
    "reaped": ((events.TASK_REAPED,), "Expired leases settled by a reaper."),
    "held": (
        (events.TASK_HELD, events.BREAKER_PARKED),
        "Tasks held back without spending an attempt (middleware holds, breakers).",
    ),
    "released": ((events.TASK_RELEASED,), "Held tasks made due again (a circuit closed)."),
    "breaker_dropped": ((events.BREAKER_DROPPED,), "Tasks dead-lettered for waiting past a "
                        "breaker's held TTL."),
}  # fmt: skip
COUNTER_NAMES = tuple(COUNTERS)
COUNTER_OF_EVENT = {event: name for name, (names, _) in COUNTERS.items() for event in names}

# Histograms: wait = from when the task was due (enqueued, or its run_after) to the start
# of the attempt; run = the attempt in the worker. Upper bounds in seconds, fixed so that
# every worker's buckets add up; one more bucket (+Inf) takes the rest.
BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
)  # fmt: skip
HISTOGRAMS: dict[str, str] = {
    "wait": "Seconds from when a task was due (enqueued, or its run_after) to its start.",
    "run": "Seconds an attempt ran in the worker.",
}
HISTOGRAM_NAMES = tuple(HISTOGRAMS)

# The all-time row of each number: the minute the epoch stands for "since the beginning".
ALL_TIME = datetime(1970, 1, 1, tzinfo=UTC)


def bound_label(bound: float) -> str:
    """``0.0025`` -> ``"0.0025"``, ``1`` -> ``"1"``: the ``le`` of a bucket."""
    return "+Inf" if bound == float("inf") else f"{bound:g}"


LE_LABELS: tuple[str, ...] = (*map(bound_label, BUCKETS), "+Inf")


def bucket_name(histogram: str, index: int) -> str:
    """The stored name of one (non-cumulative) bucket: ``wait:le=0.5``."""
    return f"{histogram}:le={LE_LABELS[index]}"


def sum_name(histogram: str) -> str:
    """The stored name of a histogram's sum, in whole microseconds: ``wait:sum_us``."""
    return f"{histogram}:sum_us"


BUCKET_NAMES: dict[str, tuple[str, ...]] = {
    histogram: tuple(bucket_name(histogram, i) for i in range(len(LE_LABELS)))
    for histogram in HISTOGRAM_NAMES
}
BUCKET_INDEX: dict[str, tuple[str, int]] = {
    name: (histogram, i)
    for histogram, names in BUCKET_NAMES.items()
    for i, name in enumerate(names)
}


# -- counters the features register ---------------------------------------------------------
#
# The built-in counters above are a fixed layout (the aggregator's hot path indexes them).
# A feature's counter is registered at its start: which of its events it counts, and
# which of the events' labels (by key) are its own dimensions beside backend, queue
# and task path. Its stored name carries those labels (``schedule_fired{schedule=nightly}``)
# in the one metrics table, so a feature adds counters without a migration
# (docs/development.md, "Metrics of a feature").

_COUNTER_NAME = re.compile(r"[a-z][a-z0-9_]{0,59}")
_LABEL_VALUE_BAD = re.compile(r"[{}=,\x00]")


@dataclass(frozen=True)
class FeatureCounter:
    """A feature's counter: ``events`` it counts (by their ``count`` measurement, else
    one each), ``labels``: the event label keys that are its own dimensions.
    ``per_task=False``: its events name no queue or task (a breaker's, about a host),
    so it is served with ``backend`` and its own labels only, not empty ones."""

    name: str
    events: tuple[str, ...]
    help: str
    labels: tuple[str, ...] = ()
    per_task: bool = True

    def stored_name(self, event_labels: Mapping[str, Any]) -> str:
        """The name of this counter's row for the labels of one event."""
        if not self.labels:
            return self.name
        pairs = ",".join(
            f"{label}={_LABEL_VALUE_BAD.sub('_', str(event_labels.get(label, '')))}"
            for label in self.labels
        )
        return f"{self.name}{{{pairs}}}"[:METRIC_NAME_MAX_LENGTH]


def split_stored_name(stored: str) -> tuple[str, dict[str, str]]:
    """``"schedule_fired{schedule=nightly}"`` -> ``("schedule_fired", {"schedule": "nightly"})``."""
    name, brace, rest = stored.partition("{")
    if not brace:
        return stored, {}
    labels = dict(pair.partition("=")[::2] for pair in rest.rstrip("}").split(",") if pair)
    return name, labels


class FeatureCounters:
    """The registry of the features' counters, with an explicit ``reset``. The app owns
    the one in use (``feature_counters()``: its ``AppConfig.feature_counters``)."""

    def __init__(self) -> None:
        self.counters: dict[str, FeatureCounter] = {}
        self.by_event: dict[str, tuple[FeatureCounter, ...]] = {}
        self.builtin: dict[str, FeatureCounter] = {}

    def register(self, counter: FeatureCounter, *, builtin: bool = False) -> FeatureCounter:
        """Add ``counter``; its events must be known (``events.register_names``).
        ``builtin=True``: a feature of the app (``AppConfig.ready``), kept by ``reset()``."""
        if not _COUNTER_NAME.fullmatch(counter.name) or counter.name in COUNTERS:
            raise ValueError(
                f"A feature counter's name is lowercase letters, digits and '_' (at most 60) "
                f"and not a built-in counter's, got {counter.name!r}."
            )
        known = self.counters.get(counter.name)
        if known is not None and known != counter:
            raise ValueError(f"A different counter named {counter.name!r} is registered.")
        events.bus().checked(counter.events or ("",))  # raises ValueError naming the unknown
        self.counters[counter.name] = counter
        if builtin:
            self.builtin[counter.name] = counter
        self._index()
        return counter

    def _index(self) -> None:
        by_event: dict[str, tuple[FeatureCounter, ...]] = {}
        for registered in self.counters.values():
            for name in registered.events:
                by_event[name] = (*by_event.get(name, ()), registered)
        self.by_event = by_event

    def reset(self) -> None:
        """Back to the app's own counters (tests)."""
        self.counters = dict(self.builtin)
        self._index()


def feature_counters() -> FeatureCounters:
    """The app's registry of the features' counters (owned by the installed app)."""
    return cast(FeatureCounters, app().feature_counters)
