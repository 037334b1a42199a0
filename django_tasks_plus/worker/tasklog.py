"""The worker's one log line per attempt outcome (``runtasks -v 1`` and up).

An operator reading the log should see what happened and what comes next without opening
the admin: a retry names its error and when it runs again, a dead letter its reason, a
held task who held it. Pure formatting of a written ``Transition``; no I/O.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from ..compat import TaskResultStatus
from ..durations import duration
from ..lifecycle import ClaimedTask, Transition

# A message longer than this is cut: the row (and the admin) keeps the whole text.
MAX_MESSAGE = 300


def _clock(moment: datetime, now: datetime) -> str:
    """The wall time of ``moment`` in the project's time zone; with the date when not today.

    A moment the local time zone cannot show (near ``datetime.max``, east of UTC) is
    shown as stored, in ISO form, rather than fail the line."""
    try:
        local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
        today = timezone.localtime(now).date() if timezone.is_aware(now) else now.date()
    except (OverflowError, ValueError):
        return moment.isoformat()
    return local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")


def _when(moment: datetime | None, now: datetime) -> str:
    if not isinstance(moment, datetime):
        return "later"
    return f"in {duration((moment - now).total_seconds())} at {_clock(moment, now)}"


def _short(text: str) -> str:
    text = " ".join(text.split())  # one line, whatever the message held
    return text if len(text) <= MAX_MESSAGE else f"{text[: MAX_MESSAGE - 1]}…"


def last_error(outcome: Transition) -> str:
    """``Class: message`` of the attempt's error, from the traceback's last line."""
    error = outcome.error or {}
    path = str(error.get("exception_class_path") or "an exception")
    lines = [line for line in str(error.get("traceback") or "").splitlines() if line.strip()]
    if not lines:
        return path
    last = lines[-1].strip()
    name = path.rpartition(".")[2]
    shown = name if path.startswith("builtins.") else path
    if last.startswith((f"{name}:", f"{path}:")):
        return _short(f"{shown}{last[last.index(':') :]}")
    return shown


def describe_outcome(
    claimed: ClaimedTask, outcome: Transition, seconds: float, now: datetime
) -> str:
    """One line: what the attempt of ``claimed`` came to, and what happens next."""
    head = f"Task {claimed.id} {claimed.task_path}"
    took = f"{seconds * 1000:.1f} ms" if seconds < 10 else duration(seconds)
    status = outcome.status
    values = outcome.values
    if status == TaskResultStatus.SUCCESSFUL:
        return f"{head} succeeded in {took} (attempt {claimed.attempt})"
    if status == TaskResultStatus.FAILED:
        reason = _short(str(values.get("dead_letter_reason") or last_error(outcome)))
        return f"{head} dead-lettered after {took} (attempt {claimed.attempt}): {reason}"
    run_after = values.get("run_after")
    if outcome.held_because is not None:
        because = _short(outcome.held_because or "no reason given")
        return f"{head} held, runs again {_when(run_after, now)}: {because}"
    if outcome.error is not None:
        return (
            f"{head} failed in {took} (attempt {claimed.attempt}), retry "
            f"{_when(run_after, now)}: {last_error(outcome)}"
        )
    if status == TaskResultStatus.READY and "run_after" in values:
        return f"{head} deferred {_when(run_after, now)} (no attempt spent)"
    return f"{head} {status} in {took} (attempt {claimed.attempt})"
