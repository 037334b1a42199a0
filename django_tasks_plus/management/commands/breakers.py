"""``manage.py breakers``: list circuit breakers, force one closed or open.

``breakers`` (or ``breakers list``) prints every stored circuit of the backend;
``breakers close KEY`` and ``breakers open KEY`` set one by hand (``--name`` picks the
breaker, ``default`` unless given). Closing a circuit that is not stored, or opening one
under a breaker name nothing uses (without ``--create``), is refused: a mistyped name
would otherwise leave the real circuit as it was and report success. Built on
``circuits.breaker_states``, ``force_close`` and ``force_open``, which Python code can
call as well.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from ...circuits import BreakerStatus, breaker_states, force_close, force_open
from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...exceptions import CircuitLocked, CircuitNotFound, UnknownBreaker
from ...limits import BREAKER_NAME_MAX_LENGTH, KEY_MAX_LENGTH
from ..base import BackendCommand

ACTIONS = ("list", "close", "open")
# The table's columns: heading, then how a status shows in it.
COLUMNS: tuple[tuple[str, Any], ...] = (
    ("BREAKER", lambda s: s.name),
    ("KEY", lambda s: s.key),
    ("STATE", lambda s: s.state),
    ("FAILURES", lambda s: str(s.failures)),
    ("LAST FAILURE", lambda s: _when(s.last_failure_at)),
    ("OPENED AT", lambda s: _when(s.opened_at)),
    ("PROBE TASK", lambda s: s.probe_task_id or "-"),
    ("NEXT PROBE", lambda s: _when(s.probe_at)),
    ("HELD", lambda s: str(s.held)),
    ("UPDATED", lambda s: _when(s.updated_at)),
)


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat(sep=" ", timespec="seconds")


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def status_json(status: BreakerStatus) -> dict[str, Any]:
    """One circuit as ``--json`` prints it (times in ISO 8601, null when unset)."""
    return {
        "name": status.name,
        "key": status.key,
        "state": status.state,
        "failures": status.failures,
        "last_failure_at": _iso(status.last_failure_at),
        "opened_at": _iso(status.opened_at),
        "probe_task_id": status.probe_task_id,
        "probe_started_at": _iso(status.probe_started_at),
        "probe_at": _iso(status.probe_at),
        "held": status.held,
        "updated_at": _iso(status.updated_at),
        "problem": status.problem,
    }


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a breaker (``Breaker(name=...)`` refuses the same), or None."""
    if not isinstance(name, str) or not name or len(name) > BREAKER_NAME_MAX_LENGTH:
        return f"must be a non-empty name of at most {BREAKER_NAME_MAX_LENGTH} characters"
    if "/" in name or "\x00" in name:
        return "must not contain '/' or NUL"
    return None


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot be a circuit's key (a key function's result), or None."""
    room = KEY_MAX_LENGTH - BREAKER_NAME_MAX_LENGTH - 1
    if not isinstance(key, str) or not key or "\x00" in key:
        return "must be non-empty text without NUL"
    if len(key) > room:
        return f"is {len(key)} characters; at most {room} are stored"
    return None


class Command(BackendCommand):
    needed_by = "manage.py breakers"
    help = (
        "List the circuit breakers of a django-tasks-plus backend, or force one closed "
        "(releasing the tasks it holds) or open."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action",
            nargs="?",
            default="list",
            choices=ACTIONS,
            help="list (the default), close KEY or open KEY.",
        )
        parser.add_argument("key", nargs="?", help="The circuit's key (a host name, say).")
        parser.add_argument(
            "--name",
            default="default",
            help="The breaker's name, Breaker(name=...) (default: 'default').",
        )
        parser.add_argument(
            "--create",
            action="store_true",
            help="open only: open the circuit even though no stored circuit, waiting task "
            "or loaded Breaker uses --name (without it, such a name is refused as a typo).",
        )
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="TASKS alias.")
        parser.add_argument(
            "--json", action="store_true", help="Print JSON (times in ISO 8601) instead of text."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action not in ACTIONS:  # call_command() skips argparse's choices
            raise CommandError(f"Unknown action {action!r}; use one of: {', '.join(ACTIONS)}.")
        backend = self._backend(options["backend"]).alias
        key = options["key"]
        try:
            if action == "list":
                if key is not None:
                    raise CommandError("breakers list takes no KEY.")
                self._list(backend, as_json=options["json"])
                return
            if key is None:
                raise CommandError(f"breakers {action} needs the circuit's KEY.")
            name = options["name"]
            problem = name_problem(name)
            if problem:
                raise CommandError(f"--name {problem}, got {name!r}.")
            problem = key_problem(key)
            if problem:
                raise CommandError(f"KEY {problem}, got {key!r}.")
            if options["create"] and action != "open":
                raise CommandError("--create applies to breakers open only.")
            self._force(
                action, backend, name, key, create=options["create"], as_json=options["json"]
            )
        except (CircuitLocked, CircuitNotFound, UnknownBreaker) as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"The database refused: {exc}") from exc

    def _list(self, backend: str, *, as_json: bool) -> None:
        statuses = breaker_states(backend)
        if as_json:
            self.stdout.write(json.dumps([status_json(status) for status in statuses], indent=2))
            return
        if not statuses:
            self.stdout.write(f"No circuit breaker has stored a circuit in backend {backend!r}.")
            return
        rows = [[show(status) for _heading, show in COLUMNS] for status in statuses]
        headings = [heading for heading, _show in COLUMNS]
        widths = [max(len(cell) for cell in column) for column in zip(headings, *rows, strict=True)]
        for cells in (headings, *rows):
            line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
            self.stdout.write(line.rstrip())
        for status in statuses:
            if status.problem:
                self.stdout.write(
                    f"{status.name}/{status.key}: the stored state is corrupt "
                    f"({status.problem}); workers treat it as closed."
                )

    def _force(
        self, action: str, backend: str, name: str, key: str, *, create: bool, as_json: bool
    ) -> None:
        if action == "close":
            released = force_close(key, name=name, backend=backend)
            text = f"Circuit {name}/{key} closed; {released} held task(s) released."
        else:
            released = 0
            force_open(key, name=name, backend=backend, create=create)
            text = f"Circuit {name}/{key} opened; its tasks are held from their next claim on."
        if as_json:
            state = "closed" if action == "close" else "open"
            report = {"name": name, "key": key, "state": state, "released": released}
            self.stdout.write(json.dumps(report))
        else:
            self.stdout.write(text)
