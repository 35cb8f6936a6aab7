"""PostgreSQL: a GIN index on domain events' payloads, for the keyed look-back.

Built CONCURRENTLY (so outside a transaction), as the event table may be
large: appends go on while it builds.
"""

from django.db import migrations

GIN_INDEX = "kw_event_payload_gin"


def create_payload_index(apps, schema_editor):
    """PostgreSQL: a GIN index on domain events' payloads, for the keyed look-back."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {GIN_INDEX} ON kumiko_workflows_event "
        "USING gin (payload jsonb_path_ops) "
        "WHERE aggregate_type NOT IN ('workflow-run', 'workflow-schedule')"
    )


def drop_payload_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {GIN_INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_workflows", "0005_due_index_by_id"),
    ]

    operations = [
        migrations.RunPython(create_payload_index, drop_payload_index),
    ]
