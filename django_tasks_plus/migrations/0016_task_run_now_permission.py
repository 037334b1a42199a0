# The admin's "run now" action has a permission of its own, as redrive and cancel do.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_tasks_plus", "0015_task_finished_index"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="taskrecord",
            options={
                "permissions": [
                    ("redrive_taskrecord", "Can redrive dead-lettered tasks"),
                    ("cancel_taskrecord", "Can cancel tasks"),
                    ("discard_taskrecord", "Can release ordering keys held by dead tasks"),
                    ("run_now_taskrecord", "Can run waiting tasks now"),
                ],
                "verbose_name": "task",
                "verbose_name_plural": "tasks",
            },
        ),
    ]
