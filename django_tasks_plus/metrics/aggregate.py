"""The process's aggregator: events in, per-minute rows out.

The app owns the one in use (``aggregator()``: its ``AppConfig.aggregator``), which
subscribes it to the events (``install()``) and flushes it when the process exits.

Every process that emits events (web processes enqueue, workers run) adds them up here,
in memory. A handler runs on the emitting thread (a task's, the outcome writer's), so it
only appends one tuple to a deque, which is thread-safe without a lock; the tuples are
folded into per-minute counts when they are taken for a flush, or when many have
piled up. ``flush()`` moves what was counted to the metrics table in one upsert.

Who flushes: in a worker, its ``tasks-metrics-flusher`` service every ``FLUSH_INTERVAL``
seconds and once more when it stops (it ``claim()``\\ s the aggregator while it runs).
Anywhere else (web processes, shells), the enqueue-side event that finds the last flush
``FLUSH_INTERVAL`` seconds old flushes synchronously on its own thread, right after the
enqueuing commit; an ``atexit`` hook flushes what is left when the process exits.

A flush lands exactly once. Its counts are one batch under a fresh key (a uuid), written
in one transaction with the key (``db.metrics.land_flush``). A flush that was rolled
back puts its counts back for the next one; one whose COMMIT failed (the server may
have committed it) keeps the batch under its key and sends it again with every later
flush until one succeeds, when a stored key makes it add nothing. Either way a warning
is logged; counts that cannot be written at exit are logged as an error with their
number. Only a process killed outright loses what it counted since its last flush.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .. import events
from ..conf import BackendSettings, MetricsSettings, metrics_settings
from ..db.metrics import FlushFailed, Row, land_flush
from ..exceptions import InvalidBackendOptions
from ..registries import app, installed_app
from .catalog import (
    ALL_TIME,
    BUCKET_NAMES,
    BUCKETS,
    COUNTER_NAMES,
    COUNTER_OF_EVENT,
    HISTOGRAM_NAMES,
    FeatureCounter,
    feature_counters,
    sum_name,
)

logger = logging.getLogger("django_tasks_plus.metrics")

# The layout of one pending entry (a list): the counters, then each histogram's buckets
# (len(BUCKETS) + 1 for +Inf) followed by its sum in seconds.
_COUNTER_INDEX = {name: i for i, name in enumerate(COUNTER_NAMES)}
_SLOTS = len(BUCKETS) + 1
_HIST_BASE = {name: len(COUNTER_NAMES) + i * (_SLOTS + 1) for i, name in enumerate(HISTOGRAM_NAMES)}
_WIDTH = len(COUNTER_NAMES) + len(HISTOGRAM_NAMES) * (_SLOTS + 1)
_WAIT = _HIST_BASE["wait"]
_RUN = _HIST_BASE["run"]
_STARTED = _COUNTER_INDEX["started"]

# Emitted in the enqueuing process (web): these may trigger a flush on emit.
ENQUEUE_SIDE = frozenset(
    {
        events.TASK_ENQUEUED,
        events.TASK_DEDUPLICATED,
        events.TASK_CANCELLED,
        events.TASK_REDRIVEN,
        events.TASK_DISCARDED,
    }
)
# Outcomes that carry the attempt's ``run_time``.
_TIMED = frozenset({events.TASK_SUCCEEDED, events.TASK_ATTEMPT_FAILED, events.TASK_DEFERRED})

Key = tuple[int, str, str, str]  # epoch minute, backend, queue, task path
Batch = dict[Key, list[Any]]  # one flush's counts of one backend
# One raw observation: (kind, counter index, time, backend, queue, task path, number).
# kind COUNT: number is how many; STARTED: number is the wait in seconds; OUTCOME: number
# is the run time in seconds, or None (the reaper's outcomes have none); FEATURE: a
# feature's counter, whose stored name (with its labels) takes the index's place.
Raw = tuple[int, Any, float, Any, Any, Any, Any]
COUNT, STARTED, OUTCOME, FEATURE = range(4)
# An entry's last slot: the feature counters' {stored name: count}, or None.
_FEATURES = _WIDTH
# Fold the raw observations in once this many are waiting (about 150 bytes each with
# their floats). A fold costs the same per observation whenever it runs; a long buffer
# only raised a busy worker's memory for good: with 50,000 waiting, Python's allocator
# kept about 8 MB per worker process after they were folded (docs/performance.md).
FOLD_AT = 2_000


@dataclass(frozen=True)
class Target:
    """Where one backend's metrics go."""

    alias: str
    database: str
    metrics: MetricsSettings


class Aggregator:
    """Counts and histogram buckets per (minute, backend, queue, task path)."""

    def __init__(self) -> None:
        self.raw: deque[Raw] = deque()
        self.lock = threading.Lock()  # guards ``pending`` (folding, taking, putting back)
        self.pending: dict[Key, list[Any]] = {}
        self.targets: dict[str, Target] = {}  # enabled backends only
        self.flush_interval = 10.0  # the shortest of the enabled backends'
        self.last_flush = time.monotonic()
        self.claimed_by = 0  # running worker flushers: emit-time flushes are off
        self._flushing = threading.Lock()  # also guards ``unsettled``
        # Per backend: batches whose COMMIT failed, by flush key. Each may have landed;
        # each is sent again under its own key until a flush succeeds.
        self.unsettled: dict[str, dict[str, Batch]] = {}

    def reset(self) -> None:
        """Forget everything counted and not written (pending, raw and unsettled), and
        start as if it had just flushed: an enqueue-side event then flushes only once
        ``flush_interval`` has passed (tests: ``registries.reset()`` calls this)."""
        with self._flushing:
            self.take()
            self.unsettled.clear()
            self.last_flush = time.monotonic()

    # -- events in (hot: one append each) ------------------------------------------------

    def on_count(self, event: events.Event) -> None:
        """A counted event; its ``count`` measurement (if any) says how many."""
        labels = event.labels
        self.raw.append(
            (
                COUNT,
                _COUNTER_INDEX[COUNTER_OF_EVENT[event.name]],
                event.time,
                labels.get("backend"),
                labels.get("queue"),
                labels.get("task_path"),
                int(event.measurements.get("count", 1)),
            )
        )
        if event.name in ENQUEUE_SIDE and not self.claimed_by:
            self.flush_if_due()
        if len(self.raw) >= FOLD_AT:  # also between a web process's flushes
            self.fold()

    def on_started(self, event: events.Event) -> None:
        """``task.started``: counted, and its ``queue_time`` observed as wait."""
        labels = event.labels
        wait = event.measurements.get("queue_time", 0.0)
        self.raw.append(
            (
                STARTED,
                _STARTED,
                event.time,
                labels["backend"],
                labels["queue"],
                labels["task_path"],
                wait,
            )
        )
        if len(self.raw) >= FOLD_AT:
            self.fold()

    def on_outcome(self, event: events.Event) -> None:
        """An outcome: counted, and its ``run_time`` (absent from the reaper) observed."""
        labels = event.labels
        self.raw.append(
            (
                OUTCOME,
                _COUNTER_INDEX[COUNTER_OF_EVENT[event.name]],
                event.time,
                labels["backend"],
                labels["queue"],
                labels["task_path"],
                event.measurements.get("run_time"),
            )
        )
        if len(self.raw) >= FOLD_AT:
            self.fold()

    def on_feature(self, event: events.Event) -> None:
        """An event a feature's counter counts (``catalog.feature_counters()``)."""
        labels = event.labels
        number = int(event.measurements.get("count", 1))
        for counter in feature_counters().by_event.get(event.name, ()):
            self.raw.append(
                (
                    FEATURE,
                    counter.stored_name(labels),
                    event.time,
                    labels.get("backend"),
                    labels.get("queue"),
                    labels.get("task_path"),
                    number,
                )
            )
        if len(self.raw) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Add the raw observations up into ``pending`` (per minute and labels)."""
        with self.lock:
            raw, pending, targets = self.raw, self.pending, self.targets
            while raw:
                try:
                    kind, index, at, backend, queue, task_path, number = raw.popleft()
                except IndexError:  # emptied meanwhile (only one folder holds the lock)
                    break
                if backend not in targets:
                    continue
                key = (int(at // 60), backend, queue or "", task_path or "")
                entry = pending.get(key)
                if entry is None:
                    entry = pending[key] = [0] * _WIDTH + [None]
                if kind == FEATURE:
                    extra = entry[_FEATURES]
                    if extra is None:
                        extra = entry[_FEATURES] = {}
                    extra[index] = extra.get(index, 0) + number
                    continue
                if kind == COUNT:
                    entry[index] += number
                    continue
                entry[index] += 1
                if number is None:
                    continue
                base = _WAIT if kind == STARTED else _RUN
                entry[base + bisect_left(BUCKETS, number)] += 1
                entry[base + _SLOTS] += number

    # -- rows out ------------------------------------------------------------------------

    def take(self) -> dict[Key, list[Any]]:
        """Everything counted so far; the aggregator starts again from zero."""
        self.fold()
        with self.lock:
            pending, self.pending = self.pending, {}
        return pending

    def put_back(self, pending: Mapping[Key, list[Any]]) -> None:
        """Add counts a flush could not write back in, for the next flush."""
        with self.lock:
            for key, values in pending.items():
                entry = self.pending.get(key)
                if entry is None:
                    self.pending[key] = [*values[:_FEATURES], _copy(values[_FEATURES])]
                    continue
                for i in range(_FEATURES):
                    entry[i] += values[i]
                if values[_FEATURES]:
                    extra = entry[_FEATURES] = entry[_FEATURES] or {}
                    for name, count in values[_FEATURES].items():
                        extra[name] = extra.get(name, 0) + count

    def flush_if_due(self) -> None:
        """The emit-time flush of processes without a worker flusher (see the module)."""
        if time.monotonic() - self.last_flush < self.flush_interval:
            return
        self.flush(in_request=True)

    def flush(self, *, in_request: bool = False) -> int:
        """Write what was counted, one transaction per backend; returns the rows written.

        A database whose connection on this thread is inside a transaction is skipped (its
        counts wait for the next flush): a flush inside another transaction would share
        that transaction's fate. ``in_request``: give up at once if another thread is
        flushing (the emit-time flush must not make a request wait)."""
        if not self._flushing.acquire(blocking=not in_request):
            return 0  # another thread is flushing right now
        try:
            self.last_flush = time.monotonic()
            pending = _by_backend(self.take())
            written = 0
            for alias in sorted(pending.keys() | self.unsettled.keys()):
                target = self.targets.get(alias)
                if target is None:  # metrics were turned off for it since
                    self.unsettled.pop(alias, None)
                    continue
                fresh = pending.get(alias, {})
                if connections[target.database].in_atomic_block:
                    self.put_back(fresh)
                    continue
                written += self._land(target, fresh)
            return written
        finally:
            self._flushing.release()

    def _land(self, target: Target, fresh: Batch) -> int:
        """Send one backend's unsettled batches and ``fresh`` (under a new key) in one
        transaction; keep what may have landed under its key, put the rest back."""
        batches = dict(self.unsettled.get(target.alias, {}))
        if fresh:
            batches[uuid.uuid4().hex] = fresh
        if not batches:
            return 0
        rows = {key: rows_for(target.alias, batch) for key, batch in batches.items()}
        try:
            written = land_flush(target.database, target.alias, rows)
        except FlushFailed as exc:
            if exc.may_have_landed:
                self.unsettled[target.alias] = batches
            else:
                self.put_back(fresh)
            logger.warning(
                "Could not write the metrics of backend %r (%s); they are kept for the next "
                "flush%s.",
                target.alias,
                exc,
                " (under their flush key: the commit's outcome is unknown)"
                if exc.may_have_landed
                else "",
            )
            return 0
        self.unsettled.pop(target.alias, None)
        return written

    def flush_at_exit(self) -> None:
        """The last flush of a process; says how much was lost if it fails."""
        if not self.pending and not self.raw and not self.unsettled:
            return
        try:
            self.flush()
        except Exception:
            logger.exception("Could not write the metrics at exit.")
        lost = _events_in(self.pending.values())
        if lost:
            logger.error("Process exiting: %d counted task events were never written.", lost)
        unknown = _events_in(
            entry
            for batches in self.unsettled.values()
            for b in batches.values()
            for entry in b.values()
        )
        if unknown:
            logger.error(
                "Process exiting: %d counted task events may not have been written (their "
                "flush's commit failed).",
                unknown,
            )

    # -- who flushes ---------------------------------------------------------------------

    def claim(self) -> None:
        """A worker flusher runs: it flushes, enqueue-side events no longer do."""
        with self.lock:
            self.claimed_by += 1

    def release(self) -> None:
        with self.lock:
            self.claimed_by = max(0, self.claimed_by - 1)

    @property
    def databases(self) -> set[str]:
        return {target.database for target in self.targets.values()}


def _events_in(entries: Iterable[list[Any]]) -> int:
    return sum(sum(values[: len(COUNTER_NAMES)]) for values in entries)


def _by_backend(pending: Mapping[Key, list[Any]]) -> dict[str, Batch]:
    grouped: dict[str, Batch] = {}
    for key, values in pending.items():
        grouped.setdefault(key[1], {})[key] = values
    return grouped


def rows_for(alias: str, entries: Mapping[Key, list[Any]]) -> list[Row]:
    """The table rows of one backend's entries: each non-zero number of each minute, and
    the same added to its all-time row (one row per key: the upsert needs that)."""
    minutes: list[Row] = []
    totals: dict[tuple[str, str, str], int] = {}
    for (minute, _backend, queue, task_path), values in entries.items():
        at = datetime.fromtimestamp(minute * 60, UTC)
        for name, value in _numbers(values):
            minutes.append((alias, at, queue, task_path, name, value))
            totals[(queue, task_path, name)] = totals.get((queue, task_path, name), 0) + value
    return minutes + [
        (alias, ALL_TIME, queue, task_path, name, value)
        for (queue, task_path, name), value in totals.items()
    ]


def _numbers(values: list[Any]) -> Iterator[tuple[str, int]]:
    for name, index in _COUNTER_INDEX.items():
        if values[index]:
            yield name, values[index]
    for histogram, base in _HIST_BASE.items():
        for i, name in enumerate(BUCKET_NAMES[histogram]):
            if values[base + i]:
                yield name, values[base + i]
        seconds = values[base + _SLOTS]
        if seconds:
            yield sum_name(histogram), round(seconds * 1_000_000)
    if values[_FEATURES]:
        yield from values[_FEATURES].items()


def _copy(extra: dict[str, int] | None) -> dict[str, int] | None:
    return dict(extra) if extra else None


def aggregator() -> Aggregator:
    """The app's aggregator (owned by the installed app, ``apps.TasksPlusConfig``)."""
    return cast(Aggregator, app().aggregator)


def enabled_targets(tasks: Mapping[str, Any] | None = None) -> dict[str, Target]:
    """The ``TASKS`` entries that are django-tasks-plus backends with metrics on.

    Read from the settings without creating the backends; an entry whose ``METRICS`` is
    invalid is left out here (its backend raises the error when it is first used)."""
    from ..backend import DatabaseBackend

    found = {}
    for alias, params in (tasks if tasks is not None else getattr(settings, "TASKS", {})).items():
        try:
            backend_class = import_string(params.get("BACKEND", ""))
        except ImportError:
            continue
        if not (isinstance(backend_class, type) and issubclass(backend_class, DatabaseBackend)):
            continue
        options = params.get("OPTIONS") or {}
        try:
            metrics = metrics_settings(alias, options.get("METRICS", {}))
        except InvalidBackendOptions:
            continue
        if metrics.enabled:
            found[alias] = Target(alias, options.get("DATABASE", BackendSettings.database), metrics)
    return found


# The events the aggregator subscribes to, with the handler of each.
def _handlers(aggregator: Aggregator) -> dict[str, events.Handler]:
    table: dict[str, events.Handler] = dict.fromkeys(COUNTER_OF_EVENT, aggregator.on_count)
    table[events.TASK_STARTED] = aggregator.on_started
    for name in _TIMED:
        table[name] = aggregator.on_outcome
    for name in (events.TASK_RETRY_SCHEDULED, events.TASK_DEAD_LETTERED):
        table[name] = aggregator.on_outcome  # worker-side, never flush on emit
    return table


def _feature_handlers(aggregator: Aggregator) -> dict[str, events.Handler]:
    return dict.fromkeys(feature_counters().by_event, aggregator.on_feature)


def register_counter(
    name: str,
    *event_names: str,
    help: str,
    labels: tuple[str, ...] | list[str] = (),
    per_task: bool = True,
    builtin: bool = False,
) -> FeatureCounter:
    """Count a feature's events: ``name`` (stored per minute and all-time, served to
    Prometheus as ``django_tasks_plus_<name>``) adds each event's ``count`` measurement,
    else one, per backend, queue, task path and the event labels named in ``labels``
    (``per_task=False``: events without a queue or task, served without those labels).
    The events must be registered first (``events.register_names``). Call it when the
    feature starts (its ``AppConfig.ready``); ``builtin=True`` for the app's own
    features, whose counters a test's ``registries.reset()`` keeps."""
    counter = feature_counters().register(
        FeatureCounter(name, tuple(event_names), help, tuple(labels), per_task),
        builtin=builtin,
    )
    counting = aggregator()
    if counting.targets:  # subscribed already: count the new events too
        for event_name in counter.events:
            events.subscribe(counting.on_feature, event_name)
    return counter


def install(tasks: Mapping[str, Any] | None = None) -> bool:
    """Subscribe the aggregator when a backend has metrics on, unsubscribe it when none
    has (then no event is even built for it). Called at startup and when ``TASKS``
    changes; returns whether it is subscribed. Nothing to do when the app is not
    installed (a test's ``override_settings(INSTALLED_APPS=...)`` without it)."""
    config = installed_app()
    if config is None:
        return False
    counting = cast(Aggregator, config.aggregator)
    targets = enabled_targets(tasks)
    counting.targets = targets
    handlers = _handlers(counting)
    for name, handler in [*handlers.items(), *_feature_handlers(counting).items()]:
        events.unsubscribe(handler, name)
    if not targets:
        return False
    counting.flush_interval = min(t.metrics.flush_interval for t in targets.values())
    for name, handler in [*handlers.items(), *_feature_handlers(counting).items()]:
        events.subscribe(handler, name)
    return True


@receiver(setting_changed)
def _tasks_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKS":
        install()
