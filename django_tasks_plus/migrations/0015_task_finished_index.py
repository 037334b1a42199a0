# The pruner's index (worker/pruner.py, manage.py prunetasks): finished tasks by backend,
# status and finish time. Built concurrently on PostgreSQL, so enqueues, claims and
# outcomes go on while it builds on a big table; other databases migrate as AddIndex does.

from django.db import migrations, models

from django_tasks_plus.db.migration_operations import AddIndexConcurrently


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_tasks_plus", "0014_claim_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskrecord",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["backend_name", "status", "finished_at"],
                name="dtp_task_finished_idx",
            ),
        ),
    ]
