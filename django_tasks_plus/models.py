"""The tables: one row per task (its envelope and state) and one row per running worker.

The database is the source of truth. Only ``backend`` (enqueue) and ``db`` / ``worker``
(claim, complete, renew, reap) write task rows; everything else reads them.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .compat import TaskResultStatus
from .limits import (
    BREAKER_NAME_MAX_LENGTH,
    KEY_MAX_LENGTH,
    METRIC_NAME_MAX_LENGTH,
    QUEUE_NAME_MAX_LENGTH,
    SCHEDULE_NAME_MAX_LENGTH,
    TASK_PATH_MAX_LENGTH,
    WORKER_ID_MAX_LENGTH,
)


class TaskRecord(models.Model):
    """A task's envelope (what to run, with what) and state (where it is in its life)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    task_path = models.CharField(_("task path"), max_length=TASK_PATH_MAX_LENGTH)
    backend_name = models.CharField(
        _("backend"), max_length=QUEUE_NAME_MAX_LENGTH, default="default"
    )
    queue_name = models.CharField(_("queue"), max_length=QUEUE_NAME_MAX_LENGTH, default="default")
    priority = models.SmallIntegerField(_("priority"), default=0)
    args = models.JSONField(_("args"), default=list, blank=True)
    kwargs = models.JSONField(_("kwargs"), default=dict, blank=True)

    status = models.CharField(
        _("status"), max_length=10, choices=TaskResultStatus.choices, default=TaskResultStatus.READY
    )
    run_after = models.DateTimeField(
        _("run after"), help_text=_("The earliest time the next attempt may start.")
    )
    # Django's TaskResult shows the run_after the caller gave; run_after above is moved by
    # retries and deferrals, and holds the enqueue time when none was given.
    requested_run_after = models.DateTimeField(
        _("requested run after"),
        null=True,
        blank=True,
        help_text=_("The run_after given at enqueue; empty means as soon as possible."),
    )
    attempt = models.PositiveIntegerField(
        _("attempts"), default=0, help_text=_("Attempts started so far (deferrals excluded).")
    )
    lease_token = models.CharField(_("lease token"), max_length=32, null=True, blank=True)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    worker_ids = models.JSONField(_("worker ids"), default=list, blank=True)

    enqueued_at = models.DateTimeField(_("enqueued at"))
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    last_attempted_at = models.DateTimeField(_("last attempted at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    return_value = models.JSONField(_("return value"), null=True, blank=True)
    errors = models.JSONField(_("errors"), default=list, blank=True)
    dead_letter_reason = models.TextField(_("dead-letter reason"), blank=True, default="")

    ordering_key = models.CharField(
        _("ordering key"),
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text=_("Tasks sharing a key run one at a time, in enqueue order."),
    )
    sequence = models.BigIntegerField(
        _("sequence"), null=True, blank=True, help_text=_("Enqueue order, for ordering keys.")
    )
    ordering_blocked = models.BooleanField(
        _("blocks its ordering key"),
        default=False,
        help_text=_("Dead-lettered under ordering_failure='block': later tasks of the key wait."),
    )
    dedup_key = models.CharField(_("dedup key"), max_length=KEY_MAX_LENGTH, null=True, blank=True)
    cancel_requested = models.BooleanField(_("cancel requested"), default=False)
    breaker_key = models.CharField(
        _("breaker key"),
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text=_("The circuit breaker guarding this task: the breaker's name/the key."),
    )
    held_since = models.DateTimeField(
        _("held since"),
        null=True,
        blank=True,
        help_text=_("When a middleware (a circuit breaker) first held the task back."),
    )
    # Features' per-call data (docs/tasks.md#metadata): an open map, not a column each.
    metadata = models.JSONField(
        _("metadata"),
        default=dict,
        blank=True,
        help_text=_("Data features keep about this task (tenant, trace context, group…)."),
    )

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        # The admin's operating actions, each granted on its own (see admin.py).
        permissions = [
            ("redrive_taskrecord", _("Can redrive dead-lettered tasks")),
            ("cancel_taskrecord", _("Can cancel tasks")),
            ("discard_taskrecord", _("Can release ordering keys held by dead tasks")),
            ("run_now_taskrecord", _("Can run waiting tasks now")),
        ]
        indexes = [
            # The claim's index: READY tasks by backend and queue, then in claim order, so a
            # claim probes each served queue's priority levels and reads only the due rows at
            # the front of each (sql.CLAIM_LEVELS), never other queues' or later tasks.
            models.Index(
                fields=["backend_name", "queue_name", "-priority", "run_after", "id"],
                condition=Q(status="READY"),
                name="dtp_task_claim_idx",
            ),
            # The reaper looks only at running tasks whose lease ran out.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="RUNNING"),
                name="dtp_task_lease_idx",
            ),
            # The dead letters per queue (the ``dead`` gauge, the dead-letter list). Only
            # FAILED rows enter it: an index over every row (the ``(status, queue_name)``
            # one before 0020) took an entry for each version of every task, three per
            # task that succeeds, on the drain's hottest path. READY and RUNNING tasks
            # are counted through the claim's and the lease's indexes.
            models.Index(
                fields=["backend_name", "queue_name"],
                condition=Q(status="FAILED"),
                name="dtp_task_dead_idx",
            ),
            # The admin's task list, newest first, a page at a time without a sort.
            models.Index(fields=["-enqueued_at", "-id"], name="dtp_task_enqueued_idx"),
            # Finding the head of an ordering key: earlier tasks of the same key.
            models.Index(
                fields=["ordering_key", "sequence"],
                condition=Q(ordering_key__isnull=False),
                name="dtp_task_ordering_idx",
            ),
            # The pruner deletes finished tasks of one status, oldest first, a batch at a
            # time (worker/pruner.py), without walking the unfinished ones.
            models.Index(
                fields=["backend_name", "status", "finished_at"],
                condition=Q(finished_at__isnull=False),
                name="dtp_task_finished_idx",
            ),
            # What READY tasks wait for (db/waiting.py), counted per queue without reading
            # the rest of the queue: the held ones and the retries. A new task enters
            # neither (it has no attempt yet and is not held), so enqueue pays nothing.
            models.Index(
                fields=["backend_name", "queue_name", "run_after"],
                condition=Q(status="READY", held_since__isnull=False),
                name="dtp_task_held_idx",
            ),
            models.Index(
                fields=["backend_name", "queue_name", "run_after"],
                condition=Q(status="READY", attempt__gt=0, held_since__isnull=True),
                name="dtp_task_retry_idx",
            ),
            # A circuit breaker holds or releases the waiting tasks of one key at once.
            models.Index(
                fields=["backend_name", "breaker_key"],
                condition=Q(status="READY", breaker_key__isnull=False),
                name="dtp_task_breaker_idx",
            ),
        ]
        constraints = [
            # The database itself refuses a second running task for one ordering key.
            # Only keyed tasks: an unkeyed running task would add an entry (and its WAL)
            # at every claim that nothing ever looks up.
            models.UniqueConstraint(
                fields=["backend_name", "ordering_key"],
                condition=Q(status="RUNNING", ordering_key__isnull=False),
                name="dtp_task_one_running_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} [{self.status}] {self.id}"


class DedupKey(models.Model):
    """A deduplication key held by the task(s) it admitted, until it expires.

    Taken with ``INSERT … ON CONFLICT DO NOTHING`` in the enqueuing transaction, so the
    unique constraint decides races and a rollback releases the key.
    """

    backend_name = models.CharField(_("backend"), max_length=QUEUE_NAME_MAX_LENGTH)
    key = models.CharField(_("key"), max_length=KEY_MAX_LENGTH)
    task_ids = models.JSONField(_("task ids"), default=list)
    expires_at = models.DateTimeField(_("expires at"))
    until_finished = models.BooleanField(
        _("until finished"),
        default=False,
        help_text=_("Released as soon as every task it admitted has finished."),
    )
    created_at = models.DateTimeField(_("created at"))

    class Meta:
        verbose_name = _("dedup key")
        verbose_name_plural = _("dedup keys")
        constraints = [
            models.UniqueConstraint(fields=["backend_name", "key"], name="dtp_dedup_unique_key"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="dtp_dedup_expiry_idx")]

    def __str__(self) -> str:
        return self.key


# The visibility timeout of a worker row written before workers stored their own (the
# default of OPTIONS["VISIBILITY_TIMEOUT"]).
DEFAULT_WORKER_VISIBILITY_TIMEOUT = 60.0


class WorkerRecord(models.Model):
    """A running ``runtasks`` process, kept alive by its heartbeat.

    ``visibility_timeout`` is the worker's own (``--visibility-timeout`` may differ from
    the backend's and from other workers'): it beats every third of it, so its silence is
    judged by it (alive or stale, and when the leader may delete the row). A worker whose
    row was deleted all the same inserts it again on its next heartbeat. The counters and
    ``leader_since`` are as of the last heartbeat.
    """

    worker_id = models.CharField(_("worker id"), max_length=WORKER_ID_MAX_LENGTH, primary_key=True)
    backend_name = models.CharField(_("backend"), max_length=QUEUE_NAME_MAX_LENGTH)
    hostname = models.CharField(_("hostname"), max_length=255)
    pid = models.PositiveIntegerField(_("process id"))
    queues = models.JSONField(_("queues"), default=list)
    concurrency = models.PositiveIntegerField(_("concurrency"))
    started_at = models.DateTimeField(_("started at"))
    last_heartbeat_at = models.DateTimeField(_("last heartbeat at"))
    visibility_timeout = models.FloatField(
        _("visibility timeout"),
        default=DEFAULT_WORKER_VISIBILITY_TIMEOUT,
        db_default=DEFAULT_WORKER_VISIBILITY_TIMEOUT,
        help_text=_("Seconds; the worker's heartbeat comes every third of it."),
    )
    # Written at registration (version) and by each heartbeat, in the UPDATE that touches
    # last_heartbeat_at: no write of their own. db_default keeps adding them cheap.
    version = models.CharField(
        _("version"),
        max_length=40,
        blank=True,
        default="",
        db_default="",
        help_text=_("The django-tasks-plus version the worker runs; empty if unknown."),
    )
    tasks_processed = models.PositiveBigIntegerField(
        _("processed"),
        default=0,
        db_default=0,
        help_text=_("Attempts this worker finished since it started: succeeded or failed."),
    )
    tasks_failed = models.PositiveBigIntegerField(
        _("failed"),
        default=0,
        db_default=0,
        help_text=_("Of those, the attempts that failed (retry scheduled or dead-lettered)."),
    )
    leader_since = models.DateTimeField(
        _("leader since"),
        null=True,
        blank=True,
        help_text=_("When it became the leader of its backend; empty while a follower."),
    )

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.worker_id


class Leadership(models.Model):
    """Who leads the workers of one backend, on databases without advisory locks.

    The leader renews ``expires_at`` (by the database's clock) while it lives; any worker
    may take the row over once it has expired. PostgreSQL uses an advisory lock instead
    and leaves this table empty (see ``db/leadership.py``).
    """

    backend_name = models.CharField(
        _("backend"), max_length=QUEUE_NAME_MAX_LENGTH, primary_key=True
    )
    holder = models.CharField(_("leader"), max_length=WORKER_ID_MAX_LENGTH)
    expires_at = models.DateTimeField(_("expires at"))

    class Meta:
        verbose_name = _("leadership")
        verbose_name_plural = _("leaderships")

    def __str__(self) -> str:
        return f"{self.backend_name}: {self.holder}"


class BreakerRecord(models.Model):
    """The circuit of one breaker key (a remote host), shared by every worker.

    Changed only under a row lock (``db/breakers.py``); read and validated by
    ``breaker.parse_circuit``, so a corrupt row is treated as closed, never trusted.
    """

    backend_name = models.CharField(_("backend"), max_length=QUEUE_NAME_MAX_LENGTH)
    name = models.CharField(_("breaker"), max_length=BREAKER_NAME_MAX_LENGTH)
    key = models.CharField(_("key"), max_length=KEY_MAX_LENGTH)
    state = models.CharField(_("state"), max_length=10, default="closed")
    failures = models.TextField(
        _("failures"), default="[]", help_text=_("Times of the failures remembered (JSON).")
    )
    opened_at = models.DateTimeField(_("opened at"), null=True, blank=True)
    probe_task_id = models.CharField(_("probe task"), max_length=36, null=True, blank=True)
    probe_started_at = models.DateTimeField(_("probe started at"), null=True, blank=True)
    parked_until = models.DateTimeField(
        _("tasks held until"),
        null=True,
        blank=True,
        help_text=_("The key's waiting tasks were held until this time in one statement."),
    )
    updated_at = models.DateTimeField(_("updated at"))

    class Meta:
        verbose_name = _("circuit breaker")
        verbose_name_plural = _("circuit breakers")
        constraints = [
            models.UniqueConstraint(
                fields=["backend_name", "name", "key"], name="dtp_breaker_unique_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}/{self.key} [{self.state}]"


class _MetricRow(models.Model):
    """The columns a stored metric number has at every resolution (minute, hour): the
    backend, queue and task path it counts for, its name and its value."""

    backend_name = models.CharField(_("backend"), max_length=QUEUE_NAME_MAX_LENGTH)
    queue_name = models.CharField(_("queue"), max_length=QUEUE_NAME_MAX_LENGTH)
    task_path = models.CharField(_("task path"), max_length=TASK_PATH_MAX_LENGTH)
    name = models.CharField(_("metric"), max_length=METRIC_NAME_MAX_LENGTH)
    value = models.BigIntegerField(_("value"), default=0)

    class Meta:
        abstract = True


class MetricRecord(_MetricRow):
    """One number of one minute: a counter, or one histogram bucket or sum, per backend,
    queue and task path (``metrics/``).

    Workers add to these rows in one upsert per flush, never one write per task. The row
    whose ``minute`` is the epoch (``metrics.catalog.ALL_TIME``) holds the all-time total
    that the Prometheus endpoint serves; the leader moves minutes past the retention into
    their hours' rows (``MetricHour``).
    """

    minute = models.DateTimeField(_("minute"))

    class Meta:
        verbose_name = _("metric")
        verbose_name_plural = _("metrics")
        constraints = [
            # The upsert's conflict target; also serves reads of a window of minutes.
            models.UniqueConstraint(
                fields=["backend_name", "minute", "queue_name", "task_path", "name"],
                name="dtp_metric_unique_minute",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.queue_name} {self.task_path} {self.name}"


class MetricHour(_MetricRow):
    """One number of one clock hour (UTC): the sum of that hour's per-minute rows once
    they are older than ``METRICS["RETENTION_DAYS"]`` (``db/metrics.py``,
    ``roll_up_minutes``).

    The leader's pruner moves minutes here in one transaction per batch (their sum added,
    the minutes deleted), so a count is in exactly one of the two tables at any time; the
    metrics reads add both. Kept ``METRICS["HOURLY_RETENTION_DAYS"]``.
    """

    hour = models.DateTimeField(_("hour"))

    class Meta:
        verbose_name = _("hourly metric")
        verbose_name_plural = _("hourly metrics")
        constraints = [
            # The rollup's upsert target; also serves reads of a window of hours.
            models.UniqueConstraint(
                fields=["backend_name", "hour", "queue_name", "task_path", "name"],
                name="dtp_metric_unique_hour",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.queue_name} {self.task_path} {self.name}"


class MetricFlush(models.Model):
    """One metrics flush that landed, by its idempotency key (``metrics/aggregate.py``).

    Written in the same transaction as the flush's counts, so a flush retried after an
    error whose outcome is unknown (a lost COMMIT acknowledgement) finds its key and adds
    nothing twice. The leader prunes keys with the per-minute metrics (``RETENTION_DAYS``).
    """

    id = models.UUIDField(_("flush key"), primary_key=True)
    backend_name = models.CharField(_("backend"), max_length=QUEUE_NAME_MAX_LENGTH)
    flushed_at = models.DateTimeField(_("flushed at"))

    class Meta:
        verbose_name = _("metrics flush")
        verbose_name_plural = _("metrics flushes")
        indexes = [
            models.Index(fields=["backend_name", "flushed_at"], name="dtp_metric_flush_age_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.backend_name} {self.id}"


class ScheduleRecord(models.Model):
    """One schedule (``schedules/``): what to enqueue, when, and where it was declared.

    Schedules from code and settings are synced into this table by the leader's
    scheduler; a removed one is disabled, never deleted with its history. ``next_at`` is
    the occurrence the scheduler waits for; it changes only under the row's lock.
    """

    backend_name = models.CharField(_("backend"), max_length=QUEUE_NAME_MAX_LENGTH)
    name = models.CharField(_("name"), max_length=SCHEDULE_NAME_MAX_LENGTH, unique=True)
    source = models.CharField(
        _("defined in"),
        max_length=10,
        choices=[("code", _("code")), ("settings", _("settings")), ("runtime", _("runtime"))],
        default="runtime",
    )
    task_path = models.CharField(_("task path"), max_length=TASK_PATH_MAX_LENGTH)
    cron = models.CharField(_("cron"), max_length=200, blank=True, default="")
    every_seconds = models.PositiveIntegerField(_("every (seconds)"), null=True, blank=True)
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    args = models.JSONField(_("args"), default=list, blank=True)
    kwargs = models.JSONField(_("kwargs"), default=dict, blank=True)
    queue_name = models.CharField(
        _("queue"), max_length=QUEUE_NAME_MAX_LENGTH, blank=True, default=""
    )
    priority = models.SmallIntegerField(_("priority"), default=0)
    catch_up = models.CharField(_("catch-up"), max_length=10, default="latest")
    catch_up_cap = models.PositiveIntegerField(_("catch-up cap"), default=10)
    overlap = models.CharField(_("overlap"), max_length=10, default="allow")
    enabled = models.BooleanField(
        _("enabled"), default=True, help_text=_("False: removed from code or settings.")
    )
    paused = models.BooleanField(_("paused"), default=False)
    next_at = models.DateTimeField(_("next occurrence"), null=True, blank=True)
    last_fired_at = models.DateTimeField(_("last fired"), null=True, blank=True)
    last_task_id = models.UUIDField(_("last task"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        indexes = [
            models.Index(fields=["backend_name", "next_at"], name="dtp_schedule_due_idx"),
        ]

    def __str__(self) -> str:
        return self.name


class ScheduleOccurrence(models.Model):
    """One occurrence of a schedule the scheduler acted on, with the task it enqueued.

    Inserted in the same transaction as the enqueue, under the unique constraint on
    (schedule, at): a second scheduler (a new leader at the moment of firing) cannot
    enqueue the same occurrence again.
    """

    schedule = models.ForeignKey(
        ScheduleRecord, on_delete=models.CASCADE, related_name="occurrences"
    )
    at = models.DateTimeField(_("occurrence"))
    action = models.CharField(
        _("action"),
        max_length=10,
        choices=[("fired", _("fired")), ("skipped", _("skipped")), ("run_now", _("run now"))],
        default="fired",
    )
    reason = models.CharField(_("reason"), max_length=200, blank=True, default="")
    task_id = models.UUIDField(_("task"), null=True, blank=True)
    created_at = models.DateTimeField(_("recorded at"), auto_now_add=True)

    class Meta:
        verbose_name = _("schedule occurrence")
        verbose_name_plural = _("schedule occurrences")
        constraints = [
            models.UniqueConstraint(fields=["schedule", "at"], name="dtp_schedule_occurrence_once"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} {self.at:%Y-%m-%d %H:%M:%S} {self.action}"
