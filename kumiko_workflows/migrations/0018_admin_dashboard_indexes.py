"""The admin dashboard: its indexes on the run table (runs by when they started and finished,
failed runs by reason), and its cache of past days' counts (RunDay).

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
    models.Index(
        condition=models.Q(status="failed"),
        fields=["failure_reason", "tenant_id"],
        name="kw_run_failure_reason",
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
        ("kumiko_workflows", "0017_limits_slots"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunDay",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("tenant_id", models.CharField(max_length=100)),
                ("zone", models.CharField(max_length=64)),
                ("day", models.DateField()),
                ("workflow_name", models.CharField(max_length=200)),
                ("failure_reason", models.CharField(blank=True, default="", max_length=64)),
                ("started", models.PositiveIntegerField(default=0)),
                ("completed", models.PositiveIntegerField(default=0)),
                ("failed", models.PositiveIntegerField(default=0)),
                ("cancelled", models.PositiveIntegerField(default=0)),
                ("counted_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "run counts of a day",
                "indexes": [models.Index(fields=["zone", "day"], name="kw_run_day_zone_day")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant_id", "zone", "day", "workflow_name", "failure_reason"),
                        name="kw_run_day",
                    )
                ],
            },
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create_indexes, drop_indexes)],
            state_operations=[
                migrations.AddIndex(model_name="workflowrun", index=index) for index in INDEXES
            ],
        ),
    ]
