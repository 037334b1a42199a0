"""The task pages: the queue (the change list), the dead letters, and one task's page.

The list loads no JSON column but ``errors`` as text (for the attempt counts and the last
error), and never counts the whole table (``paginator.py``). Actions are POSTs with
Django's CSRF check, each behind its own permission (``actions.py``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Case, QuerySet, TextField, When
from django.db.models.functions import Cast
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from .. import compat
from ..breaker import split_scoped_key
from ..compat import TaskResultStatus
from ..db.waiting import blocker_id
from ..models import BreakerRecord, TaskRecord
from ..search import parse_search
from ..selection import BadFilter, check_parameters, with_search
from ..stored import error_list
from ..waiting import Waiting, max_attempts_of, waiting_reason
from . import actions as ops
from . import display, html, live, overview
from .base import ReadOnlyAdmin
from .filters import (
    NOT_FILTERS,
    BackendFilter,
    BreakerKeyFilter,
    DedupKeyFilter,
    EnqueuedFilter,
    FinishedFilter,
    OrderingKeyFilter,
    QueueFilter,
    TaskPathFilter,
    WaitingFilter,
    WorkerFilter,
    task_list_parameters,
)
from .paginator import EstimatedCountPaginator
from .queries import blocker_of, same_ordering_key

_JSON_COLUMNS = ("args", "kwargs", "return_value", "errors", "worker_ids", "metadata")
DEAD_LETTERS = "django_tasks_plus_taskrecord_deadletters"
CHANGELIST = "admin:django_tasks_plus_taskrecord_changelist"
BAD_FILTER_TEMPLATE = "admin/django_tasks_plus/taskrecord/bad_filter.html"
NO_FILTER = "no filter"  # what describe_filter() says of a page without one
MATCHING = "django_tasks_plus_taskrecord_matching"
LIST_MATCHING = "django_tasks_plus_taskrecord_list_matching"
# The live views' names end as their pages' do: get_queryset loads the list's columns.
LIVE_LIST = "django_tasks_plus_taskrecord_live_changelist"
LIVE_DEAD_LETTERS = "django_tasks_plus_taskrecord_live_deadletters"
LIVE_TASK = "django_tasks_plus_taskrecord_live"
# The task page's live regions: element id -> template under live/.
TASK_REGIONS = {
    "dtp-live-subtitle": "task_subtitle.html",  # the task's name shows its status
    "dtp-live-actions": "task_actions.html",
    "dtp-live-callouts": "task_callouts.html",
    "dtp-live-fields": "task_fields.html",
    "dtp-live-attempts": "task_attempts.html",
}
LIST_REGIONS = {"dtp-live-list": "list_notice.html"}
HELD_WARNING = _(
    "A circuit breaker holds this task: run now makes it due, but while its circuit is "
    "open the worker's breaker holds it again at its claim. Close the circuit first to "
    "make it run."
)
# "All matching" on each list: what it may do to every task its filter matches.
DEAD_MATCHING = (
    (ops.REDRIVE, _("Redrive all matching…")),
    (ops.DISCARD, _("Release keys of all matching…")),
    (ops.DELETE, _("Delete all matching…")),
)
TASK_MATCHING = (
    (ops.RUN_NOW, _("Run all matching now…")),
    (ops.CANCEL, _("Cancel all matching…")),
    (ops.DELETE, _("Delete all matching…")),
)


def _errors(record: TaskRecord) -> tuple[Any, ...]:
    """The record's errors: from the list's text annotation, or the loaded column."""
    cached = getattr(record, "_dtp_errors", None)
    if cached is None:
        raw = getattr(record, "errors_text", None)
        if raw is None and "errors" in record.__dict__:
            raw = record.errors
        cached = error_list(raw) if raw is not None else ()
        record._dtp_errors = cached  # type: ignore[attr-defined]
    return cached


def max_attempts(record: TaskRecord) -> int | None:
    """The retry budget of the task's policy (its own, else the backend's), when the
    policy states one and the task can be resolved here; None otherwise."""
    from ..backend import DatabaseBackend
    from ..definition import resolve_task

    try:
        backend = compat.task_backends[record.backend_name]
        task = resolve_task(record.task_path)
    except Exception:  # a backend no longer configured, a task no longer defined
        return None
    if not isinstance(backend, DatabaseBackend):
        return None
    return max_attempts_of(backend.retry_policy_for(task))


def waiting_of(record: TaskRecord, now: datetime) -> Waiting | None:
    """Why the READY ``record`` waits; its blocker comes from the list's annotation,
    else one query (the task's page)."""
    if record.status != TaskResultStatus.READY:
        return None
    if hasattr(record, "blocker"):
        blocker = record.blocker
    else:
        blocker = None
        if record.ordering_key is not None and record.run_after <= now:
            found = blocker_of(record)
            blocker = found.pk if found is not None else None
    budget = max_attempts(record) if record.attempt else None
    return waiting_reason(
        status=record.status,
        run_after=record.run_after,
        attempt=record.attempt,
        held_since=record.held_since,
        breaker_key=record.breaker_key,
        blocker_id=str(blocker) if blocker is not None else None,
        now=now,
        max_attempts=budget,
    )


def _row_token(record: TaskRecord) -> str:
    """A list row's state, as far as its columns show it (``live.row_token``)."""
    return live.row_token(
        record.pk,
        record.status,
        record.attempt,
        record.run_after,
        record.held_since,
        record.finished_at,
        record.ordering_blocked,
        record.queue_name,
        getattr(record, "blocker", None),
    )


def _live(view: Any) -> Any:
    """A live page's JSON view: read-only GETs (no CSRF token to send), never cached."""
    return require_GET(never_cache(view))


def _is_dead_view(request: HttpRequest) -> bool:
    return bool(getattr(request, "_dtp_dead_letters", False))


def describe_filter(params: dict[str, list[str]]) -> str:
    """The filter a page shows, as ``name=value`` pairs for messages and the log."""
    shown = [
        f"{name}={value}"
        for name, values in sorted(params.items())
        if name not in NOT_FILTERS and name != "q"
        for value in values
        if value != ""
    ]
    return ", ".join(shown) if shown else NO_FILTER


class TaskRecordAdmin(ReadOnlyAdmin):
    change_list_template = "admin/django_tasks_plus/taskrecord/change_list.html"
    change_form_template = "admin/django_tasks_plus/taskrecord/change_form.html"
    list_display = (
        "short_id",
        "task",
        "queue",
        "status_badge",
        "attempts",
        "enqueued",
        "timing",
        "finished",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "status",
        WaitingFilter,
        QueueFilter,
        TaskPathFilter,
        OrderingKeyFilter,
        DedupKeyFilter,
        BreakerKeyFilter,
        WorkerFilter,
        EnqueuedFilter,
        FinishedFilter,
        BackendFilter,
    )
    search_fields = ("=id",)
    search_help_text = _(
        "A task's id (its first 8 or more characters) or part of its path; arg:42, "
        'kwarg:user_id=42, meta:tenant="acme", dedup:KEY. Terms combine; see docs/admin.md.'
    )
    ordering = ("-enqueued_at",)
    list_per_page = 50
    paginator = EstimatedCountPaginator
    show_full_result_count = False  # COUNT(*) over a large queue is slow
    actions = ("redrive_tasks", "cancel_tasks", "discard_tasks", "run_now_tasks", "delete_tasks")

    # -- the lists ------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskRecord]:
        """The lists show no JSON column but the errors, read as text: nothing is parsed
        by the database driver, so one hostile row (JSON nested deeper than Python's
        parser goes) cannot make the whole list fail (``stored.error_list`` keeps it)."""
        queryset = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        listing = match is not None and (match.url_name or "").endswith(
            ("_changelist", "_deadletters", "_matching")
        )
        if listing or _is_dead_view(request):
            queryset = queryset.defer(*_JSON_COLUMNS).annotate(
                errors_text=Cast("errors", TextField())
            )
        if listing and not _is_dead_view(request):
            # What a due READY task waits behind in its ordering key: one probe of the
            # ordering index per row shown, none for other rows.
            queryset = queryset.annotate(
                blocker=Case(
                    When(
                        status=TaskResultStatus.READY, ordering_key__isnull=False, then=blocker_id()
                    ),
                    default=None,
                )
            )
        if _is_dead_view(request):
            queryset = queryset.filter(status=TaskResultStatus.FAILED)
        return queryset

    def get_list_display(self, request: HttpRequest) -> Any:
        if _is_dead_view(request):
            return ("short_id", "task", "queue", "attempts", "finished", "reason", "last_error")
        return self.list_display

    def get_list_filter(self, request: HttpRequest) -> Any:
        if _is_dead_view(request):  # dead tasks neither have a status to pick nor wait
            return [spec for spec in self.list_filter if spec not in ("status", WaitingFilter)]
        return self.list_filter

    def get_ordering(self, request: HttpRequest) -> Any:
        return ("-finished_at",) if _is_dead_view(request) else self.ordering

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[TaskRecord], search_term: str
    ) -> tuple[QuerySet[TaskRecord], bool]:
        """The search box's terms (``search.parse_search``), all applied: an id prefix is
        one range of the primary key, as the commands resolve short ids; JSON terms are
        containment (``selection.with_search``)."""
        try:
            terms = parse_search(search_term)
        except BadFilter:  # the pages check the search first; match nothing, never all
            return queryset.none(), False
        return with_search(queryset, terms), False

    def filter_problems(self, request: HttpRequest) -> list[BadFilter]:
        """Why the current list's query cannot be applied as given (none: it can)."""
        return check_parameters(
            request.GET.lists(),
            task_list_parameters(dead_letters=_is_dead_view(request)),
            ignored=NOT_FILTERS,
        )

    def bad_filter_response(
        self, request: HttpRequest, problems: list[BadFilter], back_url: str
    ) -> HttpResponse:
        """The page for a query the list cannot apply: what is wrong, and no rows (a
        list that silently dropped the filter would show, or act on, everything)."""
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("This filter cannot be applied"),
            "problems": [str(problem) for problem in problems],
            "back_url": back_url,
            "media": self.media,
        }
        return TemplateResponse(request, BAD_FILTER_TEMPLATE, context, status=400)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        problems = self.filter_problems(request)
        if problems:
            return self.bad_filter_response(request, problems, request.path)
        context = {
            "dead_letters_url": reverse("admin:" + DEAD_LETTERS),
            "dead_letters": _is_dead_view(request),
            "matching_links": self._matching_links(request, LIST_MATCHING, TASK_MATCHING),
            **(extra_context or {}),
        }
        response = super().changelist_view(request, context)
        shown = getattr(response, "context_data", None) or {}
        if "cl" in shown:  # the list itself (not a redirect after an action)
            query = request.GET.copy()
            query[live.ROWS_PARAM] = ",".join(_row_token(row) for row in shown["cl"].result_list)
            name = LIVE_DEAD_LETTERS if _is_dead_view(request) else LIVE_LIST
            url = reverse(f"{self.admin_site.name}:{name}") + "?" + query.urlencode()
            shown.update(live.bar_context(url))
        return response

    def live_list_view(self, request: HttpRequest, *, dead_letters: bool = False) -> HttpResponse:
        """The list's JSON for ``live.js``: how the rows of the page the user sees (the
        same filter, order and page; ``live_rows``: their state when drawn) differ now."""
        request._dtp_dead_letters = dead_letters  # type: ignore[attr-defined]
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.copy()
        sent = query.pop(live.ROWS_PARAM, [""])[-1]
        # The list reads its filter from request.GET: the same one, without live_rows.
        request.GET = QueryDict(query.urlencode())
        try:
            shown = live.parse_rows(sent)
        except live.BadRows as exc:
            return live.problem_response(str(exc), 400)
        problems = self.filter_problems(request)
        if problems:
            return live.problem_response(" ".join(str(problem) for problem in problems), 400)
        try:
            changelist = self.get_changelist_instance(request)
        except admin.options.IncorrectLookupParameters as exc:
            return live.problem_response(str(exc) or str(_("This filter cannot be applied.")), 400)
        page = reverse("admin:" + DEAD_LETTERS) if dead_letters else reverse(CHANGELIST)
        context = {
            "changes": live.compare(shown, [_row_token(row) for row in changelist.result_list]),
            "reload_url": page + (f"?{query.urlencode()}" if query else ""),
        }
        return live.regions_response(request, LIST_REGIONS, context)

    # -- columns --------------------------------------------------------------------------

    @admin.display(description=_("id"), ordering="id")
    def short_id(self, record: TaskRecord) -> Any:
        return format_html(
            '<code class="dtp-id" title="{}">{}</code>', record.pk, display.short_id(record.pk)
        )

    @admin.display(description=_("task"), ordering="task_path")
    def task(self, record: TaskRecord) -> Any:
        return html.task_path(record.task_path)

    @admin.display(description=_("queue"), ordering="queue_name")
    def queue(self, record: TaskRecord) -> Any:
        return record.queue_name

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, record: TaskRecord) -> Any:
        if record.status == TaskResultStatus.READY and record.held_since is not None:
            return format_html("{} {}", html.badge(record.status), html.badge("held", "held"))
        return html.badge(record.status)

    @admin.display(description=_("attempts"), ordering="attempt")
    def attempts(self, record: TaskRecord) -> Any:
        """This run's attempts against the task's retry budget ("3 / 5"), and the total
        across redrives when it differs."""
        total = display.total_attempts(record.status, record.attempt, _errors(record))
        budget = max_attempts(record)
        shown = f"{record.attempt} / {budget}" if budget else str(record.attempt)
        title = _("attempts / most attempts") if budget else _("attempts")
        if total != record.attempt:
            return format_html(
                '<span title="{}">{}</span> <span class="dtp-note">({} {})</span>',
                _("this run; the total counts every run (redriven)"),
                shown,
                total,
                _("in total"),
            )
        return format_html('<span title="{}">{}</span>', title, shown)

    @admin.display(description=_("enqueued"), ordering="enqueued_at")
    def enqueued(self, record: TaskRecord) -> Any:
        return html.moment(record.enqueued_at)

    @admin.display(description=_("when"), ordering="run_after")
    def timing(self, record: TaskRecord) -> Any:
        return format_html('<span class="dtp-note">{}</span>', self._note(record, timezone.now()))

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished(self, record: TaskRecord) -> Any:
        return html.moment(record.finished_at)

    @admin.display(description=_("dead-letter reason"))
    def reason(self, record: TaskRecord) -> Any:
        return format_html('<span class="dtp-reason">{}</span>', record.dead_letter_reason)

    @admin.display(description=_("last error"))
    def last_error(self, record: TaskRecord) -> Any:
        errors = _errors(record)
        if not errors:
            return html.EMPTY
        last = errors[-1]
        return format_html(
            '<code class="dtp-exc">{}</code><br><span class="dtp-note">{}</span>',
            str(last.get("exception_class_path") or ""),
            display.error_message(last)[:300],
        )

    @staticmethod
    def _note(record: TaskRecord, now: datetime) -> str:
        waiting = waiting_of(record, now)
        if waiting is not None:
            return waiting.describe(now)
        return display.waiting_note(
            record.status,
            attempt=record.attempt,
            run_after=record.run_after,
            enqueued_at=record.enqueued_at,
            last_attempted_at=record.last_attempted_at,
            finished_at=record.finished_at,
            held_since=record.held_since,
            now=now,
        )

    # -- the task's page -----------------------------------------------------------------

    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "task_path",
                    "backend_name",
                    "queue_name",
                    "priority",
                    "status_line",
                    "dead_letter_reason",
                )
            },
        ),
        (_("Call"), {"fields": ("args_json", "kwargs_json", "return_json", "metadata_json")}),
        (
            _("Timeline"),
            {
                "fields": (
                    "enqueued_line",
                    "requested_line",
                    "run_after_line",
                    "started_line",
                    "last_attempted_line",
                    "finished_line",
                )
            },
        ),
        (_("Lease"), {"fields": ("attempts", "lease_line", "cancel_requested")}),
        (_("Keys"), {"fields": ("ordering_line", "dedup_line", "breaker_line")}),
    )
    readonly_fields = (
        "status_line",
        "args_json",
        "kwargs_json",
        "return_json",
        "metadata_json",
        "enqueued_line",
        "requested_line",
        "run_after_line",
        "started_line",
        "last_attempted_line",
        "finished_line",
        "attempts",
        "lease_line",
        "ordering_line",
        "dedup_line",
        "breaker_line",
    )

    @admin.display(description=_("status"))
    def status_line(self, record: TaskRecord) -> Any:
        return format_html(
            '{} <span class="dtp-note">{}</span>',
            self.status_badge(record),
            self._note(record, timezone.now()),
        )

    @admin.display(description=_("args"))
    def args_json(self, record: TaskRecord) -> Any:
        return html.pretty_json(record.args)

    @admin.display(description=_("kwargs"))
    def kwargs_json(self, record: TaskRecord) -> Any:
        return html.pretty_json(record.kwargs)

    @admin.display(description=_("return value"))
    def return_json(self, record: TaskRecord) -> Any:
        if record.status != TaskResultStatus.SUCCESSFUL:
            return html.EMPTY
        return html.pretty_json(record.return_value)

    @admin.display(description=_("metadata"))
    def metadata_json(self, record: TaskRecord) -> Any:
        """The task's metadata as stored (docs/tasks.md#metadata); empty: none."""
        if not record.metadata:
            return html.EMPTY
        return html.pretty_json(record.metadata)

    @admin.display(description=_("enqueued at"))
    def enqueued_line(self, record: TaskRecord) -> Any:
        return html.moment(record.enqueued_at)

    @admin.display(description=_("requested run after"))
    def requested_line(self, record: TaskRecord) -> Any:
        return html.moment(record.requested_run_after)

    @admin.display(description=_("run after"))
    def run_after_line(self, record: TaskRecord) -> Any:
        return html.moment(record.run_after)

    @admin.display(description=_("first started at"))
    def started_line(self, record: TaskRecord) -> Any:
        return html.moment(record.started_at)

    @admin.display(description=_("last attempt started at"))
    def last_attempted_line(self, record: TaskRecord) -> Any:
        return html.moment(record.last_attempted_at)

    @admin.display(description=_("finished at"))
    def finished_line(self, record: TaskRecord) -> Any:
        return html.moment(record.finished_at)

    @admin.display(description=_("lease"))
    def lease_line(self, record: TaskRecord) -> Any:
        if not record.lease_token:
            return html.EMPTY
        return format_html(
            "<code>{}</code>, expires {}",
            record.lease_token,
            html.moment(record.lease_expires_at),
        )

    @admin.display(description=_("ordering key"))
    def ordering_line(self, record: TaskRecord) -> Any:
        if record.ordering_key is None:
            return html.EMPTY
        url = reverse(CHANGELIST) + "?" + urlencode({"ordering_key": record.ordering_key})
        blocked = _(" (dead, blocks its key)") if record.ordering_blocked else ""
        return format_html(
            '<code>{}</code>{} · sequence {} · <a href="{}">all tasks of this key</a>',
            record.ordering_key,
            blocked,
            record.sequence,
            url,
        )

    @admin.display(description=_("dedup key"))
    def dedup_line(self, record: TaskRecord) -> Any:
        if record.dedup_key is None:
            return html.EMPTY
        url = reverse(CHANGELIST) + "?" + urlencode({"dedup_key": record.dedup_key})
        return format_html(
            '<code>{}</code> · <a href="{}">tasks with this key</a>', record.dedup_key, url
        )

    @admin.display(description=_("circuit breaker"))
    def breaker_line(self, record: TaskRecord) -> Any:
        if record.breaker_key is None:
            return html.EMPTY
        name, key = split_scoped_key(record.breaker_key)
        breaker = (
            BreakerRecord.objects.filter(backend_name=record.backend_name, name=name, key=key)
            .only("pk", "state")
            .first()
        )
        shown: Any = format_html("<code>{}</code>", record.breaker_key)
        if breaker is not None:
            url = reverse("admin:django_tasks_plus_breakerrecord_change", args=[breaker.pk])
            shown = format_html('<a href="{}">{}</a> ({})', url, shown, breaker.state)
        if record.held_since is None or record.status != TaskResultStatus.READY:
            return shown
        return format_html(
            "held by breaker {} since {}", shown, html.moment(record.held_since, relative=True)
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        record = self.get_object(request, unquote(object_id))
        context = dict(extra_context or {})
        if record is not None and self.has_view_permission(request, record):
            context.update(self._page_context(request, record))
            url = reverse(f"{self.admin_site.name}:{LIVE_TASK}", args=[record.pk])
            context.update(live.bar_context(url))
        return super().change_view(request, object_id, form_url, context)

    def live_task_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The task page's JSON for ``live.js``: its buttons, fields and attempts as
        they are now, rendered from the templates the page includes."""
        record = self.get_object(request, unquote(object_id))
        if record is None:
            if not self.has_view_permission(request):
                raise PermissionDenied
            return live.problem_response(str(_("this task no longer exists")), 404)
        if not self.has_view_permission(request, record):
            raise PermissionDenied
        context = {
            **self._page_context(request, record),
            "adminform": self._read_only_form(request, record),
            "original": record,
            "subtitle": str(record),
            "opts": self.opts,
        }
        return live.regions_response(request, TASK_REGIONS, context)

    def _read_only_form(self, request: HttpRequest, record: TaskRecord) -> helpers.AdminForm:
        """The task's fieldsets as ``change_view`` builds them for a user who may only
        view (every row here is read-only: no one may change it)."""
        fieldsets = list(self.get_fieldsets(request, record))
        fields = flatten_fieldsets(fieldsets)
        form = self.get_form(request, record, change=True, fields=fields)(instance=record)
        return helpers.AdminForm(form, cast(Any, fieldsets), {}, fields, model_admin=self)

    def _page_context(self, request: HttpRequest, record: TaskRecord) -> dict[str, Any]:
        now = timezone.now()
        from ..stored import worker_id_list

        errors = _errors(record)
        same_key, key_total = same_ordering_key(record)
        blocker = blocker_of(record)
        buttons = [
            {
                "label": label,
                "url": reverse(
                    "admin:django_tasks_plus_taskrecord_act", args=[record.pk, operation.name]
                ),
            }
            for operation, label, applies in (
                (ops.REDRIVE, _("Redrive"), record.status == TaskResultStatus.FAILED),
                (
                    ops.CANCEL,
                    _("Cancel task"),
                    record.status in (TaskResultStatus.READY, TaskResultStatus.RUNNING),
                ),
                (ops.DISCARD, _("Release ordering key"), record.ordering_blocked),
                (
                    ops.RUN_NOW,
                    _("Run now"),
                    record.status == TaskResultStatus.READY and record.run_after > now,
                ),
                (ops.DELETE, _("Delete task"), record.status != TaskResultStatus.RUNNING),
            )
            if applies and operation.allowed(request)
        ]
        held = (
            record.status == TaskResultStatus.READY
            and record.held_since is not None
            and record.run_after > now
        )
        release = None
        if blocker is not None and blocker.ordering_blocked and ops.DISCARD.allowed(request):
            release = reverse(
                "admin:django_tasks_plus_taskrecord_act", args=[blocker.pk, ops.DISCARD.name]
            )
        return {
            "attempt_rows": display.attempt_rows(
                status=record.status,
                attempt=record.attempt,
                errors=errors,
                worker_ids=worker_id_list(record.worker_ids),
                last_attempted_at=record.last_attempted_at,
                finished_at=record.finished_at,
                now=now,
            ),
            "other_errors": display.uncounted_errors(errors),
            "blocker": blocker,
            "blocker_link": html.task_link(blocker.pk) if blocker else None,
            "release_url": release,
            "same_key": same_key,
            "same_key_total": key_total,
            "same_key_url": (
                reverse(CHANGELIST) + "?" + urlencode({"ordering_key": record.ordering_key})
                if record.ordering_key
                else None
            ),
            "task_buttons": buttons,
            "run_now_warning": HELD_WARNING if held and ops.RUN_NOW.allowed(request) else None,
        }

    # -- actions --------------------------------------------------------------------------

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return ops.REDRIVE.allowed(request)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return ops.CANCEL.allowed(request)

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return ops.DISCARD.allowed(request)

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return ops.RUN_NOW.allowed(request)

    def has_remove_permission(self, request: HttpRequest) -> bool:
        """Deleting rows through our action (``delete_taskrecord``); Django's own delete
        pages stay off (``has_delete_permission``)."""
        return ops.DELETE.allowed(request)

    @admin.action(description=_("Redrive selected dead-lettered tasks"), permissions=["redrive"])
    def redrive_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._apply(request, ops.REDRIVE, queryset)

    @admin.action(description=_("Cancel selected tasks"), permissions=["cancel"])
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._apply(request, ops.CANCEL, queryset)

    @admin.action(
        description=_("Release the ordering keys held by selected dead tasks"),
        permissions=["discard"],
    )
    def discard_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._apply(request, ops.DISCARD, queryset)

    @admin.action(
        description=_("Run selected waiting tasks now (retries, scheduled, held)"),
        permissions=["run_now"],
    )
    def run_now_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._apply(request, ops.RUN_NOW, queryset)

    @admin.action(description=_("Delete selected tasks (not running ones)"), permissions=["remove"])
    def delete_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> None:
        self._apply(request, ops.DELETE, queryset)

    def _apply(
        self,
        request: HttpRequest,
        operation: ops.Operation,
        queryset: QuerySet[TaskRecord],
        note: str = "",
    ) -> None:
        outcome = ops.apply(request, operation, ops.in_batches(queryset), note=note)
        problems = outcome.problems or []
        for problem in problems[: ops.PROBLEMS_SHOWN]:
            self.message_user(request, problem, messages.ERROR)
        if len(problems) > ops.PROBLEMS_SHOWN:  # thousands of rows must not mean thousands
            more = len(problems) - ops.PROBLEMS_SHOWN  # of messages in the user's session
            self.message_user(
                request,
                ngettext(
                    "… and %(count)d more task could not be changed for such a reason.",
                    "… and %(count)d more tasks could not be changed for such reasons.",
                    more,
                )
                % {"count": more},
                messages.ERROR,
            )
        if outcome.locked:
            self.message_user(request, outcome.locked_message(), messages.ERROR)
        self.message_user(
            request, operation.summary(outcome.done, outcome.skipped), messages.SUCCESS
        )
        if outcome.held:
            self.message_user(
                request,
                _(
                    "%(count)d of them were held by a circuit breaker: while its circuit "
                    "is open, the breaker holds them again when a worker claims them."
                )
                % {"count": outcome.held},
                messages.WARNING,
            )

    # -- extra pages ----------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            # The overview page (admin/overview.py), linked from the app index.
            path("overview/", wrap(self.overview_view), name=overview.URL_NAME),
            path(
                "overview/live/",
                wrap(_live(self.overview_live_view)),
                name=overview.LIVE_URL_NAME,
            ),
            path("live/", wrap(_live(self.live_list_view)), name=LIVE_LIST),
            path("dead-letters/", wrap(self.dead_letters_view), name=DEAD_LETTERS),
            path(
                "dead-letters/live/",
                wrap(_live(self.live_dead_letters_view)),
                name=LIVE_DEAD_LETTERS,
            ),
            path(
                "dead-letters/<str:operation>-matching/",
                wrap(self.matching_view),
                name=MATCHING,
            ),
            path(
                "matching/<str:operation>/",
                wrap(self.list_matching_view),
                name=LIST_MATCHING,
            ),
            path("<path:object_id>/live/", wrap(_live(self.live_task_view)), name=LIVE_TASK),
            path(
                "<path:object_id>/act/<str:operation>/",
                wrap(require_POST(self.act_view)),
                name="django_tasks_plus_taskrecord_act",
            ),
            *super().get_urls(),
        ]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        return overview.overview_view(self, request)

    def overview_live_view(self, request: HttpRequest) -> HttpResponse:
        return overview.overview_live_view(self, request)

    def live_dead_letters_view(self, request: HttpRequest) -> HttpResponse:
        return self.live_list_view(request, dead_letters=True)

    def dead_letters_view(self, request: HttpRequest) -> HttpResponse:
        """The FAILED tasks, newest first, with reason and last error; the list's own
        filters, search and actions, plus "all matching" redrive and release."""
        request._dtp_dead_letters = True  # type: ignore[attr-defined]
        context = {
            "title": _("Dead letters"),
            "subtitle": None,
            "matching_links": self._matching_links(request, MATCHING, DEAD_MATCHING),
        }
        return self.changelist_view(request, context)

    @staticmethod
    def _matching_links(
        request: HttpRequest, url_name: str, offered: tuple[tuple[ops.Operation, Any], ...]
    ) -> list[dict[str, str]]:
        """The "… all matching" links the user may follow, carrying the list's query."""
        query = request.GET.urlencode()
        return [
            {
                "label": str(label),
                "url": reverse(f"admin:{url_name}", args=[operation.name])
                + (f"?{query}" if query else ""),
            }
            for operation, label in offered
            if operation.allowed(request)
        ]

    def list_matching_view(self, request: HttpRequest, operation: str) -> HttpResponse:
        """Run now, cancel or delete every task the task list's current filter matches:
        GET asks, showing how many; POST (with the CSRF token) does it."""
        return self.matching_view(request, operation, dead_letters=False)

    def matching_view(
        self, request: HttpRequest, operation: str, *, dead_letters: bool = True
    ) -> HttpResponse:
        """Redrive, release or delete every dead task the dead-letter page's current
        filter matches (or, from the task list, run now, cancel or delete every task its
        filter matches): GET asks, showing how many; POST (with the CSRF token) does it."""
        offered = DEAD_MATCHING if dead_letters else TASK_MATCHING
        chosen = ops.BY_NAME.get(operation)
        if chosen is None or chosen not in [op for op, _label in offered]:
            raise Http404(f"No such bulk action: {operation!r}.")
        if not (self.has_view_permission(request) and chosen.allowed(request)):
            raise PermissionDenied
        request._dtp_dead_letters = dead_letters  # type: ignore[attr-defined]
        back = reverse("admin:" + DEAD_LETTERS) if dead_letters else reverse(CHANGELIST)
        problems = self.filter_problems(request)
        if problems:  # GET and POST alike: nothing is acted on
            return self.bad_filter_response(request, problems, back)
        try:
            changelist = self.get_changelist_instance(request)
        except admin.options.IncorrectLookupParameters as exc:
            return self.bad_filter_response(request, [BadFilter(str(exc))], back)
        matching = changelist.get_queryset(request).filter(status__in=chosen.statuses)
        held = 0
        if chosen is ops.DISCARD:
            matching = matching.filter(ordering_blocked=True)
        if chosen is ops.RUN_NOW:
            matching = matching.filter(run_after__gt=timezone.now())
            held = matching.filter(held_since__isnull=False).count()
        described = describe_filter(dict(request.GET.lists()))
        if changelist.query:
            described = f"search {changelist.query!r}, {described}"
        back += f"?{request.GET.urlencode()}" if request.GET else ""
        if request.method == "POST":
            count = matching.count()
            kind = "dead task(s)" if dead_letters else "task(s)"
            note = f": all {count} {kind} matching {described}"
            self._apply(request, chosen, matching, note=note)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Are you sure?"),
            "operation": chosen,
            "count": matching.count(),
            "described": described,
            "filtered": described != NO_FILTER,
            "back_url": back,
            "dead_letters": dead_letters,
            "held": held,
            "media": self.media,
        }
        return TemplateResponse(
            request, "admin/django_tasks_plus/taskrecord/confirm_matching.html", context
        )

    def act_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """One task's button: redrive, cancel or release, then back to its page."""
        chosen = ops.BY_NAME.get(operation)
        if chosen is None:
            raise Http404(f"No such action: {operation!r}.")
        record = self.get_object(request, unquote(object_id))
        if record is None:
            raise Http404(f"No task {object_id!r}.")
        if not (self.has_view_permission(request, record) and chosen.allowed(request)):
            raise PermissionDenied
        self._apply(request, chosen, TaskRecord.objects.filter(pk=record.pk))
        if chosen is ops.DELETE and not TaskRecord.objects.filter(pk=record.pk).exists():
            return HttpResponseRedirect(reverse(CHANGELIST))
        return HttpResponseRedirect(
            reverse("admin:django_tasks_plus_taskrecord_change", args=[record.pk])
        )
