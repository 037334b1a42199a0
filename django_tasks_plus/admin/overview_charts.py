"""The overview's charts: attempts per bar and the wait and run histograms over a chosen
range (``?range=1h|6h|1d|7d``), for every queue and task or one queue (``?queue=``)
and one task path (``?task=``).

Windows up to the minutes kept read per-minute rows; older parts read the hourly rows the
leader's pruner summed them into (``db/metrics.py``), so a week's chart reads at most
about 7 * 24 + 24 * 60 rows per series, never every minute of the week. A bad query
value never fails the page: it is named in a message above the charts and the default
is drawn. See docs/admin.md, "The overview".
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.formats import date_format
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import charts, metrics
from ..limits import QUEUE_NAME_MAX_LENGTH, TASK_PATH_MAX_LENGTH
from ..metrics.catalog import BUCKETS
from ..metrics.ranges import DEFAULT, RANGES, ChartRange, UnknownRange, Window, parse_range, window
from . import display

EMPTY = "-"  # as Django's empty_value_display
RANGE_LABELS = {
    "1h": gettext_lazy("last hour"),
    "6h": gettext_lazy("last 6 hours"),
    "1d": gettext_lazy("last day"),
    "7d": gettext_lazy("last week"),
}


@dataclass(frozen=True, slots=True)
class ChartOptions:
    """What the charts show, read from the query string (``chart_options``)."""

    range: ChartRange = DEFAULT
    queue: str = ""
    task_path: str = ""
    problems: tuple[str, ...] = field(default=())


def chart_options(query: Mapping[str, str]) -> ChartOptions:
    """``range``, ``queue`` and ``task`` from ``query``; a bad value is left out (the
    default applies) and named in ``problems``."""
    problems = []
    try:
        chosen = parse_range(query.get("range"))
    except UnknownRange as exc:
        chosen = DEFAULT
        problems.append(_("%(problem)s Showing the last hour.") % {"problem": exc})
    values = {}
    for key, limit, what in (
        ("queue", QUEUE_NAME_MAX_LENGTH, _("queue name")),
        ("task", TASK_PATH_MAX_LENGTH, _("task path")),
    ):
        value = (query.get(key) or "").strip()
        if len(value) > limit or any(unicodedata.category(c) == "Cc" for c in value):
            problems.append(
                _(
                    "The %(what)s %(value)r is not one (at most %(limit)d characters, no "
                    "control characters); showing every one."
                )
                % {"what": what, "value": value[:40], "limit": limit}
            )
            value = ""
        values[key] = value
    return ChartOptions(chosen, values["queue"], values["task"], tuple(problems))


def charts_context(
    backend: str,
    now: datetime,
    options: ChartOptions,
    *,
    queues: Sequence[str],
    minutes_kept: timedelta,
    backend_in_links: bool = False,
) -> dict[str, Any]:
    """The charts region: range links, filter choices, messages and the charts."""
    bars = window(options.range, now, now - minutes_kept)
    queue, task_path = options.queue or None, options.task_path or None
    counted = metrics.series(
        backend, ("succeeded", "attempt_failed"), bars, queue=queue, task_path=task_path
    )
    histograms = {
        kind: metrics.histogram(
            backend, kind, bars.start, queue=queue, task_path=task_path, now=now
        )
        for kind in metrics.HISTOGRAM_NAMES
    }
    base = {"backend": backend} if backend_in_links else {}
    filters = {"queue": options.queue, "task": options.task_path}
    return {
        "chart_ranges": [
            {
                "key": r.key,
                "label": RANGE_LABELS[r.key],
                "current": r == options.range,
                "url": "?" + urlencode({**base, "range": r.key, **_present(filters)}),
            }
            for r in RANGES.values()
        ],
        "chart_range": options.range.key,
        "chart_range_label": RANGE_LABELS[options.range.key],
        "chart_queue": options.queue,
        "chart_task": options.task_path,
        "chart_queues": sorted({*queues, *([options.queue] if options.queue else [])}),
        "chart_backend": backend if backend_in_links else "",
        "chart_problems": list(options.problems),
        "charts": [
            _throughput_chart(options, bars, counted),
            *(_latency_chart(options, kind, found) for kind, found in histograms.items()),
        ],
    }


def _present(values: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in values.items() if value}


def step_words(step: int) -> str:
    """A bar's width in words: ``minute``, ``5 minutes``, ``hour``, ``2 hours``."""
    if step % 3600 == 0:
        hours = step // 3600
        return _("hour") if hours == 1 else ngettext("%d hour", "%d hours", hours) % hours
    minutes = step // 60
    return _("minute") if minutes == 1 else ngettext("%d minute", "%d minutes", minutes) % minutes


def _scope(options: ChartOptions) -> str:
    """`` (queue emails, task app.tasks.send)`` when filtered, else empty."""
    parts = []
    if options.queue:
        parts.append(_("queue %(queue)s") % {"queue": options.queue})
    if options.task_path:
        parts.append(_("task %(task)s") % {"task": options.task_path})
    return f" ({', '.join(parts)})" if parts else ""


def _throughput_chart(
    options: ChartOptions, bars: Window, counted: Mapping[str, list[int]]
) -> dict[str, Any]:
    """Succeeded and failed attempts per bar, stacked."""
    chart_id = "dtp-chart-throughput"
    per = step_words(bars.step)
    fmt = "D H:i" if bars.count * bars.step > 86400 else "H:i"
    labels = [date_format(timezone.localtime(start), fmt) for start in bars.starts()]
    title = _("Attempts per %(per)s, %(range)s") % {
        "per": per,
        "range": RANGE_LABELS[options.range.key],
    } + _scope(options)
    description = _(
        "Stacked bars from %(first)s to %(last)s (%(tz)s): succeeded %(ok)d, "
        "failed %(failed)d attempts in all. The last bar is the current, partial %(per)s."
    ) % {
        "first": labels[0],
        "last": labels[-1],
        "tz": timezone.get_current_timezone_name(),
        "ok": sum(counted["succeeded"]),
        "failed": sum(counted["attempt_failed"]),
        "per": per,
    }
    return _chart(
        title,
        chart_id,
        charts.bar_chart(
            chart_id=chart_id,
            title=title,
            description=description,
            labels=labels,
            series=[
                charts.Series(_("succeeded"), counted["succeeded"], "ok"),
                charts.Series(_("failed"), counted["attempt_failed"], "failed"),
            ],
            unit=_("attempts / %(per)s") % {"per": per},
        ),
    )


def _latency_chart(options: ChartOptions, kind: str, found: metrics.Histogram) -> dict[str, Any]:
    """How many attempts fell in each histogram bucket over the range."""
    chart_id = f"dtp-chart-{kind}"
    what = {"wait": _("Wait from due to start"), "run": _("Run time")}[kind]
    title = f"{what}, {RANGE_LABELS[options.range.key]}{_scope(options)}"
    labels = [charts.duration_label(b) for b in (*BUCKETS, float("inf"))]
    description = _(
        "Attempts per latency bucket, each bar up to the bound under it: %(count)d "
        "observations, median %(p50)s, 95th percentile %(p95)s."
    ) % {
        "count": found.count,
        "p50": _seconds(found.quantile(0.5)),
        "p95": _seconds(found.quantile(0.95)),
    }
    return _chart(
        title,
        chart_id,
        charts.bar_chart(
            chart_id=chart_id,
            title=title,
            description=description,
            labels=labels,
            series=[charts.Series(_("attempts"), list(found.buckets), "primary")],
            # Each bar counts its own bucket (above the bound before it, up to its own).
            unit=_("attempts per bucket, by upper bound"),
        ),
    )


def _seconds(value: float | None) -> str:
    return EMPTY if value is None else display.duration(value)


def _chart(title: str, chart_id: str, svg: str) -> dict[str, Any]:
    # charts.bar_chart escapes every text it writes.
    markup: SafeString = mark_safe(svg)
    return {"title": title, "id": chart_id, "svg": markup}
