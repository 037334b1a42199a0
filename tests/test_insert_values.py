"""The enqueue INSERT's shortcut past Django's field machinery gives Django's values."""

from __future__ import annotations

import pytest
from django.db import connection

from django_tasks_plus.db import base

pytestmark = pytest.mark.django_db

SAMPLES = {bool: [True, False], str: ["", "READY", "é ünï", "x" * 300]}


def test_every_shortcut_column_gets_what_django_would_send():
    shortcuts = base._unchanged_by_prep()
    # The columns an enqueue fills with plain values take the shortcut.
    assert {"task_path", "queue_name", "status", "ordering_blocked"} <= set(shortcuts)
    # Integers (typed on PostgreSQL), dates, UUIDs and JSON differ between databases.
    assert not {"priority", "id", "run_after", "enqueued_at", "args"} & set(shortcuts)
    fields = base._fields()
    for name, python_type in shortcuts.items():
        for value in [None, *SAMPLES[python_type]]:
            expected = fields[name].get_db_prep_save(value, connection)
            got = base.prep(name, value, connection)
            assert got == expected and type(got) is type(expected), (name, value)


def test_other_values_still_take_djangos_path():
    # A lazy string and a str subclass are converted by Django, not passed through.
    from django.utils.functional import lazystr

    assert type(base.prep("queue_name", lazystr("default"), connection)) is str
    assert base.prep("status", 1, connection) == "1"  # an int in a text column
