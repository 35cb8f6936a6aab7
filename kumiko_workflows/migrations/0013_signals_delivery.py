# The run signals' outbox (at-least-once delivery): operations bookkeeping
# beside the engine's tables, not workflow state.

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('kumiko_workflows', '0012_worker_heartbeat'),
    ]

    operations = [
        migrations.CreateModel(
            name='SignalDelivery',
            fields=[
                ('event_id', models.BigIntegerField(help_text='The run event whose signal it is; receivers get it as delivery_id.', primary_key=True, serialize=False)),
                ('tenant_id', models.CharField(max_length=100)),
                ('owner', models.CharField(help_text='host:pid:token of the process delivering it', max_length=300)),
                ('leased_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), help_text="When its owner took it (the database's clock).")),
            ],
            options={
                'verbose_name': 'signal delivery',
                'verbose_name_plural': 'signal deliveries',
            },
        ),
    ]
