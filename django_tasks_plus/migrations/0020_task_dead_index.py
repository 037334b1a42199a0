# The dead letters get an index of their own, and the (status, queue_name) index over every
# row goes: it took an entry for each version of every task (enqueued, claimed, finished),
# three per task that succeeds, while the gauges only needed it for the FAILED count (READY
# and RUNNING tasks are counted through the claim's and the lease's partial indexes). Built
# and dropped concurrently on PostgreSQL, the new one first, so the count is never without
# an index; other databases migrate as AddIndex and RemoveIndex do.

from django.db import migrations, models

from django_tasks_plus.db.migration_operations import (
    AddIndexConcurrently,
    RemoveIndexConcurrently,
)


class Migration(migrations.Migration):
    # CREATE and DROP INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_tasks_plus", "0019_worker_details"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskrecord",
            index=models.Index(
                condition=models.Q(("status", "FAILED")),
                fields=["backend_name", "queue_name"],
                name="dtp_task_dead_idx",
            ),
        ),
        RemoveIndexConcurrently(
            model_name="taskrecord",
            name="dtp_task_status_queue_idx",
        ),
    ]
