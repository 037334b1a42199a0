"""The PostgreSQL sequence that numbers tasks in enqueue order (for ordering keys).

It is the column's default, so inserts and COPY simply leave the column out. SQLite needs
none: its writes are serialized, so the insert takes MAX(sequence) + 1.
"""

from django.db import migrations

SEQUENCE = "django_tasks_plus_task_sequence"


def create_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("django_tasks_plus", "TaskRecord")._meta.db_table)
        schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")
        schema_editor.execute(
            f"ALTER TABLE {table} ALTER COLUMN sequence SET DEFAULT nextval('{SEQUENCE}')"
        )


def drop_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("django_tasks_plus", "TaskRecord")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} ALTER COLUMN sequence DROP DEFAULT")
        schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [("django_tasks_plus", "0001_initial")]

    operations = [migrations.RunPython(create_sequence, drop_sequence, elidable=False)]
