# The admin across runs: a run's search key (projected from its run-started
# event; runs started before it are found by their idempotency key, which is
# what the projection gives for their events too, so a rebuild agrees), an
# index from a trigger event to its runs, and the cron schedules' permissions.

from django.db import migrations, models
from django.db.models.functions import Left


def backfill_search_keys(apps, schema_editor):
    WorkflowRun = apps.get_model("kumiko_workflows", "WorkflowRun")
    runs = WorkflowRun.objects.using(schema_editor.connection.alias).exclude(idempotency_key="")
    runs.update(search_key=Left("idempotency_key", 200))


class Migration(migrations.Migration):

    dependencies = [
        ('kumiko_workflows', '0010_workflow_versions'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='workflowrun',
            options={'permissions': [('wake_workflowrun', 'Can wake a waiting workflow run now'), ('cancel_workflowrun', 'Can cancel a workflow run'), ('rerun_workflowrun', 'Can rerun a failed workflow run'), ('pause_schedule', 'Can pause and resume a cron schedule'), ('fire_schedule', 'Can fire a cron schedule now')]},
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='search_key',
            field=models.CharField(blank=True, default='', help_text="What the admin's search finds the run by: the workflow's search_key(event), else its idempotency key.", max_length=200),
        ),
        migrations.RunPython(
            backfill_search_keys, migrations.RunPython.noop, hints={"model_name": "workflowrun"}
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(fields=['tenant_id', 'trigger_event_id'], name='kw_run_trigger_event'),
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(condition=models.Q(('search_key', ''), _negated=True), fields=['search_key', 'tenant_id'], name='kw_run_search_key'),
        ),
    ]
