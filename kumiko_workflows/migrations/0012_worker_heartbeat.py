# Each resume worker's heartbeat (workflow_status --check): operations
# bookkeeping beside the engine's tables, not workflow state.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('kumiko_workflows', '0011_run_search_key_and_schedule_actions'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkerHeartbeat',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(help_text='host:pid', max_length=300, unique=True)),
                ('hostname', models.CharField(max_length=255)),
                ('pid', models.PositiveIntegerField()),
                ('tenants', models.JSONField(blank=True, default=list, help_text='The tenants it resumes (--tenant); empty: every one.')),
                ('loop', models.BooleanField(default=False, help_text='A --loop worker (else one pass).')),
                ('started_at', models.DateTimeField()),
                ('seen_at', models.DateTimeField(help_text='When it last began a pass (written every 5 s at most).')),
            ],
            options={
                'verbose_name': 'worker heartbeat',
            },
        ),
    ]
