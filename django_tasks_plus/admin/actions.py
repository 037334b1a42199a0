"""The operator's actions on tasks (redrive, cancel, release the ordering key, run now,
delete), applied row by row through the backend, and recorded in the admin log under the
acting user.

The same code serves the change-list actions, the buttons of a task's page and "all
matching the current filter": each row goes through ``operations.redrive`` (or
``cancel`` / ``discard``), so the admin does exactly what app code and the management
commands do, events included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import operations
from ..compat import InvalidTaskBackend, TaskResultDoesNotExist, TaskResultStatus
from ..db.rowlock import LockPatience
from ..exceptions import TaskRowLocked, TasksPlusError
from ..models import TaskRecord
from .base import log_change
from .html import task_link

BATCH = 500
LOCKED_NAMED = 10  # ids a message names of the rows left locked
PROBLEMS_SHOWN = 10  # rows that failed otherwise, one message each; then a count
LOADED = ("id", "backend_name", "task_path", "status", "queue_name", "attempt", "held_since")


def _cancel(task_id: str, *, backend: str, seen: TaskRecord, lock_wait: float) -> bool:
    outcome = operations.cancel(task_id, backend=backend, lock_wait=lock_wait)
    return outcome.outcome != "already_finished"


def _redrive(task_id: str, *, backend: str, seen: TaskRecord, lock_wait: float) -> bool:
    return operations.redrive(task_id, backend=backend, lock_wait=lock_wait)


def _discard(task_id: str, *, backend: str, seen: TaskRecord, lock_wait: float) -> bool:
    return operations.discard(task_id, backend=backend, lock_wait=lock_wait)


def _run_now(task_id: str, *, backend: str, seen: TaskRecord, lock_wait: float) -> bool:
    """Guarded by the attempt count the row had when read: a task a worker claimed (and
    perhaps rescheduled) since is in another wait, and is left to it."""
    return operations.run_now(task_id, backend=backend, attempt=seen.attempt, lock_wait=lock_wait)


def _delete(task_id: str, *, backend: str, seen: TaskRecord, lock_wait: float) -> bool:
    return operations.delete(task_id, backend=backend, lock_wait=lock_wait)


def _left_alone(done: int, skipped: int, one: str, many: str) -> str:
    return " " + ngettext(one, many, skipped) % skipped if skipped else ""


@dataclass(frozen=True)
class Operation:
    """One kind of action: who may do it, to which rows, and how it reads afterwards."""

    name: str
    codename: str  # the permission, in this app
    verb: str  # for the admin log: "Redriven from the admin."
    run: Callable[..., bool]  # (task id, *, backend, seen row, lock_wait) -> whether it changed
    statuses: tuple[str, ...]  # the rows it can change
    done: tuple[str, str]  # ngettext pair
    skipped: tuple[str, str]
    deletes: bool = False  # logged as deletions

    def summary(self, done: int, skipped: int) -> str:
        return ngettext(*self.done, done) % done + _left_alone(done, skipped, *self.skipped)

    def allowed(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{TaskRecord._meta.app_label}.{self.codename}")


REDRIVE = Operation(
    "redrive",
    "redrive_taskrecord",
    "Redriven",
    _redrive,
    (TaskResultStatus.FAILED,),
    ("%d task redriven.", "%d tasks redriven."),
    (
        "%d was not dead-lettered and was left alone.",
        "%d were not dead-lettered and were left alone.",
    ),
)
CANCEL = Operation(
    "cancel",
    "cancel_taskrecord",
    "Cancelled",
    _cancel,
    (TaskResultStatus.READY, TaskResultStatus.RUNNING),
    ("%d task cancelled (or asked to stop).", "%d tasks cancelled (or asked to stop)."),
    ("%d had already finished.", "%d had already finished."),
)
DISCARD = Operation(
    "discard",
    "discard_taskrecord",
    "Discarded",
    _discard,
    (TaskResultStatus.FAILED,),
    ("%d ordering key released.", "%d ordering keys released."),
    ("%d task blocked no key.", "%d tasks blocked no key."),
)
RUN_NOW = Operation(
    "run-now",
    "run_now_taskrecord",
    "Made due now",
    _run_now,
    (TaskResultStatus.READY,),
    ("%d waiting task made due now.", "%d waiting tasks made due now."),
    (
        "%d was not waiting for its time (already due, running or finished) and was left alone.",
        "%d were not waiting for their time (already due, running or finished) and were "
        "left alone.",
    ),
)
DELETE = Operation(
    "delete",
    "delete_taskrecord",
    "Deleted",
    _delete,
    (TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED),
    ("%d task deleted.", "%d tasks deleted."),
    ("%d was running (cancel it first) and was left.", "%d were running and were left."),
    deletes=True,
)
BY_NAME = {operation.name: operation for operation in (REDRIVE, CANCEL, DISCARD, RUN_NOW, DELETE)}


@dataclass
class Outcome:
    done: int = 0
    skipped: int = 0
    problems: list[str] | None = None
    held: int = 0  # tasks made due now that a circuit breaker had held
    locked: list[str] = field(default_factory=list)  # ids another session held locked

    def locked_message(self) -> SafeString:
        """One message for every task left unchanged because its row stayed locked,
        linking the first ``LOCKED_NAMED`` of them."""
        count = len(self.locked)
        named = format_html_join(", ", "{}", ((task_link(i),) for i in self.locked[:LOCKED_NAMED]))
        more = _(", and %(count)d more") % {"count": count - LOCKED_NAMED}
        text = ngettext(
            "%(count)d task was left unchanged: another database session held its row "
            "locked (%(ids)s). Try again once that transaction ends.",
            "%(count)d tasks were left unchanged: another database session held their "
            "rows locked (%(ids)s). Try again once that transaction ends.",
            count,
        )
        ids = format_html("{}{}", named, more if count > LOCKED_NAMED else "")
        return mark_safe(escape(text) % {"count": count, "ids": ids})  # the text escaped


def apply(
    request: HttpRequest, operation: Operation, records: Iterable[TaskRecord], *, note: str = ""
) -> Outcome:
    """Run ``operation`` on each record; log the changed ones under ``request.user``,
    with ``note`` (e.g. the filter that selected them) after the verb. Rows another
    session holds locked are waited for within one ``LockPatience`` for the whole
    action, so the request answers even if a transaction holds thousands of them."""
    outcome = Outcome(problems=[])
    changed: list[TaskRecord] = []
    message = f"{operation.verb} from the admin{note}."
    patience = LockPatience()
    for record in records:
        try:
            did = operation.run(
                str(record.pk), backend=record.backend_name, seen=record, lock_wait=patience.wait()
            )
        except TaskRowLocked as exc:
            patience.gave_up(exc.waited)
            outcome.locked.append(str(record.pk))
            continue
        except (TasksPlusError, InvalidTaskBackend, TaskResultDoesNotExist) as exc:
            assert outcome.problems is not None
            outcome.problems.append(f"{record.pk}: {exc}")
            continue
        if did:
            outcome.done += 1
            outcome.held += operation is RUN_NOW and record.held_since is not None
            changed.append(record)
            if len(changed) >= BATCH:
                log_change(request, changed, message, deleted=operation.deletes)
                changed = []
        else:
            outcome.skipped += 1
    log_change(request, changed, message, deleted=operation.deletes)
    return outcome


def in_batches(queryset: QuerySet[TaskRecord]) -> Iterator[TaskRecord]:
    """Every row of ``queryset``, ``BATCH`` at a time in primary-key order (keyset
    pagination): rows that stop matching once acted on do not shift the next batch."""
    rows = queryset.only(*LOADED).order_by("pk")
    last: Any = None
    while True:
        batch = list((rows if last is None else rows.filter(pk__gt=last))[:BATCH])
        yield from batch
        if len(batch) < BATCH:
            return
        last = batch[-1].pk
