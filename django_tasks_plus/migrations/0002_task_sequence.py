"""The PostgreSQL sequence that numbers tasks in enqueue order (for ordering keys).

SQLite needs none: its writes are serialized, so the insert takes MAX(sequence) + 1.
"""

from django.db import migrations

SEQUENCE = "django_tasks_plus_task_sequence"


def create_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")


def drop_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [("django_tasks_plus", "0001_initial")]

    operations = [migrations.RunPython(create_sequence, drop_sequence, elidable=False)]
