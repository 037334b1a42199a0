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
DATE_FORMAT, CLOCK_FORMAT = "Y-m-d", "H:i:s"
# A task path longer than this is shortened in the lists (the whole path on hover).
PATH_CHARS = 32


def badge(text: str, kind: str | None = None) -> SafeString:
    """A coloured label; ``kind`` picks the colour (CSS class ``dtp-badge-<kind>``)."""
    return format_html(
        '<span class="dtp-badge dtp-badge-{}">{}</span>', (kind or text).lower(), text
    )


def moment(value: datetime | None, now: datetime | None = None, *, relative: bool = True) -> Any:
    """A time to the second, in the current time zone, with "3 min ago" under it."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value)
    # Date and clock in their own spans, so a narrow list column can stack them (CSS).
    shown = format_html(
        '<span class="dtp-time" title="{}"><span class="dtp-date">{}</span> '
        '<span class="dtp-clock">{}</span></span>',
        value.isoformat(),
        date_format(local, DATE_FORMAT),
        date_format(local, CLOCK_FORMAT),
    )
    if not relative:
        return shown
    return format_html(
        '{}<br><span class="dtp-note">{}</span>', shown, ago(value, now or timezone.now())
    )


def short_path(path: str, limit: int = PATH_CHARS) -> str:
    """A dotted path that fits ``limit`` characters where it can: the leading package
    names cut to their first letter, then the module's too; the function's name is
    always whole. ``acme_billing.integrations.tasks.deliver`` -> ``a.i.tasks.deliver``."""
    if len(path) <= limit:
        return path
    *modules, name = path.split(".")
    for keep in (1, 0):
        cut = len(modules) - keep
        shortened = ".".join([*(part[:1] for part in modules[:cut]), *modules[cut:], name])
        if len(shortened) <= limit:
            return shortened
    return shortened


def task_path(path: str) -> SafeString:
    """A task path on one line, shortened (``short_path``), the whole path on hover."""
    return format_html('<span class="dtp-path" title="{}">{}</span>', path, short_path(path))


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
