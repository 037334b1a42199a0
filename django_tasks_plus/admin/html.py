"""Small HTML fragments the admin pages share: status badges, times with seconds and a
relative note, short ids, pretty JSON. Every value is escaped by ``format_html``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .display import ago, short_id

EMPTY = "-"  # as Django's empty_value_display
TIME_FORMAT = "Y-m-d H:i:s"


def badge(text: str, kind: str | None = None) -> SafeString:
    """A coloured label; ``kind`` picks the colour (CSS class ``dtp-badge-<kind>``)."""
    return format_html(
        '<span class="dtp-badge dtp-badge-{}">{}</span>', (kind or text).lower(), text
    )


def moment(value: datetime | None, now: datetime | None = None, *, relative: bool = True) -> Any:
    """A time to the second, in the current time zone, with "3 min ago" under it."""
    if value is None:
        return EMPTY
    shown = date_format(timezone.localtime(value), TIME_FORMAT)
    if not relative:
        return format_html('<span class="dtp-time" title="{}">{}</span>', value.isoformat(), shown)
    return format_html(
        '<span class="dtp-time" title="{}">{}</span><br><span class="dtp-note">{}</span>',
        value.isoformat(),
        shown,
        ago(value, now or timezone.now()),
    )


def task_link(task_id: Any, *, text: str | None = None) -> SafeString:
    url = reverse("admin:django_tasks_plus_taskrecord_change", args=[task_id])
    return format_html(
        '<a class="dtp-id" href="{}" title="{}">{}</a>', url, task_id, text or short_id(task_id)
    )


def pretty_json(value: Any) -> SafeString:
    """JSON indented in a ``<pre>``; a value that is not JSON is shown as it is."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return format_html('<pre class="dtp-pre">{}</pre>', text)
