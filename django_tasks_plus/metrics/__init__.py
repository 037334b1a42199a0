"""Metrics: counters and histograms from the lifecycle events, per queue and task path,
kept per minute in the database so that every process sees the whole fleet.

- ``aggregate``: the process's aggregator (an events subscriber owned by the app:
  ``aggregator()``) and its flushes;
- ``catalog``: what is counted, the fixed histogram buckets, the stored names, and the
  registry of the features' own counters (``register_counter``);
- ``ranges``: the charts' ranges, their bars, and how points add up into them (pure);
- ``queries``: the read API (gauges, totals, rate series, percentiles, workers) that
  the admin overview, ``taskstats`` and the Prometheus endpoint use;
- ``prometheus``: the text exposition served by ``django_tasks_plus.urls``.

See docs/metrics.md.
"""

from __future__ import annotations

from .aggregate import aggregator, install, register_counter
from .catalog import BUCKETS, COUNTER_NAMES, HISTOGRAM_NAMES, feature_counters
from .queries import (
    Histogram,
    QueueGauge,
    QueueWaiting,
    Total,
    WorkerStatus,
    all_time,
    counter_totals,
    histogram,
    percentiles,
    queue_gauges,
    queue_waiting,
    rate_series,
    series,
    totals,
    workers,
)


def flush() -> int:
    """Write this process's counts now (tests, scripts); returns the rows written."""
    return aggregator().flush()


__all__ = [
    "BUCKETS",
    "COUNTER_NAMES",
    "HISTOGRAM_NAMES",
    "Histogram",
    "QueueGauge",
    "QueueWaiting",
    "Total",
    "WorkerStatus",
    "aggregator",
    "all_time",
    "counter_totals",
    "feature_counters",
    "flush",
    "histogram",
    "install",
    "percentiles",
    "queue_gauges",
    "queue_waiting",
    "rate_series",
    "register_counter",
    "series",
    "totals",
    "workers",
]
