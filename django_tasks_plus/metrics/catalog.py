"""What is counted and measured: counter names, the events they count, the fixed
histogram buckets, and how each number is named in the metrics table.

Pure definitions, shared by the aggregator (which fills them), the queries (which read
them back) and the Prometheus endpoint (which names them).
"""

from __future__ import annotations

from datetime import UTC, datetime

from .. import events

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
