"""The circuit breakers page: each stored circuit as ``circuits.breaker_states`` reads it
(a corrupt row shows as corrupt, with what is wrong), with force close / force open.

Forcing is an admin action, a POST with the CSRF token, allowed with the model's own
change permission (``django_tasks_plus.change_breakerrecord``); the rows themselves are
never edited by hand. Each forced change is logged under the operator.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import circuits
from ..compat import TaskResultStatus
from ..db.rowlock import LockPatience
from ..exceptions import CircuitLocked, TasksPlusError
from ..models import BreakerRecord
from . import html
from .base import ReadOnlyAdmin, log_change


def _annotate(rows: list[BreakerRecord]) -> None:
    """Attach each row's ``BreakerStatus`` (one read of the backend's circuits and held
    counts per backend on the page, not one per row)."""
    statuses: dict[tuple[str, str, str], circuits.BreakerStatus] = {}
    for backend in {row.backend_name for row in rows}:
        try:
            found = circuits.breaker_states(backend)
        except (TasksPlusError, Exception):  # a backend no longer configured
            continue
        statuses.update({(backend, status.name, status.key): status for status in found})
    for row in rows:
        row._dtp_status = statuses.get((row.backend_name, row.name, row.key))  # type: ignore[attr-defined]


class _BreakerChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        _annotate(list(self.result_list))


def _status(row: BreakerRecord) -> circuits.BreakerStatus | None:
    return getattr(row, "_dtp_status", None)


class BreakerRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "key",
        "state_badge",
        "failures_count",
        "last_failure",
        "opened",
        "probe",
        "held",
        # "updated" is on each circuit's page: the list keeps what an operator acts on.
        "backend_name",
    )
    list_display_links = ("name", "key")
    list_filter = ("state", "name", "backend_name")
    search_fields = ("key", "name")
    ordering = ("name", "key")
    actions = ("force_close", "force_open")
    fields = (
        "backend_name",
        "name",
        "key",
        "state_badge",
        "failures_count",
        "last_failure",
        "opened",
        "probe",
        "held",
        "updated",
        "failures",
    )
    readonly_fields = (
        "state_badge",
        "failures_count",
        "last_failure",
        "opened",
        "probe",
        "held",
        "updated",
    )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _BreakerChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        row = super().get_object(request, object_id, from_field)
        if row is not None:
            _annotate([row])
        return row

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, row: BreakerRecord) -> Any:
        status = _status(row)
        if status is None:
            return html.badge(row.state, "corrupt" if row.state not in _KNOWN else row.state)
        if status.state == "corrupt":
            return format_html(
                '<span title="{}">{}</span> <span class="dtp-note">{}</span>',
                status.problem,
                html.badge("corrupt"),
                _("%(problem)s; worked as closed") % {"problem": status.problem},
            )
        return html.badge(status.state)

    @admin.display(description=_("failures remembered"))
    def failures_count(self, row: BreakerRecord) -> Any:
        status = _status(row)
        return html.EMPTY if status is None else status.failures

    @admin.display(description=_("last failure"))
    def last_failure(self, row: BreakerRecord) -> Any:
        status = _status(row)
        return html.moment(status.last_failure_at if status else None)

    @admin.display(description=_("opened at"), ordering="opened_at")
    def opened(self, row: BreakerRecord) -> Any:
        status = _status(row)
        return html.moment(status.opened_at if status else row.opened_at)

    @admin.display(description=_("probe"))
    def probe(self, row: BreakerRecord) -> Any:
        """The probe running (half-open), and when a task may next probe: an open
        circuit's first probe, or the next one should the running probe stay silent."""
        status = _status(row)
        if status is None:
            return html.EMPTY
        running: Any = ""
        if status.state == "half-open" and status.probe_task_id:
            running = format_html(
                "{} {}<br>",
                html.task_link(status.probe_task_id),
                html.moment(status.probe_started_at),
            )
        if status.probe_at is None:
            return running or html.EMPTY
        label = _("next probe if silent") if running else _("next probe")
        return format_html(
            '{}<span class="dtp-note">{}</span> {}', running, label, html.moment(status.probe_at)
        )

    @admin.display(description=_("held tasks"))
    def held(self, row: BreakerRecord) -> Any:
        status = _status(row)
        count = status.held if status else 0
        if not count:
            return "0"
        url = (
            reverse("admin:django_tasks_plus_taskrecord_changelist")
            + "?"
            + urlencode(
                {"status__exact": TaskResultStatus.READY, "breaker_key": f"{row.name}/{row.key}"}
            )
        )
        return format_html('<a href="{}">{}</a>', url, count)

    @admin.display(description=_("updated at"), ordering="updated_at")
    def updated(self, row: BreakerRecord) -> Any:
        return html.moment(row.updated_at)

    # -- actions --------------------------------------------------------------------------

    def has_force_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{BreakerRecord._meta.app_label}.change_breakerrecord")

    @admin.action(description=_("Force close selected circuits"), permissions=["force"])
    def force_close(self, request: HttpRequest, queryset: QuerySet[BreakerRecord]) -> None:
        released = self._force(request, queryset, "closed")
        self.message_user(
            request,
            ngettext("%d held task released.", "%d held tasks released.", released) % released,
            messages.SUCCESS,
        )

    @admin.action(description=_("Force open selected circuits"), permissions=["force"])
    def force_open(self, request: HttpRequest, queryset: QuerySet[BreakerRecord]) -> None:
        self._force(request, queryset, "open")

    def _force(self, request: HttpRequest, queryset: QuerySet[BreakerRecord], state: str) -> int:
        released = forced = 0
        patience = LockPatience()  # rows other sessions keep locked cost seconds in all
        for row in list(queryset):
            wait = patience.wait()
            try:
                if state == "closed":
                    released += circuits.force_close(
                        row.key, name=row.name, backend=row.backend_name, lock_wait=wait
                    )
                else:
                    circuits.force_open(
                        row.key, name=row.name, backend=row.backend_name, lock_wait=wait
                    )
            except TasksPlusError as exc:
                if isinstance(exc, CircuitLocked):
                    patience.gave_up(exc.waited)
                self.message_user(request, f"{row}: {exc}", messages.ERROR)
                continue
            forced += 1
            log_change(request, [row], f"Forced {state} from the admin.")
        self.message_user(
            request,
            ngettext("%(n)d circuit forced %(s)s.", "%(n)d circuits forced %(s)s.", forced)
            % {"n": forced, "s": state},
            messages.SUCCESS,
        )
        return released


_KNOWN = ("closed", "open", "half-open")
