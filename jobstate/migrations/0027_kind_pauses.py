"""Paused kinds (``KindPause``): a new table, nothing else changes.

An operator's pause of a kind (``services.pause_kind``) is a row until its resume
sets ``resumed_at``; rows are kept as the audit trail. A partial unique index
holds at most one active pause per kind, and serves the claim's check.
"""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

from jobstate.migrations._lock_limited import LockLimitedMigration


class Migration(LockLimitedMigration):  # waits 5 s at most for a lock

    dependencies = [
        ('jobstate', '0026_job_parent_status_index'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='KindPause',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(db_index=True, max_length=200)),
                ('paused_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('paused_by_label', models.CharField(blank=True, default='', max_length=200)),
                ('reason', models.TextField(blank=True, default='')),
                ('resumed_at', models.DateTimeField(blank=True, null=True)),
                ('resumed_by_label', models.CharField(blank=True, default='', max_length=200)),
                ('resume_reason', models.TextField(blank=True, default='')),
                ('paused_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('resumed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'kind pause',
                'verbose_name_plural': 'kind pauses',
                'ordering': ('-paused_at', '-id'),
                'constraints': [models.UniqueConstraint(condition=models.Q(('resumed_at__isnull', True)), fields=('kind',), name='jobstate_kindpause_one_active')],
            },
        ),
    ]
