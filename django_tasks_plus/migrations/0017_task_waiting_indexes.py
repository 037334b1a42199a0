# The indexes that count what READY tasks wait for (db/waiting.py): held by a breaker, and
# retrying. A new task enters neither, so enqueue does not pay for them. Built concurrently on
# PostgreSQL, so enqueues and claims go on while they build; other databases migrate as
# AddIndex does.

from django.db import migrations, models

from django_tasks_plus.db.migration_operations import AddIndexConcurrently


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_tasks_plus", "0016_task_run_now_permission"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskrecord",
            index=models.Index(
                condition=models.Q(("held_since__isnull", False), ("status", "READY")),
                fields=["backend_name", "queue_name", "run_after"],
                name="dtp_task_held_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="taskrecord",
            index=models.Index(
                condition=models.Q(
                    ("attempt__gt", 0), ("held_since__isnull", True), ("status", "READY")
                ),
                fields=["backend_name", "queue_name", "run_after"],
                name="dtp_task_retry_idx",
            ),
        ),
    ]
