"""The shared shape of the commands that act on tasks picked by id or by filter.

``redrivetasks`` and ``canceltasks`` take the same selection options, show the same
``--dry-run`` sample, ask the same confirmation and walk the rows the same way; each
subclass says which statuses it may act on and what acting on one task means.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ..backend import DatabaseBackend
from ..compat import DEFAULT_TASK_BACKEND_ALIAS
from ..db.rowlock import LockPatience
from ..exceptions import TaskRowLocked
from ..operations import BackendNotUsable, database_backend
from ..selection import (
    SHORT_ID,
    BadFilter,
    Row,
    TaskFilter,
    count,
    matching,
    never_matching,
    parse_moment,
    parse_status,
    resolve_task_ids,
)
from .base import discover_tasks

SAMPLE = 10
# The options that narrow a selection (everything but ids and --backend).
FILTER_OPTIONS = (
    "queues",
    "task_paths",
    "statuses",
    "ordering_key",
    "reason_contains",
    "error",
    "finished_before",
    "finished_after",
)


def plural(number: int, word: str) -> str:
    return f"{number} {word}{'' if number == 1 else 's'}"


def skipped_text(skipped: dict[str, str], why: str) -> str:
    """`` Skipped 2 not FAILED: <id> (READY), …`` naming at most ten; empty if none."""
    if not skipped:
        return ""
    listed = ", ".join(
        f"{task_id} ({outcome.removeprefix('skipped: ')})"
        for task_id, outcome in list(skipped.items())[:SAMPLE]
    )
    more = f", … {len(skipped) - SAMPLE} more" if len(skipped) > SAMPLE else ""
    return f" Skipped {len(skipped)} {why}: {listed}{more}."


def locked_text(locked: list[str]) -> str:
    """`` Left 2 unchanged: another database session held their rows locked: …``."""
    if not locked:
        return ""
    listed = ", ".join(locked[:SAMPLE])
    more = f", … {len(locked) - SAMPLE} more" if len(locked) > SAMPLE else ""
    return (
        f" Left {plural(len(locked), 'task')} unchanged: another database session held "
        f"{'its row' if len(locked) == 1 else 'their rows'} locked ({listed}{more}). "
        "Run the command again once that transaction ends."
    )


class SelectingCommand(BaseCommand):
    """Base of the commands acting on tasks selected by id or filter."""

    verb = "act on"  # "redrive", "cancel": how the prompt and errors name the action
    # Statuses the action applies to; --status may narrow them (if there are several).
    statuses: tuple[str, ...] = ()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "ids",
            nargs="*",
            metavar="TASK_ID",
            help=f"Task ids: whole, or the first {SHORT_ID}+ characters the admin shows.",
        )
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="TASKS alias.")
        parser.add_argument(
            "--queue", action="append", dest="queues", metavar="NAME", help="Queue (repeatable)."
        )
        parser.add_argument(
            "--task",
            action="append",
            dest="task_paths",
            metavar="PATH",
            help="Task path, e.g. myapp.tasks.send_email (repeatable).",
        )
        if len(self.statuses) > 1:
            # No argparse ``choices``: it would print the enum's repr and want exact case.
            parser.add_argument(
                "--status",
                action="append",
                dest="statuses",
                metavar="STATUS",
                help=f"Only tasks in this status, any case (repeatable; one of, and by "
                f"default all of: {', '.join(self.statuses)}).",
            )
        parser.add_argument("--ordering-key", metavar="KEY", help="Tasks of this ordering key.")
        parser.add_argument(
            "--reason-contains",
            "--dead-letter-reason-contains",
            dest="reason_contains",
            metavar="TEXT",
            help="Dead-letter reason contains TEXT (case-insensitive).",
        )
        parser.add_argument(
            "--error",
            metavar="CLASS",
            help="Last error is of this exception class (dotted path or bare name).",
        )
        parser.add_argument(
            "--finished-before",
            metavar="WHEN",
            help="Finished before WHEN: ISO date/date-time, or an age such as 2h, 7d.",
        )
        parser.add_argument("--finished-after", metavar="WHEN", help="Finished at or after WHEN.")
        parser.add_argument(
            "--all",
            action="store_true",
            help=f"Every task of the backend the command can {self.verb} (no other filter).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Show how many match and a sample; change nothing.",
        )
        parser.add_argument(
            "--yes",
            action="store_true",
            help="Do not ask for confirmation when a filter matches more than one task.",
        )

    def act(self, backend: DatabaseBackend, row: Row, lock_wait: float) -> str:
        """Act on one task; return the outcome's key in ``summary()``'s counts. A row
        another session holds locked past ``lock_wait`` seconds raises
        ``TaskRowLocked``."""
        raise NotImplementedError

    def summary(self, outcomes: Counter[str], skipped: dict[str, str]) -> str:
        raise NotImplementedError

    def act_on_all(
        self, backend: DatabaseBackend, rows: Iterable[Row]
    ) -> tuple[Counter[str], dict[str, str]]:
        """Act on every matching row: the outcomes' counts, and why each skipped task
        (by id) was skipped; rows left locked go to ``self.locked``. One ``act()`` per
        row, waiting for locked rows within one ``LockPatience`` for the whole command;
        a command acting on rows in batches (``prunetasks``) overrides this."""
        outcomes: Counter[str] = Counter()
        skipped: dict[str, str] = {}
        patience = LockPatience()
        for row in rows:
            try:
                outcome = self.act(backend, row, patience.wait())
            except TaskRowLocked as exc:
                patience.gave_up(exc.waited)
                self.locked.append(row.id)
                continue
            outcomes[outcome] += 1
            if outcome.startswith("skipped"):
                skipped[row.id] = outcome
        return outcomes, skipped

    # -- the shared flow ---------------------------------------------------------------

    def handle(self, *args: Any, **options: Any) -> None:
        backend = self._backend(options["backend"])
        database = backend.settings.database
        selection = self._selection(backend, options)
        total = count(selection, database)
        by_filter = not selection.ids
        if total == 0:
            wanted = " or ".join(self.statuses)
            raise CommandError(f"No {wanted} task matches {selection.describe(self.statuses)}.")
        if options["dry_run"]:
            self._show_sample(selection, database, total)
            return
        if by_filter and total > 1 and not options["yes"]:
            self._confirm(total, selection)
        self.locked: list[str] = []
        outcomes, skipped = self.act_on_all(backend, matching(selection, database))
        done = sum(n for key, n in outcomes.items() if not key.startswith("skipped"))
        message = self.summary(outcomes, skipped) + locked_text(self.locked)
        if done == 0 or self.locked:  # a locked row is work left undone: exit non-zero
            raise CommandError(message)
        self.stdout.write(message)

    def _selection(self, backend: DatabaseBackend, options: dict[str, Any]) -> TaskFilter:
        try:
            named = list(options["ids"] or ())
            before = options["finished_before"]
            after = options["finished_after"]
            filters = [name for name in FILTER_OPTIONS if options.get(name)]
            if named and (filters or options["all"]):
                raise BadFilter("Give task ids or filters (--queue, --task, …, --all), not both.")
            if not named and not filters and not options["all"]:
                raise BadFilter(
                    f"Which tasks? Give task ids, filters (--queue, --task, --ordering-key, "
                    f"--reason-contains, --error, --finished-before/--finished-after), or "
                    f"--all for every task the command can {self.verb}."
                )
            if options["all"] and filters:
                raise BadFilter("--all selects every task; leave the other filters out.")
            # Named ids are looked at whatever their status, so a skip can say why.
            chosen = [parse_status(text, self.statuses) for text in options.get("statuses") or ()]
            statuses = tuple(dict.fromkeys(chosen)) or (() if named else self.statuses)
            ids = resolve_task_ids(named, backend.alias, backend.settings.database)
            selection = TaskFilter(
                backend=backend.alias,
                ids=ids,
                statuses=statuses,
                queues=tuple(options["queues"] or ()),
                task_paths=tuple(options["task_paths"] or ()),
                ordering_key=options["ordering_key"],
                reason_contains=options["reason_contains"],
                error=options["error"],
                finished_before=parse_moment(before) if before else None,
                finished_after=parse_moment(after) if after else None,
            )
            impossible = never_matching(selection)
            if impossible:
                raise BadFilter(" ".join(impossible))
            return selection
        except BadFilter as exc:
            raise CommandError(str(exc)) from None

    def _show_sample(self, selection: TaskFilter, database: str, total: int) -> None:
        self.stdout.write(f"Would {self.verb} {plural(total, 'task')} (dry run: nothing changed).")
        for row in matching(selection, database, limit=SAMPLE):
            finished = (
                row.finished_at.isoformat(sep=" ", timespec="seconds") if row.finished_at else "-"
            )
            reason = " ".join(row.dead_letter_reason.split())[:80]
            self.stdout.write(
                f"  {row.id}  {row.status:<10} {row.queue_name:<10} {row.task_path}  "
                f"attempts={row.attempt} finished={finished}" + (f"  {reason}" if reason else "")
            )
        if total > SAMPLE:
            self.stdout.write(f"  … and {total - SAMPLE} more")

    def _confirm(self, total: int, selection: TaskFilter) -> None:
        matches = selection.describe(self.statuses)
        question = f"{self.verb.capitalize()} {plural(total, 'task')} matching {matches}?"
        if not sys.stdin.isatty():
            raise CommandError(
                f"{question} Pass --yes to confirm (or --dry-run to see them first)."
            )
        answer = input(f"{question} [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise CommandError("Nothing changed.")

    def _backend(self, alias: str) -> DatabaseBackend:
        try:
            backend = database_backend(alias, needed_by="this command")
        except BackendNotUsable as exc:
            raise CommandError(str(exc)) from exc
        discover_tasks(backend)
        return backend
