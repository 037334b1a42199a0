"""The workers page: who is running, with how many tasks in flight, and who went silent.

A worker touches its row every third of its own visibility timeout, stored on the row
(``worker/heartbeat.py``). Silent for a whole one, it is shown STALE: by then its leases
have expired too and the reaper hands its tasks to live workers (``liveness.py``; the
leader deletes the row after ``STALE_WORKER_FACTOR`` of them). Ages are measured by the
database's clock, which the workers' heartbeats follow, so a skewed admin host does not
mislead.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db import DatabaseError
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from ..db.breakers import database_now
from ..models import WorkerRecord
from . import display, html
from .base import ReadOnlyAdmin
from .queries import in_flight


def _annotate(workers: list[WorkerRecord]) -> None:
    """Read once per page (not per row): the database's time, the tasks in flight."""
    if not workers:
        return
    try:
        now = database_now(workers[0]._state.db or "default")
    except DatabaseError:
        now = timezone.now()
    counts = in_flight()
    for worker in workers:
        worker._dtp_now = now  # type: ignore[attr-defined]
        worker._dtp_in_flight = counts.get(worker.worker_id, 0)  # type: ignore[attr-defined]


class _WorkerChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        _annotate(list(self.result_list))


class WorkerRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "worker_id",
        "liveness",
        "hostname",
        "pid",
        "queue_list",
        "concurrency",
        "running",
        "heartbeat",
        "started",
        "backend_name",
    )
    list_filter = ("backend_name",)
    search_fields = ("=worker_id", "hostname")
    ordering = ("-last_heartbeat_at",)
    readonly_fields = ("liveness", "queue_list", "running", "heartbeat", "started")
    fields = (
        "worker_id",
        "liveness",
        "backend_name",
        "hostname",
        "pid",
        "queue_list",
        "concurrency",
        "running",
        "heartbeat",
        "started",
    )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _WorkerChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        worker = super().get_object(request, object_id, from_field)
        if worker is not None:
            _annotate([worker])
        return worker

    @staticmethod
    def _now(worker: WorkerRecord) -> datetime:
        return getattr(worker, "_dtp_now", None) or timezone.now()

    @admin.display(description=_("alive"))
    def liveness(self, worker: WorkerRecord) -> Any:
        timeout = worker.visibility_timeout
        if display.is_stale(worker.last_heartbeat_at, self._now(worker), timeout):
            return format_html(
                '<span title="{}">{}</span>',
                _("No heartbeat for longer than the visibility timeout (%(t)s).")
                % {"t": display.duration(timeout)},
                html.badge("STALE", "stale"),
            )
        return html.badge("ALIVE", "alive")

    @admin.display(description=_("queues"))
    def queue_list(self, worker: WorkerRecord) -> Any:
        queues = worker.queues if isinstance(worker.queues, list) else []
        return ", ".join(str(queue) for queue in queues) or _("(all)")

    @admin.display(description=_("in flight"))
    def running(self, worker: WorkerRecord) -> Any:
        count = getattr(worker, "_dtp_in_flight", 0)
        if not count:
            return "0"
        url = (
            reverse("admin:django_tasks_plus_taskrecord_changelist")
            + "?"
            + urlencode({"status__exact": "RUNNING", "worker": worker.worker_id})
        )
        return format_html('<a href="{}">{}</a>', url, count)

    @admin.display(description=_("last heartbeat"), ordering="last_heartbeat_at")
    def heartbeat(self, worker: WorkerRecord) -> Any:
        return html.moment(worker.last_heartbeat_at, self._now(worker))

    @admin.display(description=_("started"), ordering="started_at")
    def started(self, worker: WorkerRecord) -> Any:
        return html.moment(worker.started_at, self._now(worker))
