# Rolling deploys: the definitions each process's code declares, first seen on
# the database's clock (which side of a deploy is newer), and the newer
# definitions a stale worker left runs of (workflow_status --check names it).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('kumiko_workflows', '0013_signals_delivery'),
    ]

    operations = [
        migrations.CreateModel(
            name='DeployedDefinition',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('fingerprint', models.CharField(max_length=64, unique=True)),
                ('workflow_name', models.CharField(max_length=200)),
                ('workflow_version', models.PositiveIntegerField()),
                ('step_fingerprints', models.JSONField(default=dict, help_text='The fingerprint of each step position, and of the header.')),
                ('first_seen_at', models.DateTimeField(help_text="On the database's clock.")),
                ('first_seen_by', models.CharField(help_text='host:pid of that process', max_length=300)),
            ],
            options={
                'verbose_name': 'deployed workflow definition',
            },
        ),
        migrations.AddField(
            model_name='workerheartbeat',
            name='left_code',
            field=models.JSONField(blank=True, default=list, help_text="Definitions newer than this worker's code that it met and leaves to workers that have them (it should be restarted): fingerprint, workflow, version, first seen.", null=True),
        ),
    ]
