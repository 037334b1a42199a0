# What the admin's worker page shows beyond the row's first columns: the package version the
# worker runs, its processed and failed attempt counts and since when it leads. Columns with
# a database default (or nullable): PostgreSQL adds them without rewriting a row; SQLite
# copies the table, which holds one row per running worker.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_tasks_plus', '0018_metric_hours'),
    ]

    operations = [
        migrations.AddField(
            model_name='workerrecord',
            name='leader_since',
            field=models.DateTimeField(blank=True, help_text='When it became the leader of its backend; empty while a follower.', null=True, verbose_name='leader since'),
        ),
        migrations.AddField(
            model_name='workerrecord',
            name='tasks_failed',
            field=models.PositiveBigIntegerField(db_default=0, default=0, help_text='Of those, the attempts that failed (retry scheduled or dead-lettered).', verbose_name='failed'),
        ),
        migrations.AddField(
            model_name='workerrecord',
            name='tasks_processed',
            field=models.PositiveBigIntegerField(db_default=0, default=0, help_text='Attempts this worker finished since it started: succeeded or failed.', verbose_name='processed'),
        ),
        migrations.AddField(
            model_name='workerrecord',
            name='version',
            field=models.CharField(blank=True, db_default='', default='', help_text='The django-tasks-plus version the worker runs; empty if unknown.', max_length=40, verbose_name='version'),
        ),
    ]
