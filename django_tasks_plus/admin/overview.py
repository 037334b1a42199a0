"""The overview page: what is waiting, running and dead per queue, throughput and failure
rate, latency percentiles, workers, circuits and schedules, with server-rendered SVG
charts over a chosen range (``overview_charts``).

Everything comes from the metrics read API (``metrics/queries.py``) and
``circuits.breaker_states``: gauges are counted from the task table by indexed queries,
rates and latencies from the per-minute metrics table. It is an extra URL of the task
admin (``TaskRecordAdmin.get_urls``), so it has the admin's login, look and the task
list's view permission. See docs/admin.md, "The overview".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from .. import circuits, metrics
from ..metrics.aggregate import enabled_targets
from ..models import ScheduleRecord
from ..operations import database_backend
from ..waiting import LABELS, Capped, Reason
from . import display, live, overview_charts
from .filters import configured_backends

TEMPLATE = "admin/django_tasks_plus/overview.html"
URL_NAME = "django_tasks_plus_taskrecord_overview"
LIVE_URL_NAME = "django_tasks_plus_taskrecord_overview_live"
# Page element id -> its template under live/ (the page includes the same ones).
LIVE_REGIONS = {
    "dtp-live-cards": "overview_cards.html",
    "dtp-queues": "overview_queues.html",
    "dtp-breakers": "overview_breakers.html",
}
HOUR, DAY = timedelta(hours=1), timedelta(days=1)
EMPTY = "-"  # as Django's empty_value_display


@dataclass(frozen=True, slots=True)
class Window:
    """Counters over one window, as the throughput table shows them."""

    label: str
    minutes: int
    counters: dict[str, int]

    @property
    def finished_attempts(self) -> int:
        return self.counters["succeeded"] + self.counters["attempt_failed"]

    @property
    def failure_rate(self) -> str:
        """Failed attempts over finished attempts; "-" when none finished."""
        done = self.finished_attempts
        if not done:
            return EMPTY
        return f"{100 * self.counters['attempt_failed'] / done:.1f} %"

    @property
    def per_minute_succeeded(self) -> str:
        return f"{self.counters['succeeded'] / self.minutes:.1f}"


def overview_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    """The page; the caller wraps it in ``admin_site.admin_view`` (login, staff)."""
    context = _page_context(model_admin, request)
    if "problem" not in context:
        context.update(
            build(
                context["backend"],
                timezone.now(),
                model_admin.admin_site.name,
                filter_backend=len(context["backends"]) > 1,
                chart_options=overview_charts.chart_options(request.GET),
            )
        )
        query = request.GET.urlencode()
        url = reverse(f"{model_admin.admin_site.name}:{LIVE_URL_NAME}")
        context.update(live.bar_context(url + (f"?{query}" if query else "")))
    return TemplateResponse(request, TEMPLATE, context)


def overview_live_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    """The JSON ``live.js`` polls: the regions read from the task table now (cards,
    queues, circuits). Rates, latencies and charts stay as the page drew them."""
    context = _page_context(model_admin, request)
    if "problem" in context:
        return live.problem_response(context["problem"], 400)
    context.update(
        gauges(
            context["backend"],
            timezone.now(),
            model_admin.admin_site.name,
            filter_backend=len(context["backends"]) > 1,
        )
    )
    return live.regions_response(request, LIVE_REGIONS, context)


def _page_context(model_admin: admin.ModelAdmin, request: HttpRequest) -> dict[str, Any]:
    """The page's frame and the backend it shows (``problem``: none can be shown)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    backends = sorted(configured_backends())
    backend = request.GET.get("backend") or (backends[0] if backends else "")
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": _("Tasks overview"),
        "subtitle": None,
        "backends": backends,
        "backend": backend,
        "media": model_admin.media,
    }
    if backend not in backends:
        context["problem"] = (
            _("There is no django-tasks-plus backend named %(name)r in TASKS.") % {"name": backend}
            if backend
            else _("No TASKS entry uses django_tasks_plus.backend.DatabaseBackend.")
        )
    return context


def gauges(
    backend: str, now: datetime, site: str = "admin", *, filter_backend: bool = False
) -> dict[str, Any]:
    """What the page reads from the task table now (cards, queues, circuits, schedules):
    what a live refresh redraws, without the metrics' rates and charts."""
    links = _Links(site, backend if filter_backend else None)
    queues = metrics.queue_waiting(backend, now=now)
    workers = metrics.workers(backend, now=now)
    circuits_open = [b for b in circuits.breaker_states(backend) if b.state != "closed"]
    return {
        "reasons": [
            {"value": reason.value, "short": _(reason.value), "label": _(label)}
            for reason, label in LABELS.items()
        ],
        "queues": [_queue_row(queue, links) for queue in queues],
        "queue_totals": {
            **{
                reason.value: Capped(
                    sum(q.waiting[reason].count for q in queues),
                    any(q.waiting[reason].at_least for q in queues),
                    any(q.waiting[reason].at_most for q in queues),
                )
                for reason in Reason
            },
            "running": sum(q.running for q in queues),
            "dead": sum(q.dead for q in queues),
        },
        "workers_alive": sum(1 for w in workers if w.alive),
        "workers_stale": sum(1 for w in workers if not w.alive),
        "workers_url": reverse(f"{site}:django_tasks_plus_workerrecord_changelist"),
        "breakers": circuits_open,
        "breakers_url": reverse(f"{site}:django_tasks_plus_breakerrecord_changelist"),
        "schedules": schedule_counts(backend),
        "schedules_url": reverse(f"{site}:django_tasks_plus_schedulerecord_changelist")
        + ("?" + urlencode({"backend_name": backend}) if filter_backend else ""),
    }


def build(
    backend: str,
    now: datetime,
    site: str = "admin",
    *,
    filter_backend: bool = False,
    chart_options: overview_charts.ChartOptions | None = None,
) -> dict[str, Any]:
    """The page's numbers and charts for one backend, read now. ``filter_backend``: the
    links to the task list name the backend (when there are several). ``chart_options``:
    the charts' range and filters (``overview_charts``)."""
    context = gauges(backend, now, site, filter_backend=filter_backend)
    target = enabled_targets().get(backend)
    context["metrics_enabled"] = target is not None
    if target is None:
        return context
    windows = [
        Window(_("last hour"), 60, metrics.counter_totals(backend, HOUR, now=now)),
        Window(_("last day"), 24 * 60, metrics.counter_totals(backend, DAY, now=now)),
    ]
    latency = {
        kind: metrics.histogram(backend, kind, HOUR, now=now) for kind in metrics.HISTOGRAM_NAMES
    }
    context.update(
        windows=windows,
        latency=[
            {
                "label": {"wait": _("wait (due → start)"), "run": _("run (start → end)")}[kind],
                "count": found.count,
                "p50": _seconds(found.quantile(0.5)),
                "p95": _seconds(found.quantile(0.95)),
            }
            for kind, found in latency.items()
        ],
    )
    context.update(
        overview_charts.charts_context(
            backend,
            now,
            chart_options or overview_charts.ChartOptions(),
            queues=[row["queue"] for row in context["queues"]],
            minutes_kept=target.metrics.retention,
            backend_in_links=filter_backend,
        )
    )
    return context


def schedule_counts(backend: str) -> dict[str, int]:
    """The backend's schedules in use (not removed from code or settings): how many fire
    and how many are paused, in one query."""
    database = database_backend(backend, needed_by="the overview").settings.database
    return (
        ScheduleRecord.objects.using(database)
        .filter(backend_name=backend, enabled=True)
        .aggregate(
            active=Count("pk", filter=Q(paused=False)),
            paused=Count("pk", filter=Q(paused=True)),
        )
    )


@dataclass(frozen=True, slots=True)
class _Links:
    site: str
    backend: str | None

    def _url(self, page: str, filters: dict[str, str]) -> str:
        query = {"backend_name": self.backend, **filters} if self.backend else filters
        return reverse(f"{self.site}:django_tasks_plus_taskrecord_{page}") + "?" + urlencode(query)

    def tasks(self, **filters: str) -> str:
        return self._url("changelist", filters)

    def dead(self, queue: str) -> str:
        return self._url("deadletters", {"queue_name": queue})


def _queue_row(queue: metrics.QueueWaiting, links: _Links) -> dict[str, Any]:
    """One queue's row: its READY tasks per waiting reason (each a link to the list
    filtered to them), RUNNING, dead, and the oldest age of a task that could run now."""
    oldest = _seconds(queue.oldest_runnable_age)
    return {
        "queue": queue.queue,
        "counts": {reason.value: queue.waiting[reason] for reason in Reason},
        "waiting": [
            {
                "reason": reason.value,
                "count": queue.waiting[reason],
                "url": links.tasks(queue_name=queue.queue, waiting=reason.value),
            }
            for reason in LABELS
        ],
        "running": queue.running,
        "dead": queue.dead,
        "oldest": oldest if queue.oldest_exact or oldest == EMPTY else f"≥ {oldest}",
        "ready_url": links.tasks(queue_name=queue.queue, status__exact="READY"),
        "running_url": links.tasks(queue_name=queue.queue, status__exact="RUNNING"),
        "dead_url": links.dead(queue.queue),
    }


def _seconds(value: float | None) -> str:
    return EMPTY if value is None else display.duration(value)
