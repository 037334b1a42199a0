# The unique index that keeps one task of an ordering key running took an entry for every
# running task, keyed or not: one more index entry (and its WAL) at every claim of a task
# without a key, which nothing ever looks up, since a NULL key never conflicts. The new
# one holds keyed tasks only, and enforces the same rule. Built and dropped concurrently
# on PostgreSQL, the new one first, so the rule is never without its index; other
# databases migrate as AddConstraint and RemoveConstraint do.

from django.db import migrations, models

from django_tasks_plus.db.migration_operations import (
    AddConstraintConcurrently,
    RemoveConstraintConcurrently,
)


class Migration(migrations.Migration):
    # CREATE and DROP INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_tasks_plus", "0020_task_dead_index"),
    ]

    operations = [
        AddConstraintConcurrently(
            model_name="taskrecord",
            constraint=models.UniqueConstraint(
                condition=models.Q(("ordering_key__isnull", False), ("status", "RUNNING")),
                fields=("backend_name", "ordering_key"),
                name="dtp_task_one_running_key",
            ),
        ),
        RemoveConstraintConcurrently(
            model_name="taskrecord",
            name="dtp_task_one_running_per_key",
        ),
    ]
