"""Column sizes that the tables and the validators share (pure: no Django imports).

The models declare their columns with these numbers and ``conf``, ``definition`` and
``runtasks`` check input against the same ones, so a limit is changed in one place and a
value that passes validation always fits its column.
"""

from __future__ import annotations

TASK_PATH_MAX_LENGTH = 255
"""A task's dotted module path (``TaskRecord.task_path``)."""

KEY_MAX_LENGTH = 255
"""An ordering key, a dedup key, or a breaker key (with its breaker's name)."""

BREAKER_NAME_MAX_LENGTH = 50
"""A circuit breaker's name (``Breaker(name=...)``)."""

QUEUE_NAME_MAX_LENGTH = 100
"""A queue name; backend aliases are stored in columns of the same size."""

WORKER_ID_MAX_LENGTH = 64
"""A worker's id (``WorkerRecord.worker_id``), including any ``--processes`` suffix."""

METADATA_KEY_MAX_LENGTH = 100
"""A task metadata key (``metadata.register_key``)."""

METADATA_MAX_BYTES = 64 * 1024
"""A task's encoded metadata, in bytes of UTF-8 JSON: features keep small per-call data
there (ids, a trace context), never payloads."""

METRIC_NAME_MAX_LENGTH = 200
"""A stored metric's name (``MetricRecord.name``): a counter, bucket or sum, plus a
feature counter's own labels (``schedule_fired{schedule=nightly}``)."""

# A schedule's name (the schedules feature's table; also the hash id of its H fields).
SCHEDULE_NAME_MAX_LENGTH = 200
