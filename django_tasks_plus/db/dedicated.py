"""A psycopg connection of a worker's own, outside Django's connection handling.

Django's connections belong to one thread and may be closed between uses; a LISTEN or an
advisory lock lives exactly as long as its session, so it needs a session nothing else
touches. Built from the Django alias's parameters, in autocommit.
"""

from __future__ import annotations

from typing import Any

from django.db import connections


def dedicated_connection(database: str, *, application_name: str | None = None) -> Any:
    """A new autocommit psycopg connection to the database behind alias ``database``,
    shown in ``pg_stat_activity`` as ``application_name`` when one is given."""
    import psycopg

    params = connections[database].get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding", "pool"):
        params.pop(key, None)
    if application_name is not None:
        params["application_name"] = application_name[:63]  # PostgreSQL's NAMEDATALEN - 1
    return psycopg.connect(**params, autocommit=True)
