"""``manage.py schedules``: list the stored schedules, pause, resume or run one now.

``schedules`` (or ``schedules list [--json]``) prints the backend's schedules with their
next and last occurrence; ``schedules pause NAME``, ``resume NAME`` and ``run NAME``
(``run-now`` too) call ``schedules.api``, which Python code can call as well.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...models import ScheduleRecord
from ...schedules import ScheduleError, api
from ..base import BackendCommand

ACTIONS = ("list", "pause", "resume", "run", "run-now")


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def schedule_json(row: ScheduleRecord) -> dict[str, Any]:
    """One schedule as ``--json`` prints it (times in ISO 8601, null when unset)."""
    return {
        "name": row.name,
        "task": row.task_path,
        "cron": row.cron or None,
        "every_seconds": row.every_seconds,
        "timezone": row.timezone,
        "source": row.source,
        "enabled": row.enabled,
        "paused": row.paused,
        "next_at": _iso(row.next_at),
        "last_fired_at": _iso(row.last_fired_at),
        "last_task_id": None if row.last_task_id is None else str(row.last_task_id),
    }


def _state(row: ScheduleRecord) -> str:
    return "disabled" if not row.enabled else "paused" if row.paused else "active"


COLUMNS: tuple[tuple[str, Any], ...] = (
    ("NAME", lambda r: r.name),
    ("WHEN", lambda r: r.cron or f"every {r.every_seconds} s"),
    ("TZ", lambda r: r.timezone),
    ("STATE", _state),
    ("SOURCE", lambda r: r.source),
    ("NEXT", lambda r: _iso(r.next_at) or "-"),
    ("LAST FIRED", lambda r: _iso(r.last_fired_at) or "-"),
    ("TASK", lambda r: r.task_path),
)


class Command(BackendCommand):
    needed_by = "manage.py schedules"
    help = "List the schedules of a django-tasks-plus backend, or pause, resume or run one now."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", default="list", choices=ACTIONS)
        parser.add_argument("name", nargs="?", help="The schedule's name.")
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="TASKS alias.")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of text.")

    def handle(self, *args: Any, **options: Any) -> None:
        action, name = options["action"], options["name"]
        if action not in ACTIONS:  # call_command() skips argparse's choices
            raise CommandError(f"Unknown action {action!r}; use one of: {', '.join(ACTIONS)}.")
        backend = self._backend(options["backend"])
        try:
            if action == "list":
                if name is not None:
                    raise CommandError("schedules list takes no NAME.")
                rows = ScheduleRecord.objects.using(backend.settings.database).filter(
                    backend_name=backend.alias
                )
                self._list(list(rows.order_by("name")), as_json=options["json"])
                return
            if not name:
                raise CommandError(f"schedules {action} needs the schedule's NAME.")
            if action == "pause":
                row = api.pause(name, backend=backend.alias)
                text = f"Schedule {name!r} paused."
            elif action == "resume":
                row = api.resume(name, backend=backend.alias)
                text = f"Schedule {name!r} resumed; next occurrence {_iso(row.next_at)}."
            else:
                task_id = api.run_now(name, backend=backend.alias)
                row = api.get(name, backend=backend.alias)
                text = f"Schedule {name!r} enqueued task {task_id}."
        except ScheduleError as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"The database refused: {exc}") from exc
        self.stdout.write(json.dumps(schedule_json(row)) if options["json"] else text)

    def _list(self, rows: list[ScheduleRecord], *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps([schedule_json(row) for row in rows], indent=2))
            return
        if not rows:
            self.stdout.write("No schedule is stored (the leader syncs declared ones).")
            return
        table = [[show(row) for _heading, show in COLUMNS] for row in rows]
        headings = [heading for heading, _show in COLUMNS]
        widths = [
            max(len(cell) for cell in column) for column in zip(headings, *table, strict=True)
        ]
        for cells in (headings, *table):
            line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
            self.stdout.write(line.rstrip())
