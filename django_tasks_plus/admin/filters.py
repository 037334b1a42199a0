"""Change-list filters that stay cheap on a million rows.

Django's ``AllValuesFieldListFilter`` and ``date_hierarchy`` read ``SELECT DISTINCT``
over the whole table on every page load to offer their choices. The filters here offer
choices that need no query (statuses, the configured backends and queues) or take typed
input (task path, keys, worker, date ranges), so rendering the filter column costs
nothing; the filtered list then uses whatever index the condition allows.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import get_last_value_from_parameters
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from .. import compat
from ..search import parse_search
from ..selection import BadFilter, Parameter, parse_moment
from ..waiting import LABELS, Reason

PAGE_VAR = "p"


def configured_backends() -> dict[str, frozenset[str]]:
    """Our backends by alias, with the queues each serves (empty: any name)."""
    from ..backend import DatabaseBackend

    found = {}
    for alias in compat.task_backends.settings:
        try:
            backend = compat.task_backends[alias]
        except Exception:  # a misconfigured backend: its checks report it
            continue
        if isinstance(backend, DatabaseBackend):
            found[alias] = frozenset(backend.settings.queues)
    return found


class TextInputFilter(admin.ListFilter):
    """A filter typed into a small form: one or more GET parameters, each an exact match
    (``field`` → parameter) unless the subclass filters otherwise."""

    template = "admin/django_tasks_plus/input_filter.html"
    inputs: tuple[tuple[str, str, str], ...] = ()  # (parameter, label, input type)

    def __init__(
        self, request: HttpRequest, params: dict[str, Any], model: Any, model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        self.values: dict[str, str] = {}
        for name, _label, _kind in self.inputs:
            if name in params:
                value = get_last_value_from_parameters(params, name)
                params.pop(name)
                if value not in (None, ""):
                    self.values[name] = str(value).strip()
                    self.used_parameters[name] = str(value).strip()

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [name for name, _label, _kind in self.inputs]

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:
        ours = {name for name, _label, _kind in self.inputs} | {PAGE_VAR, "e"}
        kept = [
            (name, value)
            for name, values in changelist.filter_params.items()
            if name not in ours
            for value in values
        ]
        yield {
            "inputs": [
                {"name": name, "label": label, "type": kind, "value": self.values.get(name, "")}
                for name, label, kind in self.inputs
            ],
            "hidden": kept,
            "selected": bool(self.values),
            "clear_query_string": changelist.get_query_string(remove=[*ours]),
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        for name, value in self.values.items():
            queryset = queryset.filter(**{name: value})
        return queryset


class TaskPathFilter(TextInputFilter):
    title = _("task path")
    inputs = (("task_path", str(_("exact path")), "text"),)


class OrderingKeyFilter(TextInputFilter):
    title = _("ordering key")
    inputs = (("ordering_key", str(_("key")), "text"),)


class DedupKeyFilter(TextInputFilter):
    title = _("dedup key")
    inputs = (("dedup_key", str(_("key")), "text"),)


class BreakerKeyFilter(TextInputFilter):
    title = _("breaker key")
    inputs = (("breaker_key", str(_("name/key")), "text"),)


class WorkerFilter(TextInputFilter):
    """Tasks a worker has run (any attempt): ``worker_ids`` holds the id as a JSON
    string, so a text match on the stored column finds it on every database."""

    title = _("worker")
    inputs = (("worker", str(_("worker id")), "text"),)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        worker = self.values.get("worker")
        if not worker:
            return queryset
        from django.db.models import TextField
        from django.db.models.functions import Cast

        return queryset.annotate(_worker_ids_text=Cast("worker_ids", TextField())).filter(
            _worker_ids_text__contains=f'"{worker}"'
        )


class DateRangeFilter(TextInputFilter):
    """``from`` (inclusive) and ``to`` (inclusive; a bare date means the whole day)."""

    field = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.problems: list[str] = []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        start_name, end_name = (name for name, _label, _kind in self.inputs)
        conditions = Q()
        for name, lookup, end in ((start_name, "gte", False), (end_name, "lte", True)):
            text = self.values.get(name)
            if not text:
                continue
            try:
                moment = parse_moment(text, end=end)
            except BadFilter as exc:  # the pages check first (task_list_parameters)
                raise admin.options.IncorrectLookupParameters(f"{name}: {exc}") from exc
            conditions &= Q(**{f"{self.field}__{lookup}": moment})
        return queryset.filter(conditions)


class EnqueuedFilter(DateRangeFilter):
    title = _("enqueued")
    field = "enqueued_at"
    inputs = (
        ("enqueued_from", str(_("from")), "datetime-local"),
        ("enqueued_to", str(_("to")), "datetime-local"),
    )


class FinishedFilter(DateRangeFilter):
    title = _("finished")
    field = "finished_at"
    inputs = (
        ("finished_from", str(_("from")), "datetime-local"),
        ("finished_to", str(_("to")), "datetime-local"),
    )


class ChoicesFilter(admin.SimpleListFilter):
    """An exact match on one column, its choices known without a query. Its counts per
    choice ("Show counts") are one ``COUNT(*) FILTER (WHERE column = …)`` each, in one
    scan: Django's default for a ``SimpleListFilter`` is an ``id IN (subquery)`` per
    choice, which takes minutes on a million rows."""

    column = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.column: value}) if value else queryset

    def get_facet_counts(self, pk_attname: str, filtered_qs: QuerySet[Any]) -> dict[str, Any]:
        return {
            f"{index}__c": Count(pk_attname, filter=Q(**{self.column: value}))
            for index, (value, _label) in enumerate(self.lookup_choices)
        }


class BackendFilter(ChoicesFilter):
    """The configured backends (no query). Shown only when there is more than one."""

    title = _("backend")
    parameter_name = "backend_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(alias, alias) for alias in sorted(configured_backends())]

    column = "backend_name"

    def has_output(self) -> bool:
        # Django applies only the filters it shows: with one backend configured, a
        # ``?backend_name=`` in the URL must still filter (and show that it does).
        return len(self.lookup_choices) > 1 or self.value() is not None


class QueueFilter(ChoicesFilter):
    """The queues the backends serve (from settings, no query); any other name can be
    given in the URL (``?queue_name=…``)."""

    title = _("queue")
    parameter_name = "queue_name"
    column = "queue_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names: set[str] = set()
        for queues in configured_backends().values():
            names |= queues
        value = request.GET.get(self.parameter_name)
        if value:
            names.add(value)
        return [(name, name) for name in sorted(names)]


class WaitingFilter(admin.SimpleListFilter):
    """READY tasks by what they wait for (``waiting.Reason``), read at the page's time:
    due now, blocked by their ordering key, held by a breaker, retrying, scheduled."""

    title = _("waiting for")
    parameter_name = "waiting"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(reason.value, label) for reason, label in LABELS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        from django.utils import timezone

        from ..db.waiting import reason_condition

        value = self.value()
        if not value:
            return queryset
        try:
            reason = Reason(value)
        except ValueError as exc:  # the pages check first (task_list_parameters)
            raise admin.options.IncorrectLookupParameters(f"waiting: {exc}") from exc
        return queryset.filter(reason_condition(reason, timezone.now()))

    def get_facet_counts(self, pk_attname: str, filtered_qs: QuerySet[Any]) -> dict[str, Any]:
        from django.utils import timezone

        from ..db.waiting import reason_condition

        now = timezone.now()
        return {
            f"{index}__c": Count(pk_attname, filter=reason_condition(Reason(value), now))
            for index, (value, _label) in enumerate(self.lookup_choices)
        }


# -- the query parameters of the task lists ---------------------------------------------------

# Parameters that choose no rows: paging, ordering, facets, Django's error flag, popups.
NOT_FILTERS = frozenset({PAGE_VAR, "o", "_facets", "e", "all", "_popup", "_to_field"})
_STATUSES = tuple(str(status) for status in compat.TaskResultStatus)


def _text(value: str) -> str:
    return value


def _status(value: str) -> str:
    if value not in _STATUSES:
        raise BadFilter(f"{value!r} is not a status: use one of {', '.join(_STATUSES)}.")
    return value


def _reason(value: str) -> str:
    if value not in {reason.value for reason in Reason}:
        known = ", ".join(reason.value for reason in Reason)
        raise BadFilter(f"{value!r} is not a waiting reason: use one of {known}.")
    return value


def _search(value: str) -> object:
    return parse_search(value)


def task_list_parameters(*, dead_letters: bool) -> list[Parameter]:
    """What the task list (or the dead letters and their "all matching" pages) can
    apply: each filter's parameters, read as the filter reads them, and the search."""
    found = (
        [] if dead_letters else [Parameter("status__exact", _status), Parameter("waiting", _reason)]
    )
    found += [Parameter(name, _text) for name in ("queue_name", "backend_name")]
    for spec in (TaskPathFilter, OrderingKeyFilter, DedupKeyFilter, BreakerKeyFilter):
        found += [Parameter(name, _text) for name, _label, _kind in spec.inputs]
    found += [Parameter(name, _text) for name, _label, _kind in WorkerFilter.inputs]
    for dates in (EnqueuedFilter, FinishedFilter):
        (start, *_), (end, *_) = dates.inputs
        found.append(Parameter(start, partial(parse_moment, end=False)))
        found.append(Parameter(end, partial(parse_moment, end=True)))
    found.append(Parameter("q", _search))
    return found
