# Hourly metric rows: the leader's pruner sums per-minute rows older than
# METRICS["RETENTION_DAYS"] into them (db/metrics.py, roll_up_minutes). A new, empty table:
# nothing to build concurrently.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_tasks_plus", "0017_task_waiting_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricHour",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("backend_name", models.CharField(max_length=100, verbose_name="backend")),
                ("hour", models.DateTimeField(verbose_name="hour")),
                ("queue_name", models.CharField(max_length=100, verbose_name="queue")),
                ("task_path", models.CharField(max_length=255, verbose_name="task path")),
                ("name", models.CharField(max_length=200, verbose_name="metric")),
                ("value", models.BigIntegerField(default=0, verbose_name="value")),
            ],
            options={
                "verbose_name": "hourly metric",
                "verbose_name_plural": "hourly metrics",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("backend_name", "hour", "queue_name", "task_path", "name"),
                        name="dtp_metric_unique_hour",
                    )
                ],
            },
        ),
    ]
