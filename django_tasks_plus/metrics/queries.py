"""The read API that the admin overview, ``taskstats`` and the Prometheus endpoint share.

Counters and histograms come from the per-minute table (fleet-wide: every worker and
web process flushes there) and, for minutes older than ``METRICS["RETENTION_DAYS"]``,
the hourly rows they were summed into; gauges and workers are counted from the task and worker
tables when asked, never stored. Every function takes the ``TASKS`` alias; a window's
``since`` is a datetime or a timedelta back from now, and whole minutes are read (the
current minute is partial, and a process's latest counts arrive with its next flush).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from .. import compat
from ..db import metrics as store
from ..db import waiting as waiting_store
from ..exceptions import InvalidBackendOptions
from ..liveness import is_stale
from ..waiting import Capped, Reason
from .catalog import (
    ALL_TIME,
    BUCKET_NAMES,
    BUCKETS,
    COUNTER_NAMES,
    HISTOGRAM_NAMES,
    LE_LABELS,
    feature_counters,
    split_stored_name,
    sum_name,
)
from .ranges import Window, add_up

Since = datetime | timedelta


@dataclass(frozen=True, slots=True)
class QueueGauge:
    """One queue now. ``ready``: READY and due; ``scheduled``: READY with a future
    ``run_after`` (retries waiting, scheduled and held tasks); ``dead``: FAILED."""

    queue: str
    ready: int
    scheduled: int
    running: int
    dead: int
    oldest_ready_age: float | None  # seconds the longest-waiting runnable task has waited


@dataclass(frozen=True, slots=True)
class Total:
    """One counter summed over a window, for one queue and task path."""

    queue: str
    task_path: str
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observations over a window: per-bucket (not cumulative) counts, ``le`` order."""

    buckets: tuple[int, ...]  # len(BUCKETS) + 1, the last for +Inf
    sum: float  # seconds
    count: int

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, observations <= le)`` as Prometheus writes them, ending with +Inf."""
        running, out = 0, []
        for label, count in zip(LE_LABELS, self.buckets, strict=True):
            running += count
            out.append((label, running))
        return out

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1), interpolated within its bucket as Prometheus'
        ``histogram_quantile`` does; None without observations. Past the last bound
        the answer is that bound (the +Inf bucket has no upper end)."""
        if not self.count:
            return None
        rank = q * self.count
        below = 0
        for i, count in enumerate(self.buckets):
            if count and below + count >= rank:
                if i == len(BUCKETS):
                    return float(BUCKETS[-1])
                lower = 0.0 if i == 0 else float(BUCKETS[i - 1])
                return lower + (float(BUCKETS[i]) - lower) * (rank - below) / count
            below += count
        return float(BUCKETS[-1])


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A registered worker; ``alive`` while its heartbeat is younger than its own
    visibility timeout (``--visibility-timeout``; a heartbeat comes every third of it)."""

    worker_id: str
    hostname: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime
    last_heartbeat_at: datetime
    alive: bool
    visibility_timeout: float


def _settings(backend: str) -> Any:
    settings = getattr(compat.task_backends[backend], "settings", None)
    if not isinstance(getattr(settings, "database", None), str):
        raise InvalidBackendOptions(
            f"Task backend {backend!r} is not django_tasks_plus' DatabaseBackend; it keeps "
            "no metrics."
        )
    return settings


def _since(since: Since, now: datetime) -> datetime:
    start = now - since if isinstance(since, timedelta) else since
    return start.replace(second=0, microsecond=0)


def queue_gauges(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS, *, now: datetime | None = None
) -> list[QueueGauge]:
    """Per queue (the configured ones first, then any other with tasks): counts now.
    ``oldest_ready_age`` counts only a task that could run now: due, and not blocked
    by its ordering key (``db/waiting.oldest_runnable``, a bounded read per level)."""
    settings = _settings(backend)
    now = now or timezone.now()
    found: dict[str, dict[str, Any]] = {
        q: {"ready": 0, "scheduled": 0, "running": 0, "dead": 0, "oldest": None}
        for q in settings.queue_order
    }
    for row in store.queue_counts(settings.database, backend, now):
        entry = found.setdefault(
            row["queue_name"], {"ready": 0, "scheduled": 0, "running": 0, "dead": 0, "oldest": None}
        )
        status = str(row["status"])
        if status == "READY":
            entry["ready"] = row["count"] - row["scheduled"]
            entry["scheduled"] = row["scheduled"]
            if entry["ready"]:
                entry["oldest"], _exact = waiting_store.oldest_runnable(
                    settings.database, backend, row["queue_name"], now
                )
        elif status == "RUNNING":
            entry["running"] = row["count"]
        else:
            entry["dead"] = row["count"]
    return [
        QueueGauge(
            queue=queue,
            ready=e["ready"],
            scheduled=e["scheduled"],
            running=e["running"],
            dead=e["dead"],
            oldest_ready_age=None
            if e["oldest"] is None
            else max(0.0, (now - e["oldest"]).total_seconds()),
        )
        for queue, e in found.items()
    ]


@dataclass(frozen=True, slots=True)
class QueueWaiting:
    """One queue now, its READY tasks split by what they wait for (``waiting.Reason``).

    Each count reads at most ``cap`` index entries (``db/waiting.py``), so past it a
    count is a bound (``Capped``: "10,000+"); ``oldest_runnable_age`` counts only tasks
    that could run now (due, not held, not blocked by their ordering key)."""

    queue: str
    waiting: dict[Reason, Capped]
    running: int
    dead: int
    oldest_runnable_age: float | None
    oldest_exact: bool

    @property
    def ready(self) -> Capped:
        """Every READY task, whatever it waits for."""
        values = self.waiting.values()
        more = any(c.at_least for c in values)
        return Capped(
            sum(c.count for c in values), more, not more and any(c.at_most for c in values)
        )


def queue_waiting(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    *,
    now: datetime | None = None,
    cap: int = waiting_store.COUNT_CAP,
    scan: int = waiting_store.BLOCKED_SCAN,
) -> list[QueueWaiting]:
    """Per queue (configured first, then any other with READY, RUNNING or FAILED tasks):
    what its READY tasks wait for, RUNNING and dead counts. Never a scan of the READY
    rows: two capped reads per queue (``queue_gauges`` counts exactly, for Prometheus)."""
    settings = _settings(backend)
    now = now or timezone.now()
    database = settings.database
    live = store.running_and_dead(database, backend)
    names = list(settings.queue_order)
    for name in [*waiting_store.ready_queues(database, backend), *sorted(live)]:
        if name not in names:
            names.append(name)
    found = []
    for name in names:
        counted = waiting_store.queue_waiting(database, backend, name, now, cap, scan)
        oldest = counted.oldest_runnable
        found.append(
            QueueWaiting(
                queue=name,
                waiting=counted.counts,
                running=live.get(name, {}).get("running", 0),
                dead=live.get(name, {}).get("dead", 0),
                oldest_runnable_age=None
                if oldest is None
                else max(0.0, (now - oldest).total_seconds()),
                oldest_exact=counted.oldest_exact,
            )
        )
    return found


def totals(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    since: Since = timedelta(hours=1),
    *,
    until: datetime | None = None,
    names: Sequence[str] = COUNTER_NAMES,
    now: datetime | None = None,
) -> list[Total]:
    """Each counter per queue and task path over the window (counters that stayed 0 are
    left out)."""
    settings = _settings(backend)
    start = _since(since, now or timezone.now())
    rows = store.sums(settings.database, backend, since=start, until=until, names=names)
    return [
        Total(row["queue_name"], row["task_path"], row["name"], int(row["total"])) for row in rows
    ]


def counter_totals(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    since: Since = timedelta(hours=1),
    *,
    queue: str | None = None,
    now: datetime | None = None,
) -> dict[str, int]:
    """Every counter over the window, summed over queues and tasks (or one queue's)."""
    settings = _settings(backend)
    start = _since(since, now or timezone.now())
    rows = store.sums(
        settings.database,
        backend,
        since=start,
        names=COUNTER_NAMES,
        group_by=("name",),
        queue=queue,
    )
    found = {row["name"]: int(row["total"]) for row in rows}
    return {name: found.get(name, 0) for name in COUNTER_NAMES}


def rate_series(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    name: str = "succeeded",
    since: Since = timedelta(hours=1),
    step: int = 60,
    *,
    queue: str | None = None,
    task_path: str | None = None,
    now: datetime | None = None,
) -> list[tuple[datetime, int]]:
    """``(start of step, count in that step)`` from ``since`` to now, zeros included:
    a chart's points. ``step`` is in seconds, a multiple of 60."""
    if name not in COUNTER_NAMES:
        raise ValueError(f"Unknown counter {name!r}; one of: {', '.join(COUNTER_NAMES)}.")
    if step < 60 or step % 60:
        raise ValueError(f"step must be a whole number of minutes in seconds, got {step!r}.")
    settings = _settings(backend)
    now = now or timezone.now()
    start = _since(since, now)
    rows = store.sums(
        settings.database,
        backend,
        since=start,
        names=(name,),
        group_by=("minute",),
        queue=queue,
        task_path=task_path,
    )
    count = max(1, int((now - start) // timedelta(seconds=step)) + 1)
    bars = Window(start, step, count)
    points = add_up(((row["minute"], int(row["total"])) for row in rows), bars)
    return list(zip(bars.starts(), points, strict=True))


def series(
    backend: str,
    names: Sequence[str],
    bars: Window,
    *,
    queue: str | None = None,
    task_path: str | None = None,
) -> dict[str, list[int]]:
    """Each counter in ``names`` per bar of ``bars`` (``ranges.window``), in one read of
    the window's minutes and hourly rows: a chart's layers."""
    unknown = [name for name in names if name not in COUNTER_NAMES]
    if unknown:
        raise ValueError(f"Unknown counter {unknown[0]!r}; one of: {', '.join(COUNTER_NAMES)}.")
    settings = _settings(backend)
    rows = store.sums(
        settings.database,
        backend,
        since=bars.start,
        names=names,
        group_by=("minute", "name"),
        queue=queue,
        task_path=task_path,
    )
    return {
        name: add_up(
            ((row["minute"], int(row["total"])) for row in rows if row["name"] == name), bars
        )
        for name in names
    }


def histogram(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    kind: str = "run",
    since: Since | None = timedelta(hours=1),
    *,
    queue: str | None = None,
    task_path: str | None = None,
    now: datetime | None = None,
) -> Histogram:
    """The ``"wait"`` or ``"run"`` histogram over the window (``since=None``: all time)."""
    if kind not in HISTOGRAM_NAMES:
        raise ValueError(f"Unknown histogram {kind!r}; one of: {', '.join(HISTOGRAM_NAMES)}.")
    settings = _settings(backend)
    window: dict[str, Any] = (
        {"minute": ALL_TIME} if since is None else {"since": _since(since, now or timezone.now())}
    )
    rows = store.sums(
        settings.database,
        backend,
        names=(*BUCKET_NAMES[kind], sum_name(kind)),
        group_by=("name",),
        queue=queue,
        task_path=task_path,
        **window,
    )
    return _histogram(kind, {row["name"]: int(row["total"]) for row in rows})


def _histogram(kind: str, values: dict[str, int]) -> Histogram:
    buckets = tuple(values.get(name, 0) for name in BUCKET_NAMES[kind])
    return Histogram(buckets, values.get(sum_name(kind), 0) / 1_000_000, sum(buckets))


def percentiles(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    kind: str = "run",
    since: Since = timedelta(hours=1),
    quantiles: Sequence[float] = (0.5, 0.95),
    *,
    queue: str | None = None,
    task_path: str | None = None,
    now: datetime | None = None,
) -> dict[float, float | None]:
    """Quantile -> seconds (None without observations), from the histogram's buckets, so
    an answer is as precise as its bucket (see ``catalog.BUCKETS``)."""
    found = histogram(backend, kind, since, queue=queue, task_path=task_path, now=now)
    return {q: found.quantile(q) for q in quantiles}


def all_time(backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS) -> dict[tuple[str, str], Any]:
    """``(queue, task path) -> {"counters": {...}, "wait": Histogram, "run": Histogram,
    "features": {stored name: total}}``
    since the beginning (what the Prometheus endpoint serves: totals never go down)."""
    settings = _settings(backend)
    rows = store.sums(settings.database, backend, minute=ALL_TIME)
    grouped: dict[tuple[str, str], dict[str, int]] = {}
    for row in rows:
        grouped.setdefault((row["queue_name"], row["task_path"]), {})[row["name"]] = int(
            row["total"]
        )
    out: dict[tuple[str, str], Any] = {}
    for labels, values in grouped.items():
        out[labels] = {
            "counters": {name: values.get(name, 0) for name in COUNTER_NAMES},
            **{kind: _histogram(kind, values) for kind in HISTOGRAM_NAMES},
            # The features' counters, by stored name (with their own labels).
            "features": {
                name: value
                for name, value in values.items()
                if split_stored_name(name)[0] in feature_counters().counters
            },
        }
    return out


def workers(
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS, *, now: datetime | None = None
) -> list[WorkerStatus]:
    """The backend's registered workers, oldest first, each alive or stale."""
    settings = _settings(backend)
    now = now or timezone.now()
    return [
        WorkerStatus(
            worker_id=row.worker_id,
            hostname=row.hostname,
            pid=row.pid,
            queues=tuple(row.queues or ()),
            concurrency=row.concurrency,
            started_at=row.started_at,
            last_heartbeat_at=row.last_heartbeat_at,
            alive=not is_stale(row.last_heartbeat_at, now, row.visibility_timeout),
            visibility_timeout=row.visibility_timeout,
        )
        for row in store.worker_rows(settings.database, backend)
    ]


__all__ = [
    "Histogram",
    "QueueGauge",
    "QueueWaiting",
    "Total",
    "WorkerStatus",
    "all_time",
    "counter_totals",
    "histogram",
    "percentiles",
    "queue_gauges",
    "queue_waiting",
    "rate_series",
    "series",
    "totals",
    "workers",
]
