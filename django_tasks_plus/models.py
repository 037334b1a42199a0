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

TASK_PATH_MAX_LENGTH = 255
QUEUE_NAME_MAX_LENGTH = 100
WORKER_ID_MAX_LENGTH = 64


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

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        indexes = [
            # The claim query walks this index in order and stops after LIMIT rows.
            models.Index(
                fields=["-priority", "run_after", "id"],
                condition=Q(status="READY"),
                name="dtp_task_ready_idx",
            ),
            # The reaper looks only at running tasks whose lease ran out.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="RUNNING"),
                name="dtp_task_lease_idx",
            ),
            models.Index(fields=["status", "queue_name"], name="dtp_task_status_queue_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} [{self.status}] {self.id}"


class WorkerRecord(models.Model):
    """A running ``runtasks`` process, kept alive by its heartbeat."""

    worker_id = models.CharField(_("worker id"), max_length=WORKER_ID_MAX_LENGTH, primary_key=True)
    backend_name = models.CharField(_("backend"), max_length=QUEUE_NAME_MAX_LENGTH)
    hostname = models.CharField(_("hostname"), max_length=255)
    pid = models.PositiveIntegerField(_("process id"))
    queues = models.JSONField(_("queues"), default=list)
    concurrency = models.PositiveIntegerField(_("concurrency"))
    started_at = models.DateTimeField(_("started at"))
    last_heartbeat_at = models.DateTimeField(_("last heartbeat at"))

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.worker_id
