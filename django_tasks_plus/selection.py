"""Selecting task rows by id or by filter, for operator commands acting on many tasks.

``redrivetasks`` and ``canceltasks`` (and anything else that acts on "every task matching
…") describe what they want as a ``TaskFilter``; ``matching()`` turns it into the rows,
walked in primary-key order a chunk at a time, so that a million dead letters never sit
in memory at once and rows changed while the walk goes on are neither skipped nor seen
twice. Everything the database can filter is filtered there (indexed columns first);
only the last error's exception class is checked in Python, because the error list is a
JSON column whose query syntax differs between databases.

The values operators type are read here for every surface alike: task ids, whole or the
short ids the admin shows (``resolve_task_ids``, as git takes a short hash), statuses in
any case, moments and ages (``parse_moment``), and a page's query parameters
(``check_parameters``: the admin's lists refuse what they cannot apply rather than drop
it). Each refusal is a ``BadFilter`` (or a subclass) whose message says what to write.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from .compat import TaskResultStatus
from .db.json_search import JsonContains
from .models import TaskRecord
from .stored import error_list

if TYPE_CHECKING:
    from .search import Term

CHUNK = 500
SHORT_ID = 8  # the admin shows the first 8 characters of a task's id
CANDIDATES = 10  # ids listed for an ambiguous short id
_HEX = re.compile(r"[0-9a-f]+")
_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class BadFilter(ValueError):
    """A filter value that cannot be understood; the message says what to write instead."""


class UnknownParameter(BadFilter):
    """A query parameter a page acting on "all matching" does not know: refused, never
    ignored, since ignoring it would widen the selection."""


class UnknownTaskId(BadFilter):
    """No task of the backend has this id (or an id starting with this short id)."""


class AmbiguousTaskId(BadFilter):
    """A short id that starts more than one task's id; ``candidates`` lists some."""

    def __init__(self, message: str, candidates: Sequence[str]) -> None:
        super().__init__(message)
        self.candidates = tuple(candidates)


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks of one backend to act on; empty fields do not filter."""

    backend: str
    ids: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    task_paths: tuple[str, ...] = ()
    ordering_key: str | None = None
    reason_contains: str | None = None
    error: str | None = None
    finished_before: datetime | None = None
    finished_after: datetime | None = None

    def describe(self, default_statuses: Sequence[str] = ()) -> str:
        """The filter as the command-line options that would select it (statuses only
        when they differ from the command's ``default_statuses``)."""
        parts = [f"--backend {self.backend}"]
        parts += [f"--queue {queue}" for queue in self.queues]
        parts += [f"--task {path}" for path in self.task_paths]
        if tuple(self.statuses) != tuple(default_statuses):
            parts += [f"--status {status}" for status in self.statuses]
        if self.ordering_key is not None:
            parts.append(f"--ordering-key {self.ordering_key}")
        if self.reason_contains is not None:
            parts.append(f"--reason-contains {self.reason_contains!r}")
        if self.error is not None:
            parts.append(f"--error {self.error}")
        if self.finished_before is not None:
            parts.append(f"--finished-before {self.finished_before.isoformat()}")
        if self.finished_after is not None:
            parts.append(f"--finished-after {self.finished_after.isoformat()}")
        return " ".join(parts)


def id_prefix(text: str) -> str:
    """A full task id or a short one (its first ``SHORT_ID`` or more hex digits, as the
    admin shows it; hyphens are ignored) as lowercase hex without hyphens."""
    digits = text.strip().lower().removeprefix("urn:uuid:").strip("{}").replace("-", "")
    if not _HEX.fullmatch(digits) or len(digits) > 32:
        raise BadFilter(f"{text!r} is not a task id (a UUID such as the admin shows).")
    if len(digits) < SHORT_ID:
        raise BadFilter(
            f"{text!r} is too short for a task id: give at least {SHORT_ID} of its "
            "characters (the admin shows that many), or the whole id."
        )
    return digits


def with_id_prefix(rows: QuerySet[TaskRecord], prefix: str) -> QuerySet[TaskRecord]:
    """``rows`` whose id starts with ``prefix`` (from ``id_prefix``): a range of the
    primary key (UUIDs sort as their hex digits on every database), so it walks the index
    rather than casting every id to text."""
    if len(prefix) == 32:
        return rows.filter(pk=uuid.UUID(prefix))
    low = uuid.UUID(prefix.ljust(32, "0"))
    high = uuid.UUID(prefix.ljust(32, "f"))
    return rows.filter(pk__gte=low, pk__lte=high)


def with_search(rows: QuerySet[TaskRecord], terms: Iterable[Term]) -> QuerySet[TaskRecord]:
    """``rows`` matching every search term (``search.parse_search``): an id prefix walks
    the primary key; ``arg:``, ``kwarg:`` and ``meta:`` are JSON containment
    (``db/json_search.py``); ``dedup:`` is the task's dedup key; text is in the task path."""
    columns = {"arg": "args", "kwarg": "kwargs", "meta": "metadata"}
    for term in terms:
        if term.kind == "id":
            rows = with_id_prefix(rows, term.value)
        elif term.kind == "task":
            rows = rows.filter(task_path__icontains=term.value)
        elif term.kind == "dedup":
            rows = rows.filter(dedup_key=term.value)
        else:
            rows = rows.filter(JsonContains(columns[term.kind], term.value, key=term.key))
    return rows


def resolve_task_ids(texts: Sequence[str], backend: str, database: str) -> tuple[str, ...]:
    """The full ids of the tasks of ``backend`` that ``texts`` name, full or short (as git
    takes a short hash): in order, without repeats. An id naming no task raises
    ``UnknownTaskId`` (listing every such one), a short id naming several raises
    ``AmbiguousTaskId`` (listing candidates), anything else ``BadFilter``."""
    prefixes = [id_prefix(text) for text in texts]
    rows = TaskRecord.objects.using(database).filter(backend_name=backend)
    found: list[str] = []
    unknown: list[str] = []
    for text, prefix in zip(texts, prefixes, strict=True):
        matches = [
            str(pk)
            for pk in with_id_prefix(rows, prefix)
            .order_by("pk")
            .values_list("pk", flat=True)[: CANDIDATES + 1]
        ]
        if not matches:
            unknown.append(text.strip())
        elif len(matches) > 1:
            listed = ", ".join(matches[:CANDIDATES])
            more = " and more" if len(matches) > CANDIDATES else ""
            raise AmbiguousTaskId(
                f"Task id {text.strip()!r} is ambiguous in backend {backend!r}: it starts "
                f"{listed}{more}. Give more of the id.",
                matches[:CANDIDATES],
            )
        else:
            found.append(matches[0])
    if unknown:
        raise UnknownTaskId(f"No task with id {', '.join(unknown)} in backend {backend!r}.")
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class Parameter:
    """A query parameter a page understands; ``read`` raises ``BadFilter`` for a value
    the page could not apply."""

    name: str
    read: Callable[[str], object]


def check_parameters(
    params: Iterable[tuple[str, Sequence[str]]],
    known: Iterable[Parameter],
    *,
    ignored: Collection[str] = (),
) -> list[BadFilter]:
    """Every reason the page cannot apply ``params`` (name, values) as given: a name it
    does not know (``UnknownParameter``: ignoring it would widen the selection), a name
    given twice (only one would apply), a value ``read`` refuses. Empty values filter
    nothing (a form's empty inputs) and are let through; ``ignored`` names (paging,
    ordering) do not select rows and are not checked."""
    readers = {parameter.name: parameter.read for parameter in known}
    problems: list[BadFilter] = []
    for name, values in params:
        if name in ignored:
            continue
        if name not in readers:
            problems.append(
                UnknownParameter(f"{name}: not a filter of this page, so it cannot be applied.")
            )
            continue
        given = [value for value in values if value.strip()]
        if len(given) > 1:
            problems.append(BadFilter(f"{name}: given {len(given)} times; give it once."))
            continue
        for value in given:
            try:
                readers[name](value)
            except BadFilter as exc:
                problems.append(BadFilter(f"{name}: {exc}"))
    return problems


def parse_status(text: str, allowed: Sequence[str]) -> str:
    """One of ``allowed`` statuses, named in any case (``ready`` is ``READY``), as the
    plain name."""
    names = [str(status) for status in allowed]
    wanted = text.strip().upper()
    if wanted not in names:
        raise BadFilter(f"--status {text}: use one of {', '.join(names)} (any case).")
    return wanted


# Columns only some statuses ever fill: a filter on them cannot match the others.
_FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
_NEEDS_STATUS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("finished_before", "--finished-before", _FINISHED, "a finish time"),
    ("finished_after", "--finished-after", _FINISHED, "a finish time"),
    ("reason_contains", "--reason-contains", (TaskResultStatus.FAILED,), "a dead-letter reason"),
)


def never_matching(selection: TaskFilter) -> list[str]:
    """Why each filter of ``selection`` can match none of its statuses (a READY task has
    no finish time): such a selection is a mistake, not an empty result."""
    if not selection.statuses:
        return []
    problems = []
    for field, option, having, what in _NEEDS_STATUS:
        if getattr(selection, field) is None:
            continue
        if not set(selection.statuses) & {str(status) for status in having}:
            problems.append(
                f"{option} can never match a {' or '.join(selection.statuses)} task: only "
                f"{' and '.join(map(str, having))} tasks have {what}."
            )
    return problems


def parse_moment(text: str, *, end: bool = False, now: datetime | None = None) -> datetime:
    """An ISO date or date-time (naive: the project's time zone), or an age such as ``2h``,
    ``30min``, ``7d`` meaning that long ago. A bare date is its first moment, or its last
    with ``end`` (for an inclusive "to")."""
    relative = _RELATIVE.match(text)
    if relative:
        amount, unit = float(relative.group(1)), relative.group(2).lower()
        return (now or timezone.now()) - timedelta(seconds=amount * _UNITS[unit])
    try:
        moment = parse_datetime(text.strip())
        if moment is None:
            day = parse_date(text.strip())
            moment = datetime.combine(day, time.max if end else time.min) if day else None
    except ValueError:
        moment = None
    if moment is None:
        raise BadFilter(
            f"{text!r} is not a time: give an ISO date or date-time (2026-05-01, "
            "2026-05-01T12:30, 2026-05-01T12:30+02:00) or an age (90s, 30min, 2h, 7d, 2w)."
        )
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return moment


def _queryset(selection: TaskFilter, database: str) -> QuerySet[TaskRecord]:
    rows = TaskRecord.objects.using(database).filter(backend_name=selection.backend)
    if selection.ids:
        rows = rows.filter(pk__in=selection.ids)
    if selection.statuses:
        rows = rows.filter(status__in=selection.statuses)
    if selection.queues:
        rows = rows.filter(queue_name__in=selection.queues)
    if selection.task_paths:
        rows = rows.filter(task_path__in=selection.task_paths)
    if selection.ordering_key is not None:
        rows = rows.filter(ordering_key=selection.ordering_key)
    if selection.reason_contains is not None:
        rows = rows.filter(dead_letter_reason__icontains=selection.reason_contains)
    if selection.finished_before is not None:
        rows = rows.filter(finished_at__lt=selection.finished_before)
    if selection.finished_after is not None:
        rows = rows.filter(finished_at__gte=selection.finished_after)
    return rows


def error_matches(errors: Any, wanted: str) -> bool:
    """Whether the last recorded error is of class ``wanted`` (a dotted path or a bare
    class name: ``builtins.TimeoutError`` and ``TimeoutError`` both match)."""
    recorded = error_list(errors)
    if not recorded:
        return False
    last = recorded[-1]
    path = str(last.get("exception_class_path", "")) if isinstance(last, Mapping) else ""
    return path == wanted or path.endswith(f".{wanted}")


@dataclass(frozen=True)
class Row:
    """What a command shows of one matching task."""

    id: str
    status: str
    queue_name: str
    task_path: str
    attempt: int
    finished_at: datetime | None
    dead_letter_reason: str


_FIELDS = ("id", "status", "queue_name", "task_path", "attempt", "finished_at")


def matching(selection: TaskFilter, database: str, *, limit: int | None = None) -> Iterator[Row]:
    """The matching rows in primary-key order, read ``CHUNK`` at a time (keyset paging)."""
    rows = _queryset(selection, database).order_by("pk")
    fields = [*_FIELDS, "dead_letter_reason"]
    if selection.error is not None:
        fields.append("errors")
    after: uuid.UUID | None = None
    found = 0
    while limit is None or found < limit:
        page = rows if after is None else rows.filter(pk__gt=after)
        chunk = list(page.values(*fields)[:CHUNK])
        for values in chunk:
            if selection.error is not None and not error_matches(values["errors"], selection.error):
                continue
            yield Row(
                id=str(values["id"]),
                status=values["status"],
                queue_name=values["queue_name"],
                task_path=values["task_path"],
                attempt=values["attempt"],
                finished_at=values["finished_at"],
                dead_letter_reason=values["dead_letter_reason"],
            )
            found += 1
            if limit is not None and found >= limit:
                return
        if len(chunk) < CHUNK:
            return
        after = chunk[-1]["id"]


def count(selection: TaskFilter, database: str) -> int:
    """How many rows match: one ``COUNT`` unless the error class must be checked per row."""
    if selection.error is None:
        return _queryset(selection, database).count()
    return sum(1 for _ in matching(selection, database))
