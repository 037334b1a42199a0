"""Index operations that do not stop writes to a big table while they run.

On PostgreSQL they build and drop indexes ``CONCURRENTLY`` (no lock that blocks enqueues,
claims or outcomes, only a wait for transactions already open); other databases add and
remove them as ``AddIndex``/``RemoveIndex`` do. ``CONCURRENTLY`` cannot run inside a
transaction, so a migration using them sets ``atomic = False``.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _concurrently(schema_editor: Any) -> bool:
    """Whether to build concurrently (``Dialect.builds_indexes_concurrently``); where it
    does, the database refuses it inside a transaction."""
    from . import dialect_for

    if not dialect_for(schema_editor.connection).builds_indexes_concurrently:
        return False
    if schema_editor.connection.in_atomic_block:
        raise RuntimeError(
            "An index built concurrently needs a non-atomic migration (atomic = False)."
        )
    return True


class AddIndexConcurrently(migrations.AddIndex):
    """``AddIndex``, built concurrently on PostgreSQL."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if _concurrently(schema_editor):
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if _concurrently(schema_editor):
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)


class RemoveIndexConcurrently(migrations.RemoveIndex):
    """``RemoveIndex``, dropped concurrently on PostgreSQL."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if _concurrently(schema_editor):
            schema_editor.remove_index(model, index, concurrently=True)
        else:
            schema_editor.remove_index(model, index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if _concurrently(schema_editor):
            schema_editor.add_index(model, index, concurrently=True)
        else:
            schema_editor.add_index(model, index)
