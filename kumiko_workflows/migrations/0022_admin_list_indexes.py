"""The admin's run list on a large table: its order, and its filters' choices by workflow and version.

``kw_run_updated`` (``updated_at, tenant_id, workflow_name, status,
failure_reason``) gives the run list its order (newest update first) from
an index, the filters by workflow, status and failure reason checked in it;
``kw_run_workflow_version`` (``tenant_id, workflow_name, workflow_version,
status``) replaces ``kw_run_tenant_workflow``, whose every look-up it
serves, gives the filters by workflow and by version their choices by a
loose index scan, and finds a workflow's runs of one status.

Built CONCURRENTLY on PostgreSQL (so outside a transaction), as the run
table may be large: runs go on starting and finishing while they build.
"""

from django.db import migrations, models

ADDED = (
    models.Index(fields=["updated_at", "tenant_id", "workflow_name", "status", "failure_reason"], name="kw_run_updated"),
    models.Index(
        fields=["tenant_id", "workflow_name", "workflow_version", "status"], name="kw_run_workflow_version"
    ),
)
REPLACED = models.Index(fields=["tenant_id", "workflow_name"], name="kw_run_tenant_workflow")


def _concurrently(schema_editor):
    return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}


def forwards(apps, schema_editor):
    model = apps.get_model("kumiko_workflows", "WorkflowRun")
    for index in ADDED:
        schema_editor.add_index(model, index, **_concurrently(schema_editor))
    schema_editor.remove_index(model, REPLACED, **_concurrently(schema_editor))


def backwards(apps, schema_editor):
    model = apps.get_model("kumiko_workflows", "WorkflowRun")
    schema_editor.add_index(model, REPLACED, **_concurrently(schema_editor))
    for index in ADDED:
        schema_editor.remove_index(model, index, **_concurrently(schema_editor))


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_workflows", "0021_citus_tenant_keys"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.RemoveIndex(model_name="workflowrun", name="kw_run_tenant_workflow"),
                *(migrations.AddIndex(model_name="workflowrun", index=index) for index in ADDED),
            ],
        ),
    ]
