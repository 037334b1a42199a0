"""What the admin pages show, as plain values: durations, relative times, attempt counts
and per-attempt rows. No HTML and no database here, so the rules are tested on their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from ..durations import duration
from ..liveness import is_stale as is_stale  # the workers page's rule (re-exported)

FINISHED = ("SUCCESSFUL", "FAILED")


def between(start: datetime | None, end: datetime | None) -> str:
    """The duration from ``start`` to ``end``, or an empty string when one is unknown."""
    if start is None or end is None:
        return ""
    return duration((end - start).total_seconds())


def ago(moment: datetime | None, now: datetime) -> str:
    """``"40 s ago"`` or ``"in 40 s"``."""
    if moment is None:
        return ""
    seconds = (now - moment).total_seconds()
    return f"{duration(seconds)} ago" if seconds >= 0 else f"in {duration(seconds)}"


def waiting_note(
    status: str,
    *,
    attempt: int,
    run_after: datetime | None,
    enqueued_at: datetime | None,
    last_attempted_at: datetime | None,
    finished_at: datetime | None,
    held_since: datetime | None,
    now: datetime,
) -> str:
    """One line saying where the task stands in time, as an operator asks it:
    "retry in 40 s", "waiting 3 min", "running for 12 s", "ran 850 ms"."""
    if status == "RUNNING":
        return (
            f"running for {duration((now - last_attempted_at).total_seconds())}"
            if (last_attempted_at)
            else "running"
        )
    if status in FINISHED:
        ran = between(last_attempted_at, finished_at)
        return f"ran {ran}" if ran else ""
    if status != "READY" or run_after is None:
        return ""
    if run_after > now:
        left = duration((run_after - now).total_seconds())
        if held_since is not None:
            return f"held, next try in {left}"
        return f"retry in {left}" if attempt else f"due in {left}"
    since = max(run_after, enqueued_at) if enqueued_at else run_after
    return f"waiting {duration((now - since).total_seconds())}"


def counts_as_attempt(error: Mapping[str, Any]) -> bool:
    """Whether an error entry records a started attempt. Every attempt a worker claimed
    (and the reaper's ``LeaseExpired`` for it) names the worker; a task cancelled before
    it ran, or a corrupt ``errors`` column kept as one entry, names none."""
    return bool(error.get("worker_id"))


def total_attempts(status: str, attempt: int, errors: Sequence[Mapping[str, Any]]) -> int:
    """Attempts over the task's whole life, across redrives (which reset ``attempt``).

    Every finished attempt that failed left one error entry naming its worker, and a
    redrive keeps them all; the attempt running now, or the one that succeeded, left
    none. So: entries that count as attempts, plus one while RUNNING or once SUCCESSFUL.
    Never less than this run's own count (an ``errors`` column edited by hand).
    """
    recorded = sum(1 for error in errors if counts_as_attempt(error))
    current = 1 if status in ("RUNNING", "SUCCESSFUL") and attempt else 0
    return max(attempt, recorded + current)


def error_message(error: Mapping[str, Any]) -> str:
    """The exception's message, read back from the last line(s) of its traceback."""
    text = str(error.get("traceback") or "").rstrip("\n")
    path = str(error.get("exception_class_path") or "")
    if not text or not path:
        return ""
    names = {path, path.rsplit(".", 1)[-1], path.removeprefix("builtins.")}
    lines = text.split("\n")
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        for name in names:
            if line == name:
                return "\n".join(lines[index + 1 :]).strip()
            if line.startswith(f"{name}: "):
                return "\n".join([line[len(name) + 2 :], *lines[index + 1 :]]).strip()
    return ""


def error_time(error: Mapping[str, Any]) -> datetime | None:
    value = error.get("at")
    if not isinstance(value, str):
        return None
    try:
        return parse_datetime(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as the detail page lists it."""

    number: int  # over the task's whole life
    run: int  # 1 for the first run, 2 after the first redrive, …
    attempt: int | None  # the number within its run, as the worker counted it
    worker: str
    started: datetime | None
    ended: datetime | None
    outcome: str  # the exception class path, or "running" / "succeeded"
    message: str
    traceback: str

    @property
    def duration(self) -> str:
        return between(self.started, self.ended)


def attempt_rows(
    *,
    status: str,
    attempt: int,
    errors: Sequence[Mapping[str, Any]],
    worker_ids: Sequence[str],
    last_attempted_at: datetime | None,
    finished_at: datetime | None,
    now: datetime,
) -> list[AttemptRow]:
    """Every attempt, oldest first: one row per recorded error, plus the attempt that is
    running now or that succeeded. A new run starts where the attempt number drops back
    (a redrive). Only the last attempt's start is stored (``last_attempted_at``); an
    error entry may carry its own ``started_at``.
    """
    rows: list[AttemptRow] = []
    run, previous, number = 1, 0, 0
    counted = [error for error in errors if counts_as_attempt(error)]
    for index, error in enumerate(counted):
        raw = error.get("attempt")
        within = raw if isinstance(raw, int) else None
        if within is not None and within <= previous:
            run += 1
        previous = within or previous
        number += 1
        started = error_time({"at": error.get("started_at")})
        ended = error_time(error)
        # The last attempt's start is the row's; unless another attempt has begun since.
        is_last = index == len(counted) - 1 and status not in ("RUNNING", "SUCCESSFUL")
        if started is None and is_last:
            started = last_attempted_at
        rows.append(
            AttemptRow(
                number=number,
                run=run,
                attempt=within,
                worker=str(error.get("worker_id") or ""),
                started=started,
                ended=ended,
                outcome=str(error.get("exception_class_path") or ""),
                message=error_message(error),
                traceback=str(error.get("traceback") or ""),
            )
        )
    if status in ("RUNNING", "SUCCESSFUL") and attempt:
        if attempt <= previous:
            run += 1
        rows.append(
            AttemptRow(
                number=number + 1,
                run=run,
                attempt=attempt,
                worker=worker_ids[-1] if worker_ids else "",
                started=last_attempted_at,
                ended=now if status == "RUNNING" else finished_at,
                outcome="running" if status == "RUNNING" else "succeeded",
                message="",
                traceback="",
            )
        )
    return rows


def uncounted_errors(errors: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Error entries that are not attempts (a cancellation before the task ran, a
    corrupt column kept as it was): shown apart, below the attempts."""
    return [error for error in errors if not counts_as_attempt(error)]


def short_id(value: object) -> str:
    return str(value)[:8]
