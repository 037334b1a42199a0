"""Live pages: the JSON a page polls to refresh its marked regions in place.

A page that updates itself includes ``live/bar.html`` (the "Live / Paused" button and the
static ``live.js``) and marks regions with ``id`` and ``data-dtp-live-region``. Its JSON
view answers ``{"regions": {id: html}, "interval": seconds}``, rendering each region from
the same template the page includes, so the HTML has one source. The views sit behind
the page's own admin permission and are never cached. See docs/admin.md, "Live pages".

A task list is not redrawn (rows carry the operator's selection checkboxes and Django's
action script): the page sends the state of the rows it shows (``row_token``) and the
answer is a notice of what is new or changed since, with a link to reload.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.template.loader import render_to_string

INTERVAL = 5  # seconds between two polls, unless the page says otherwise
ROWS_PARAM = "live_rows"  # the list's rows as the page shows them: "<id>.<state>,..."
MAX_ROWS = 1000  # a page of the list never shows more (list_max_show_all)
TEMPLATES = "admin/django_tasks_plus/live/"
_TOKEN = re.compile(r"[0-9a-f]{8}\.[0-9a-f]{6}")


class BadRows(ValueError):
    """The ``live_rows`` parameter is not what a list page sends."""


def bar_context(url: str, interval: int = INTERVAL) -> dict[str, Any]:
    """What ``live/bar.html`` needs: the JSON view to poll and how often."""
    return {"live_url": url, "live_interval": interval}


def regions_response(
    request: HttpRequest,
    regions: Mapping[str, str],
    context: Mapping[str, Any],
    *,
    interval: int = INTERVAL,
) -> JsonResponse:
    """Each region (page element id -> template name under ``live/``) rendered with
    ``context``, as the page renders it (the request's context processors included)."""
    rendered = {
        region: render_to_string(TEMPLATES + template, dict(context), request=request)
        for region, template in regions.items()
    }
    return JsonResponse({"regions": rendered, "interval": interval})


def problem_response(message: str, status: int) -> JsonResponse:
    """Why the page cannot be refreshed; ``live.js`` stops and shows the message."""
    return JsonResponse({"error": message}, status=status)


def row_token(pk: object, *state: object) -> str:
    """One list row as the page shows it: the task's short id and a digest of the
    fields its row displays. Equal tokens: the row has not changed."""
    text = "|".join(
        value.isoformat() if isinstance(value, datetime) else str(value) for value in state
    )
    digest = hashlib.blake2s(text.encode(), digest_size=3).hexdigest()
    return f"{str(pk).replace('-', '')[:8]}.{digest}"


def parse_rows(value: str) -> list[str]:
    """The tokens a page sent (empty: the page showed no row)."""
    if not value:
        return []
    tokens = value.split(",")
    if len(tokens) > MAX_ROWS:
        raise BadRows(f"{ROWS_PARAM} names {len(tokens)} rows; a page shows at most {MAX_ROWS}.")
    wrong = [token for token in tokens if not _TOKEN.fullmatch(token)]
    if wrong:
        raise BadRows(
            f"{ROWS_PARAM} must be tokens like 'a1b2c3d4.0f1e2d' separated by commas; "
            f"got {wrong[0][:40]!r}. Reload the list to get a fresh one."
        )
    return tokens


@dataclass(frozen=True, slots=True)
class Changes:
    """How the rows of a list page differ from the rows the page was drawn with."""

    new: int
    changed: int
    gone: int

    @property
    def any(self) -> bool:
        return bool(self.new or self.changed or self.gone)


def compare(shown: Iterable[str], now: Iterable[str]) -> Changes:
    """Rows on the page now that it did not show (new), rows it shows in another state
    (changed), and rows it showed that are no longer on it (gone: finished out of the
    filter, deleted, or pushed to the next page)."""
    before = dict(token.split(".") for token in shown)
    after = dict(token.split(".") for token in now)
    return Changes(
        new=sum(1 for pk in after if pk not in before),
        changed=sum(1 for pk, state in after.items() if pk in before and before[pk] != state),
        gone=sum(1 for pk in before if pk not in after),
    )
