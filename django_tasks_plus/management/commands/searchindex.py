"""``manage.py searchindex``: show, build or drop the admin search's GIN indexes.

``searchindex`` (or ``searchindex status``) says which of the three indexes exist;
``searchindex create`` builds the missing ones and ``searchindex drop`` removes them, both
``CONCURRENTLY`` (enqueues and claims go on meanwhile). PostgreSQL only: on SQLite
``create`` and ``drop`` say so and exit with an error. Why they are optional:
``db/search_index.py`` and docs/performance.md.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connections

from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...db.search_index import SearchIndexUnsupported, create, drop, present
from ..base import BackendCommand

ACTIONS = ("status", "create", "drop")


class Command(BackendCommand):
    needed_by = "manage.py searchindex"
    help = (
        "Show, create or drop the GIN indexes that make the admin's arg:, kwarg: and meta: "
        "searches index-driven on PostgreSQL (built and dropped concurrently)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", nargs="?", default="status", choices=ACTIONS, help="status (default)."
        )
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="TASKS alias.")

    def handle(self, *args: Any, **options: Any) -> None:
        connection = connections[self._backend(options["backend"]).settings.database]
        action = options["action"]
        try:
            if action == "create":
                built = create(connection)
                self.stdout.write(f"Built {', '.join(built)}." if built else "All present.")
            elif action == "drop":
                dropped = drop(connection)
                self.stdout.write(f"Dropped {', '.join(dropped)}." if dropped else "None present.")
            for name, exists in present(connection).items():
                self.stdout.write(f"{name}: {'present' if exists else 'absent'}")
        except SearchIndexUnsupported as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"searchindex {action} failed: {exc}") from exc
