"""Index operations that do not stop writes to a big table while they run.

On PostgreSQL they build and drop indexes (and unique constraints with a condition, which
PostgreSQL keeps as unique partial indexes) ``CONCURRENTLY`` (no lock that blocks enqueues,
claims or outcomes, only a wait for transactions already open); other databases add and
remove them as ``AddIndex``/``RemoveIndex`` (and ``AddConstraint``/``RemoveConstraint``)
do. ``CONCURRENTLY`` cannot run inside a transaction, so a migration using them sets
``atomic = False``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import migrations, models

logger = logging.getLogger("django_tasks_plus")


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


def _migrated_model(operation: Any, state: Any, app_label: str, schema_editor: Any) -> Any:
    """The operation's model in ``state``, or None where this database does not migrate it
    (a router's ``allow_migrate``)."""
    model = state.apps.get_model(app_label, operation.model_name)
    if not operation.allow_migrate_model(schema_editor.connection.alias, model):
        return None
    return model


def _add_index(index: Any, model: Any, schema_editor: Any) -> None:
    if _concurrently(schema_editor):
        _drop_invalid_leftover(index.name, schema_editor)
        schema_editor.add_index(model, index, concurrently=True)
    else:
        schema_editor.add_index(model, index)


def _remove_index(index: Any, model: Any, schema_editor: Any) -> None:
    if _concurrently(schema_editor):
        schema_editor.remove_index(model, index, concurrently=True)
    else:
        schema_editor.remove_index(model, index)


def _add_unique_index(constraint: Any, model: Any, schema_editor: Any) -> None:
    if _concurrently(schema_editor):
        _drop_invalid_leftover(constraint.name, schema_editor)
        _create_concurrently(constraint, model, schema_editor)
    else:
        schema_editor.add_constraint(model, constraint)


def _remove_unique_index(constraint: Any, model: Any, schema_editor: Any) -> None:
    if _concurrently(schema_editor):
        _drop_concurrently(constraint.name, schema_editor)
    else:
        schema_editor.remove_constraint(model, constraint)


def _unique_index(constraint: Any) -> Any:
    """A ``UniqueConstraint`` with a condition: what PostgreSQL builds as a unique partial
    index, and so can build and drop concurrently (a plain one is a table constraint)."""
    if not isinstance(constraint, models.UniqueConstraint) or constraint.condition is None:
        raise TypeError(
            f"{constraint!r}: only a UniqueConstraint with a condition is built as an "
            "index, and so concurrently; use AddConstraint for other constraints."
        )
    return constraint


def _create_concurrently(constraint: Any, model: Any, schema_editor: Any) -> None:
    statement = constraint.create_sql(model, schema_editor)
    plain = "CREATE UNIQUE INDEX "
    if not str(statement.template).startswith(plain):
        raise RuntimeError(f"Cannot build {constraint.name!r} concurrently: {statement}")
    statement.template = "CREATE UNIQUE INDEX CONCURRENTLY " + statement.template[len(plain) :]
    schema_editor.execute(statement, params=None)


def _drop_concurrently(name: str, schema_editor: Any) -> None:
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def _drop_invalid_leftover(name: str, schema_editor: Any) -> None:
    """Drop the invalid index ``name`` that an interrupted build left behind, if any.

    A ``CREATE INDEX CONCURRENTLY`` stopped half-way (``migrate`` killed, a lost
    connection, a duplicate found by a unique build) leaves its index in place, marked
    invalid: it answers no query and enforces nothing, yet every write still updates it,
    and running ``migrate`` again would fail on its name. Dropped first, the build starts
    over. A valid index of that name is left alone (the build then fails as usual)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(quote_ident(%s))",
            [name],
        )
        row = cursor.fetchone()
    if row is not None and row[0]:
        logger.warning(
            "Index %r was left invalid by an interrupted build; dropping it to build it again.",
            name,
        )
        _drop_concurrently(name, schema_editor)


class AddIndexConcurrently(migrations.AddIndex):
    """``AddIndex``, built concurrently on PostgreSQL."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, to_state, app_label, schema_editor)) is not None:
            _add_index(self.index, model, schema_editor)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, from_state, app_label, schema_editor)) is not None:
            _remove_index(self.index, model, schema_editor)


class RemoveIndexConcurrently(migrations.RemoveIndex):
    """``RemoveIndex``, dropped concurrently on PostgreSQL."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, from_state, app_label, schema_editor)) is not None:
            _remove_index(self._index(from_state, app_label), model, schema_editor)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, to_state, app_label, schema_editor)) is not None:
            _add_index(self._index(to_state, app_label), model, schema_editor)

    def _index(self, state: Any, app_label: str) -> Any:
        return state.models[app_label, self.model_name_lower].get_index_by_name(self.name)


class AddConstraintConcurrently(migrations.AddConstraint):
    """``AddConstraint`` of a unique constraint with a condition, built concurrently as
    the unique partial index it is on PostgreSQL."""

    def __init__(self, model_name: str, constraint: Any) -> None:
        super().__init__(model_name, _unique_index(constraint))

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, to_state, app_label, schema_editor)) is not None:
            _add_unique_index(self.constraint, model, schema_editor)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, to_state, app_label, schema_editor)) is not None:
            _remove_unique_index(self.constraint, model, schema_editor)


class RemoveConstraintConcurrently(migrations.RemoveConstraint):
    """``RemoveConstraint`` of a unique constraint with a condition, dropped concurrently
    on PostgreSQL."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, to_state, app_label, schema_editor)) is not None:
            _remove_unique_index(self._constraint(from_state, app_label), model, schema_editor)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if (model := _migrated_model(self, to_state, app_label, schema_editor)) is not None:
            _add_unique_index(self._constraint(to_state, app_label), model, schema_editor)

    def _constraint(self, state: Any, app_label: str) -> Any:
        model_state = state.models[app_label, self.model_name_lower]
        return _unique_index(model_state.get_constraint_by_name(self.name))
