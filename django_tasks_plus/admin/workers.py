"""The workers page: who is running, with how many tasks in flight, and who went silent;
and one worker's page: what it runs (version, queues, slots), what it has done (attempts
processed and failed, as of its last heartbeat), whether it leads, and its tasks in flight.

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
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from ..db.breakers import database_now
from ..models import WorkerRecord
from . import display, html
from .base import ReadOnlyAdmin
from .queries import in_flight, in_flight_of


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
    change_form_template = "admin/django_tasks_plus/workerrecord/change_form.html"
    readonly_fields = (
        "liveness",
        "leader",
        "version_shown",
        "queue_list",
        "running",
        "heartbeat",
        "started",
        "uptime",
        "processed",
        "failed",
    )
    fieldsets = (
        (None, {"fields": ("worker_id", "liveness", "leader", "backend_name")}),
        (_("Process"), {"fields": ("hostname", "pid", "version_shown", "started", "uptime")}),
        (_("Heartbeat"), {"fields": ("heartbeat", "visibility_timeout")}),
        (_("Work"), {"fields": ("queue_list", "concurrency", "running", "processed", "failed")}),
    )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _WorkerChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        worker = super().get_object(request, object_id, from_field)
        if worker is not None:
            _annotate([worker])
        return worker

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: WorkerRecord | None = None,
    ) -> HttpResponse:
        """The page of a worker the user may view (``change_view`` checked): its fields,
        and the table of its tasks in flight."""
        if obj is not None:
            context.update(self._flight_context(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _flight_context(self, worker: WorkerRecord) -> dict[str, Any]:
        """The table of the worker's tasks in flight, each row linked to its task."""
        now = self._now(worker)
        tasks, total = in_flight_of(worker.worker_id, worker.backend_name)
        return {
            "flight_rows": [
                {
                    "link": html.task_link(task.pk),
                    "path": html.task_path(task.task_path),
                    "queue": task.queue_name,
                    "attempt": task.attempt,
                    "claimed": html.moment(task.last_attempted_at, now),
                }
                for task in tasks
            ],
            "flight_total": total,
            "flight_url": _running_url(worker.worker_id),
        }

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

    @admin.display(description=_("leader"))
    def leader(self, worker: WorkerRecord) -> Any:
        """Whether it led its backend at its last heartbeat (the election's own state)."""
        if worker.leader_since is None:
            return _("no")
        now = self._now(worker)
        shown = format_html(
            "{} {} {}",
            html.badge("LEADER", "leader"),
            _("since"),
            html.moment(worker.leader_since, now),
        )
        if display.is_stale(worker.last_heartbeat_at, now, worker.visibility_timeout):
            note = _("as of its last heartbeat (it went silent)")
            return format_html('{}<br><span class="dtp-note dtp-wrap">{}</span>', shown, note)
        return shown

    @admin.display(description=_("version"))
    def version_shown(self, worker: WorkerRecord) -> Any:
        return worker.version or _("unknown")

    @admin.display(description=_("uptime"))
    def uptime(self, worker: WorkerRecord) -> Any:
        """Up to now by the database's clock; a silent worker's up to its last beat."""
        now = self._now(worker)
        if display.is_stale(worker.last_heartbeat_at, now, worker.visibility_timeout):
            shown = display.between(worker.started_at, worker.last_heartbeat_at)
            return format_html("{} ({})", shown, _("until its last heartbeat"))
        return display.between(worker.started_at, now) or html.EMPTY

    @admin.display(description=_("processed"), ordering="tasks_processed")
    def processed(self, worker: WorkerRecord) -> Any:
        return number_format(worker.tasks_processed, force_grouping=True)

    @admin.display(description=_("failed"), ordering="tasks_failed")
    def failed(self, worker: WorkerRecord) -> Any:
        return number_format(worker.tasks_failed, force_grouping=True)

    @admin.display(description=_("queues"))
    def queue_list(self, worker: WorkerRecord) -> Any:
        queues = worker.queues if isinstance(worker.queues, list) else []
        return ", ".join(str(queue) for queue in queues) or _("(all)")

    @admin.display(description=_("in flight"))
    def running(self, worker: WorkerRecord) -> Any:
        count = getattr(worker, "_dtp_in_flight", 0)
        if not count:
            return "0"
        return format_html('<a href="{}">{}</a>', _running_url(worker.worker_id), count)

    @admin.display(description=_("last heartbeat"), ordering="last_heartbeat_at")
    def heartbeat(self, worker: WorkerRecord) -> Any:
        return html.moment(worker.last_heartbeat_at, self._now(worker))

    @admin.display(description=_("started"), ordering="started_at")
    def started(self, worker: WorkerRecord) -> Any:
        return html.moment(worker.started_at, self._now(worker))


def _running_url(worker_id: str) -> str:
    """The task list narrowed to the RUNNING tasks the worker ran an attempt of."""
    query = urlencode({"status__exact": "RUNNING", "worker": worker_id})
    return reverse("admin:django_tasks_plus_taskrecord_changelist") + "?" + query
