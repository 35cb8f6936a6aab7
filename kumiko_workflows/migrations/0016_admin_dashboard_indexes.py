"""The admin dashboard's indexes on the run table: runs by when they started, and finished.

Built CONCURRENTLY on PostgreSQL (so outside a transaction), as the run
table may be large: runs go on starting and finishing while they build.
"""

from django.db import migrations, models

INDEXES = (
    models.Index(fields=["started_at", "tenant_id", "workflow_name"], name="kw_run_started"),
    models.Index(
        condition=models.Q(finished_at__isnull=False),
        fields=["finished_at", "tenant_id", "workflow_name", "status", "failure_reason"],
        name="kw_run_finished",
    ),
)


def _concurrently(schema_editor):
    return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}


def create_indexes(apps, schema_editor):
    model = apps.get_model("kumiko_workflows", "WorkflowRun")
    for index in INDEXES:
        schema_editor.add_index(model, index, **_concurrently(schema_editor))


def drop_indexes(apps, schema_editor):
    model = apps.get_model("kumiko_workflows", "WorkflowRun")
    for index in INDEXES:
        schema_editor.remove_index(model, index, **_concurrently(schema_editor))


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_workflows", "0015_task_attempt"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_indexes, drop_indexes)],
            state_operations=[
                migrations.AddIndex(model_name="workflowrun", index=index) for index in INDEXES
            ],
        ),
    ]
